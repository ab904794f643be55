"""A reviewer's comments on lines of a milestone's diff, kept in its record until sent.

Comments are left while the milestone waits for the human (paused or awaiting review), so no
run is writing the record meanwhile; one lock serialises them with Resume and Request changes
(which take them, see `actions`), as the window writes from its own worker thread. Their text
is redacted like a note's. Sent comments go to the Developer as `path:line — comment` items
after the human's note.
"""

from __future__ import annotations

import threading
import uuid

from anima.errors import AnimaError
from anima.events import EventBus, MilestoneChanged
from anima.store.models import MilestoneRecord, MilestoneStatus, ReviewComment, now
from anima.store.store import Store
from anima.text.prompts import render
from anima.text.redact import redact

#: Held while a record's comments are read and rewritten (here and in `actions`).
LOCK = threading.RLock()
OPEN_FOR_COMMENTS = (MilestoneStatus.PAUSED, MilestoneStatus.AWAITING_REVIEW)


class CommentError(AnimaError):
    """The comment cannot be saved, changed or found."""


def _load(store: Store, milestone_id: str) -> MilestoneRecord:
    record = store.load_record(milestone_id)
    if record.status not in OPEN_FOR_COMMENTS:
        raise CommentError(f"comments can be left while {milestone_id} is paused or awaiting "
                           f"review; it is {record.status.value}")
    return record


def _save(store: Store, record: MilestoneRecord, bus: EventBus | None) -> MilestoneRecord:
    store.save_record(record)
    if bus is not None:
        bus.publish(MilestoneChanged(record.model_copy(deep=True)))
    return record


def add_comment(store: Store, milestone_id: str, path: str, line: int, text: str,
                bus: EventBus | None = None) -> MilestoneRecord:
    if not text.strip():
        raise CommentError("a comment needs some text")
    with LOCK:
        record = _load(store, milestone_id)
        record.comments.append(ReviewComment(id=uuid.uuid4().hex[:12], path=path, line=line,
                                             text=redact(text.strip()), at=now()))
        return _save(store, record, bus)


def _find(record: MilestoneRecord, comment_id: str) -> ReviewComment:
    comment = next((c for c in record.comments if c.id == comment_id), None)
    if comment is None:
        raise CommentError(f"{record.id} has no unsent comment {comment_id!r}")
    return comment


def edit_comment(store: Store, milestone_id: str, comment_id: str, text: str,
                 bus: EventBus | None = None) -> MilestoneRecord:
    if not text.strip():
        return remove_comment(store, milestone_id, comment_id, bus)
    with LOCK:
        record = _load(store, milestone_id)
        _find(record, comment_id).text = redact(text.strip())
        return _save(store, record, bus)


def remove_comment(store: Store, milestone_id: str, comment_id: str,
                   bus: EventBus | None = None) -> MilestoneRecord:
    with LOCK:
        record = _load(store, milestone_id)
        record.comments.remove(_find(record, comment_id))
        return _save(store, record, bus)


def comment_item(comment: ReviewComment) -> str:
    return f"- {comment.path}:{comment.line} — {comment.text}"


def take_comments(record: MilestoneRecord, note: str) -> str:
    """The note with the record's comments appended as items; the comments are then sent."""
    if not record.comments:
        return note.strip()
    items = render("human_comments", items="\n".join(comment_item(c) for c in record.comments))
    record.comments = []
    return f"{note.strip()}\n\n{items}".strip()
