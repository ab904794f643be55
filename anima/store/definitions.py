"""A milestone definition as Anima uses it, and the rule for its name (the id becomes a branch
and file names)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from anima.errors import MilestoneError

if TYPE_CHECKING:
    pass

MILESTONE_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")

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
    source: str


def _suggest_id(stem: str) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", stem.strip().lower()).strip("-_")
    return slug if MILESTONE_ID_RE.fullmatch(slug) else ""


def is_milestone_name(name: str) -> bool:
    """A milestone definition's file name: `*.md`, not hidden (editor swap/lock files are)."""
    return name.endswith(".md") and len(name) > 3 and not name.startswith(".")


def validate_milestone_id(stem: str, path: Path) -> str:
    """Return `stem` if it is a safe milestone id (it becomes a branch name and file names)."""
    if MILESTONE_ID_RE.fullmatch(stem):
        return stem
    detail = (
        f"bad milestone name {stem!r}: the file name (without .md) must match "
        f"{MILESTONE_ID_RE.pattern} (lower-case letters, digits, '-' and '_', starting with a "
        "letter or digit), because it becomes the branch milestone/<id>"
    )
    suggestion = _suggest_id(stem)
    if suggestion:
        detail += f"; rename it to e.g. '{suggestion}.md'"
    raise MilestoneError(path, detail)
