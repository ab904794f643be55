"""A milestone definition as Anima uses it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

FrontMatterValue = str | int | float | bool | None


class FeatureDef(BaseModel):
    """One feature: what the Developer implements in (at least) one round."""

    model_config = ConfigDict(frozen=True)

    id: str  # "F1", "F2", … in document order
    title: str
    body: str  # the feature's own Markdown, as written
    criteria: list[str]  # from an inline `验收：` / `Acceptance:` marker; may be empty


class MilestoneDef(BaseModel):
    """A parsed milestone definition; `source` is the full text, for prompts."""

    model_config = ConfigDict(frozen=True)

    title: str
    goal: str
    features: list[FeatureDef]
    acceptance_criteria: list[str]
    constraints: str
    front_matter: dict[str, FrontMatterValue]
    requires_human_review: bool | None  # None = use config
    #: ids of the milestones that must be completed and merged before this one starts
    depends_on: tuple[str, ...] = ()
    source: str
