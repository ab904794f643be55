"""The rule for a milestone's name: its id becomes a branch and file names.

Apart from the definitions' models so that `anima status`, which scripts poll, can list a
project's files without loading pydantic.
"""

from __future__ import annotations

import re
from pathlib import Path

from anima.errors import MilestoneError

MILESTONE_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]*")
#: Longest id: it names files (`.<id>.json.<random>.tmp` while a record is written) and a
#: folder of each agent's home, and a file name has at most 255 bytes.
MAX_ID_LENGTH = 100


def _suggest_id(stem: str) -> str:
    slug = re.sub(r"[^a-z0-9_-]+", "-", stem.strip().lower()).strip("-_")
    return slug if MILESTONE_ID_RE.fullmatch(slug) else ""


def is_milestone_name(name: str) -> bool:
    """A milestone definition's file name: `*.md`, not hidden (editor swap/lock files are)."""
    return name.endswith(".md") and len(name) > 3 and not name.startswith(".")


def validate_milestone_id(stem: str, path: Path) -> str:
    """Return `stem` if it is a safe milestone id (it becomes a branch name and file names)."""
    if MILESTONE_ID_RE.fullmatch(stem):
        if len(stem) <= MAX_ID_LENGTH:
            return stem
        raise MilestoneError(path, f"milestone name of {len(stem)} characters: the file name "
                                   f"(without .md) has at most {MAX_ID_LENGTH}, because it "
                                   "becomes file names and the branch milestone/<id>; rename "
                                   "it to a shorter one")
    detail = (
        f"bad milestone name {stem!r}: the file name (without .md) must match "
        f"{MILESTONE_ID_RE.pattern} (lower-case letters, digits, '-' and '_', starting with a "
        "letter or digit), because it becomes the branch milestone/<id>"
    )
    suggestion = _suggest_id(stem)
    if suggestion:
        detail += f"; rename it to e.g. '{suggestion}.md'"
    raise MilestoneError(path, detail)
