"""The reviewer's "viewed" marks, kept across restarts of the window.

They are the reviewer's, not the project's: they live in the window's `QSettings`, never in
the project's `.anima/` (the engine's and the agents'). One JSON value holds them all,
`{project root: {milestone id: {"at": when last marked, "files": {path: fingerprint}}}}`; a
mark is for one version of a file's change (`ui.changes_view.fingerprint`), so a file changed
since reads as not viewed whatever is stored. Only the `KEEP` milestones marked last are kept,
so the settings do not grow with every milestone ever reviewed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings

KEY = "review/viewed"
#: Milestones whose marks are kept, across all projects: the ones marked last.
KEEP = 50

Stored = dict[str, dict[str, dict[str, Any]]]


class ViewedMarks:
    """Load and save the marks of one milestone of one project."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def load(self, root: Path, milestone_id: str) -> dict[str, str]:
        entry = self._read().get(str(root), {}).get(milestone_id)
        return dict(entry["files"]) if entry is not None else {}

    def save(self, root: Path, milestone_id: str, files: dict[str, str]) -> None:
        """Store the milestone's marks (none: forget it), then drop the oldest milestones."""
        stored = self._read()
        project = stored.setdefault(str(root), {})
        if files:
            project[milestone_id] = {"at": time.time(), "files": dict(files)}
        else:
            project.pop(milestone_id, None)
        newest = sorted(((entry["at"], root_, mid) for root_, milestones in stored.items()
                         for mid, entry in milestones.items()), reverse=True)
        for _, root_, mid in newest[KEEP:]:
            del stored[root_][mid]
        self.settings.setValue(KEY, json.dumps({r: m for r, m in stored.items() if m}))
        self.settings.sync()

    def _read(self) -> Stored:
        """What is stored, less anything not of our making (a value edited by hand)."""
        try:
            stored = json.loads(str(self.settings.value(KEY, "{}")))
        except ValueError:
            return {}
        if not isinstance(stored, dict):
            return {}
        return {str(root): {str(mid): {"at": _number(entry.get("at")),
                                       "files": {str(k): str(v)
                                                 for k, v in entry["files"].items()}}
                            for mid, entry in milestones.items()
                            if isinstance(entry, dict) and isinstance(entry.get("files"), dict)}
                for root, milestones in stored.items() if isinstance(milestones, dict)}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else 0.0
