"""Line comments: kept in the record while the milestone waits, sent with the decision."""

from __future__ import annotations

from pathlib import Path

import pytest

from anima import comments
from anima.config import Config
from anima.loop import actions
from anima.paths import ProjectPaths
from anima.store.models import MilestoneStatus
from anima.store.store import Store
from tests.helpers import milestone_md


@pytest.fixture
def store(tmp_path: Path) -> Store:
    paths = ProjectPaths(tmp_path)
    paths.milestones.mkdir(parents=True)
    paths.milestone_md("m1").write_text(milestone_md("M1", ["A"]))
    store = Store(paths)
    store.scan(max_iterations=20, requires_human_review=False)
    return store


def set_status(store: Store, status: MilestoneStatus) -> None:
    rec = store.load_record("m1")
    rec.status = status
    store.save_record(rec)


def test_comments_only_while_the_milestone_waits_for_the_human(store: Store) -> None:
    with pytest.raises(comments.CommentError, match="paused or awaiting review; it is pending"):
        comments.add_comment(store, "m1", "a.py", 3, "why?")
    set_status(store, MilestoneStatus.PAUSED)
    with pytest.raises(comments.CommentError, match="needs some text"):
        comments.add_comment(store, "m1", "a.py", 3, "   ")
    rec = comments.add_comment(store, "m1", "a.py", 3, "why?")
    (first,) = rec.comments
    comments.edit_comment(store, "m1", first.id, "why not a dict?")
    assert [c.text for c in store.load_record("m1").comments] == ["why not a dict?"]
    comments.edit_comment(store, "m1", first.id, "")  # emptied: removed
    assert store.load_record("m1").comments == []
    with pytest.raises(comments.CommentError, match="no unsent comment"):
        comments.remove_comment(store, "m1", first.id)


def test_request_changes_with_comments_and_no_note(store: Store) -> None:
    set_status(store, MilestoneStatus.AWAITING_REVIEW)
    with pytest.raises(actions.ActionError, match="a note or a comment"):
        actions.request_changes(store, "m1", "")
    comments.add_comment(store, "m1", "src/a.py", 12, "handle None")
    comments.add_comment(store, "m1", "README.md", 1, "mention the flag")
    rec = actions.request_changes(store, "m1", "")
    assert rec.status is MilestoneStatus.IN_PROGRESS and rec.comments == []
    (note,) = rec.human_notes
    assert "- src/a.py:12 — handle None\n- README.md:1 — mention the flag" in note.text
    assert store.load_record("m1").comments == []


def test_resume_sends_note_then_comments(store: Store) -> None:
    set_status(store, MilestoneStatus.PAUSED)
    comments.add_comment(store, "m1", "a.py", 2, "off by one")
    rec = actions.resume(store, Config(), "m1", "look at the loop")
    (note,) = rec.human_notes
    assert note.text.startswith("look at the loop\n\n")
    assert note.text.endswith("- a.py:2 — off by one")
