"""`.anima/config.json`: every key optional, every typo an error that names file and key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from anima.atomic import read_regular
from anima.errors import ConfigError

CONFIG_SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RoleConfig(_Strict):
    """How one agent role's CLI process is started (the tool rules are `claude`'s)."""

    agent: Literal["claude", "codex"] = Field("claude", description="the agent CLI of this role")
    command: str | None = Field(None, description="this role's CLI command; null = "
                                "claude_command (claude), else $ANIMA_<AGENT>_COMMAND or PATH")
    model: str | None = Field(None, description="--model for this role; null = CLI default")
    permission_mode: str = Field("acceptEdits", description="--permission-mode")
    allowed_tools: list[str] = Field(default_factory=list, description="--allowedTools")
    disallowed_tools: list[str] = Field(default_factory=list, description="--disallowedTools")
    extra_args: list[str] = Field(default_factory=list, description="appended to the command")


def _developer_default() -> RoleConfig:
    # bypassPermissions is refused as root; acceptEdits + an allow-list works everywhere.
    return RoleConfig(allowed_tools=["Bash", "Edit", "Write", "Read", "Glob", "Grep"])


def _acceptor_default() -> RoleConfig:
    return RoleConfig(
        permission_mode="default",
        allowed_tools=["Read", "Glob", "Grep", "Bash(git show:*)", "Bash(git diff:*)",
                       "Bash(git log:*)", "Bash(git status:*)"],
        disallowed_tools=["Edit", "Write", "NotebookEdit"],
    )


class ModelPrice(_Strict):
    """USD per million tokens, for a CLI that reports tokens and no dollars (codex)."""

    input: float = Field(ge=0)
    cached_input: float = Field(ge=0)
    output: float = Field(ge=0)


def _default_prices() -> dict[str, ModelPrice]:
    # OpenAI's list prices when this was written; config `agent_prices` changes or adds any.
    gpt5 = ModelPrice(input=1.25, cached_input=0.125, output=10.0)
    mini = ModelPrice(input=0.25, cached_input=0.025, output=2.0)
    return {"gpt-5": gpt5, "gpt-5-codex": gpt5, "gpt-5.1": gpt5, "gpt-5.1-codex": gpt5,
            "gpt-5.1-codex-max": gpt5, "gpt-5-codex-mini": mini, "gpt-5.1-codex-mini": mini}


class SummarizerConfig(_Strict):
    enabled: bool = True
    model: str = "claude-haiku-4-5"
    timeout_seconds: float = Field(20.0, gt=0)
    max_tokens: int = Field(300, gt=0)


class Config(_Strict):
    schema_version: int = CONFIG_SCHEMA_VERSION
    auto_start: bool = True
    max_parallel_milestones: int = Field(
        3, ge=1, description="milestones run at once, each with its own Developer and "
        "Acceptor in its own worktree (1 = one after another); several need the sandbox")
    max_iterations_per_milestone: int = Field(20, ge=1)
    max_consecutive_rejections: int = Field(3, ge=1)
    agent_timeout_seconds: float = Field(600.0, gt=0)
    agent_idle_timeout_seconds: float = Field(300.0, gt=0)
    requires_human_review: bool = False
    merge_on_complete: bool = True
    main_branch: str | None = Field(None, description="null = detect main, then master")
    claude_command: str | None = Field(None, description="null = $ANIMA_CLAUDE_COMMAND or PATH")
    notify_command: str | None = Field(
        None, description="shell command run for each notice, the event as JSON on stdin")
    developer: RoleConfig = Field(default_factory=_developer_default)
    acceptor: RoleConfig = Field(default_factory=_acceptor_default)
    summarizer: SummarizerConfig = Field(default_factory=SummarizerConfig)
    context_budget_tokens: int = Field(16000, ge=1000)
    exact_token_count: bool = Field(True, description="with ANTHROPIC_API_KEY set, count the "
                                    "first prompt with the API once to calibrate the budget")
    recent_rounds_in_full: int = Field(4, ge=1)
    max_budget_usd: float | None = Field(None, gt=0)
    agent_prices: dict[str, ModelPrice] = Field(
        default_factory=_default_prices, description="per model, what a CLI that reports "
        "only tokens (codex) spends; entries given here are added to the defaults")
    allow_push: bool = Field(False, description="let the agents run `git push`; by default the "
                             "tool rules block it and a push that slips through pauses")
    context_rollover_percent: float | None = Field(
        30.0, gt=0, le=100, description="between rounds, an agent whose context passed this "
        "share of its window continues in a fresh session (the CLI compacts by itself near "
        "80%); null = never")
    session_per_feature: bool = Field(False, description="a fresh Developer session for "
                                      "every feature (fix rounds stay in the feature's session)")
    transcript_max_mb: float = Field(50.0, gt=0, description="per milestone; beyond it the "
                                     "oldest part of the transcript is rotated out")
    check_command: str | list[str] | None = Field(
        None, description="the project's checks, run by Anima before each review: a shell "
        "command or an argv list; null = none")
    check_timeout_seconds: float = Field(600.0, gt=0)
    worktree_setup_command: str | list[str] | None = Field(
        None, description="run once in a milestone's new worktree before the first Developer "
        "turn (`npm ci`, `uv sync`), confined like the agents, with check_timeout_seconds")
    sandbox: Literal["auto", "required", "off"] = Field(
        "auto", description="confine each agent, the checks and the setup to the milestone's "
        "worktree with bubblewrap: auto = where it works, required = refuse to start without "
        "it, off = never")
    pass_env: list[str] = Field(
        default_factory=list, description="credential variables of Anima's environment "
        "(names holding KEY, SECRET, TOKEN, PASSWORD, PASSWD, CREDENTIAL or ASKPASS) that "
        "reach the agents, the checks and the setup command all the same; the rest never do")
    max_usage_limit_wait_hours: float = Field(6.0, ge=0, description="wait this long at most "
                                              "for a usage limit to reset; longer pauses")
    usage_limit_margin_seconds: float = Field(60.0, ge=0, description="sent again this long "
                                              "after the reset")
    api_retry_attempts: int = Field(3, ge=0, description="times a prompt is sent again after "
                                    "a transient API error (on top of the CLI's own retries)")
    api_retry_max_wait_seconds: float = Field(300.0, ge=0, description="longest wait between "
                                              "those attempts (it doubles from 15 s)")

    @field_validator("check_command", "worktree_setup_command")
    @classmethod
    def _command_not_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        if value is not None and not (value.strip() if isinstance(value, str) else value):
            raise ValueError("must be a command, an argv list or null, not empty")
        return value

    @field_validator("pass_env")
    @classmethod
    def _variable_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"each entry must be an environment variable's name, not "
                                 f"{name!r}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _role_defaults(cls, data: Any) -> Any:
        """`"developer": {"model": "x"}` changes the model and keeps the role's tool lists;
        `agent_prices` adds to the default table."""
        if isinstance(data, dict) and isinstance(data.get("agent_prices"), dict):
            defaults = {k: v.model_dump() for k, v in _default_prices().items()}
            data = {**data, "agent_prices": {**defaults, **data["agent_prices"]}}
        if isinstance(data, dict):
            for role, default in (("developer", _developer_default),
                                  ("acceptor", _acceptor_default)):
                if isinstance(data.get(role), dict):
                    data = {**data, role: {**default().model_dump(), **data[role]}}
        return data


def describe_validation_error(path: Path, err: ValidationError) -> str:
    """One line per problem: file, dotted key, what was expected and what was found."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{path}: unknown key '{key}' (a typo?)")
        else:
            lines.append(f"{path}: key '{key}': {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def load_config(path: Path) -> Config:
    """Defaults when the file is absent; ConfigError naming the file otherwise."""
    if not path.exists():
        return Config()
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from e
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
        raise ConfigError(f"{path}: not valid JSON ({where}): {e.msg}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object at the top level")
    version = data.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) \
            and version > CONFIG_SCHEMA_VERSION:
        raise ConfigError(f"{path}: schema_version {version} is newer than this Anima reads "
                          f"({CONFIG_SCHEMA_VERSION}); update Anima")
    try:
        # Strict: `"max_iterations_per_milestone": "20"` or `"merge_on_complete": "no"` is a
        # mistake to name, not a value to guess at ("no" would have read as false, `true` as
        # a parallel limit of 1).
        return Config.model_validate(data, strict=True)
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e)) from e
