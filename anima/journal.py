"""What Anima writes about a milestone: its log and its agents' transcripts.

`.anima/logs/<id>.log` holds `[HH:MM:SS] …` lines (phase changes, verdicts, commits,
timeouts, pauses); `.anima/transcripts/<id>/events.jsonl` holds every agent event (and only
those: users' scripts read it as the agents' raw events), and `rounds.jsonl` beside it the
verdicts and check runs the panes show between them, so the monitor can replay a milestone
after a restart as it was shown live, the two merged by time.
Secrets never reach either file: agent events are redacted where they enter the engine
(`anima.agents.process`), the checks' output where it is read (`anima.loop.checks`), and log
lines again here.

A transcript is capped (`transcript_max_mb`): when `events.jsonl` reaches half the cap it
becomes `events.1.jsonl` (replacing the older half), so a milestone's transcripts never take
more than the cap, a long run cannot fill the disk, and rotating is one rename.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import logging
import os
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import IO

from anima import events as ev
from anima.events import (
    AgentEvent,
    CheckFinished,
    CheckStarted,
    EngineError,
    Event,
    EventBus,
    LogLine,
    TranscriptEvent,
    VerdictReached,
)
from anima.paths import ROTATED_TRANSCRIPT, TRANSCRIPT, ProjectPaths
from anima.text.redact import redact

#: Anima's own lines among the agents' (small: a few per round, never rotated).
ROUNDS = "rounds.jsonl"

_ANIMA_LINES = (VerdictReached, CheckStarted, CheckFinished)
_TRANSCRIPT_TYPES: dict[str, type[TranscriptEvent]] = {
    cls.__name__: cls for cls in vars(ev).values()
    if isinstance(cls, type) and issubclass(cls, (AgentEvent, *_ANIMA_LINES))
    and cls is not AgentEvent
}


class _Files:
    """One milestone's open log and transcript."""

    def __init__(self, paths: ProjectPaths, milestone_id: str, max_bytes: int | None) -> None:
        self.log_path = paths.log(milestone_id)
        self.folder = paths.transcripts(milestone_id)
        paths.logs.mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.log = _append(self.log_path)
        self.rotate_at = max(1, max_bytes // 2) if max_bytes else None
        self.transcript = _append(self.folder / TRANSCRIPT)
        self.size = self.transcript.tell()
        self.rounds: IO[str] | None = None  # made with the first of Anima's lines
        self.written = 0.0  # the last line's time: each file's lines in order, and both's

    def write_event(self, event: TranscriptEvent) -> None:
        # Strictly later than the line before, so a replay merges the two files in order.
        self.written = max(time.time(), self.written + 1e-6)
        record = {"t": round(self.written, 6), "type": type(event).__name__,
                  **dataclasses.asdict(event)}
        del record["milestone_id"]  # the transcript's folder says it
        line = json.dumps(record, ensure_ascii=False) + "\n"
        if isinstance(event, _ANIMA_LINES):
            self.rounds = _revived(self.rounds, self.folder / ROUNDS) if self.rounds \
                else _append(self.folder / ROUNDS)
            self.rounds.write(line)
            self.rounds.flush()
            return
        self.transcript = _revived(self.transcript, self.folder / TRANSCRIPT)
        self.transcript.write(line)
        self.transcript.flush()
        self.size += len(line.encode("utf-8")) if not line.isascii() else len(line)
        if self.rotate_at is not None and self.size >= self.rotate_at:
            self._rotate()

    def write_log(self, line: str) -> None:
        self.log = _revived(self.log, self.log_path)
        self.log.write(line)
        self.log.flush()

    def _rotate(self) -> None:
        """The current half becomes the older one; the oldest half is dropped."""
        self.transcript.close()
        os.replace(self.folder / TRANSCRIPT, self.folder / ROTATED_TRANSCRIPT)
        self.transcript = _append(self.folder / TRANSCRIPT)
        self.size = self.transcript.tell()

    def close(self) -> None:
        self.log.close()
        self.transcript.close()
        if self.rounds is not None:
            self.rounds.close()


class Journal:
    """Appends each running milestone's log lines and transcript events as they are
    published (several milestones may run at once: events go by their milestone id)."""

    def __init__(self, paths: ProjectPaths, bus: EventBus) -> None:
        self.paths = paths
        self._lock = threading.Lock()
        self._open: dict[str, _Files] = {}
        self._unsubscribe = bus.subscribe(self._on_event)

    def open(self, milestone_id: str, max_bytes: int | None = None) -> None:
        """Agent events of this milestone are kept from now on (its transcripts within
        `max_bytes`, when given)."""
        with self._lock:
            if (old := self._open.pop(milestone_id, None)) is not None:
                old.close()
            self._open[milestone_id] = _Files(self.paths, milestone_id, max_bytes)

    def close(self, milestone_id: str | None = None) -> None:
        """Stop keeping this milestone's events (None: every milestone's)."""
        with self._lock:
            for key in list(self._open) if milestone_id is None else [milestone_id]:
                if (files := self._open.pop(key, None)) is not None:
                    files.close()

    def detach(self) -> None:
        self.close()
        self._unsubscribe()

    def _on_event(self, event: Event) -> None:
        if isinstance(event, LogLine):
            self.write_log(event.milestone_id, event.text)
        elif isinstance(event, _ANIMA_LINES):
            with self._lock:
                if (files := self._open.get(event.milestone_id)) is not None:
                    files.write_event(event)
        elif isinstance(event, AgentEvent):
            with self._lock:
                # An agent outside a milestone (a tool's) belongs to the only one open.
                key = event.milestone_id or (next(iter(self._open)) if len(self._open) == 1
                                             else None)
                if key is not None and (files := self._open.get(key)) is not None:
                    files.write_event(event)

    def write_log(self, milestone_id: str | None, text: str) -> None:
        if milestone_id is None:
            return
        # Every line of a multi-line entry (a command's output) starts with the time too:
        # the log's lines are "[HH:MM:SS] ..." (a `grep` of them shows when).
        stamp = f"[{datetime.now():%H:%M:%S}] "
        line = "".join(f"{stamp}{part}\n" for part in redact(text).splitlines() or [""])
        with self._lock:
            if (files := self._open.get(milestone_id)) is not None:
                files.write_log(line)
                return
            self.paths.logs.mkdir(parents=True, exist_ok=True)
            with self.paths.log(milestone_id).open("a", encoding="utf-8") as fh:
                fh.write(line)


def _revived(fh: IO[str], path: Path) -> IO[str]:
    """An agent's shell may delete the files Anima appends to (`git clean -fdx`, `git stash
    --all`, `rm -rf .anima`); appending on would lose them with everything they held. The
    open file still holds every byte: it is written back under its name, appending goes on
    there."""
    fd = fh.fileno()
    if os.fstat(fd).st_nlink or not fh.readable():
        return fh
    fh.flush()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        offset, size = 0, os.fstat(fd).st_size
        while offset < size and (chunk := os.pread(fd, min(size - offset, 1 << 20), offset)):
            out.write(chunk)
            offset += len(chunk)
    fh.close()
    return _append(path)


def _append(path: Path) -> IO[str]:
    """A file opened for appending and, when it is a plain file, reading, so `_revived` can
    write it back; a pipe or a device in its place (a user tailing the log through a FIFO)
    cannot be read back, nor opened readable."""
    if path.is_file() or not path.exists():
        return path.open("a+", encoding="utf-8")
    return path.open("a", encoding="utf-8")


def transcript_files(folder: Path) -> list[Path]:
    """A milestone's transcript files, oldest first."""
    return [folder / ROTATED_TRANSCRIPT, folder / TRANSCRIPT]


def read_transcript_tail(folder: Path, max_bytes: int) -> list[TranscriptEvent]:
    """The newest events of a milestone's transcripts, from at most `max_bytes` of them,
    stamped with the milestone (the folder's name) as they were published.

    A window replaying a long milestone shows only its last lines anyway; reading 50 MB
    would cost seconds and hundreds of MB for nothing. Anima's lines (`ROUNDS`) go where
    they were published among the agents' events, from the oldest of those kept.
    """
    agents: list[tuple[float, TranscriptEvent]] = []
    budget = max_bytes
    for path in reversed(transcript_files(folder)):
        if budget <= 0 or not path.exists():
            continue
        size = path.stat().st_size
        agents[:0] = _read_lines(path, budget, folder.name)
        budget -= size
    since = agents[0][0] if agents and budget <= 0 else float("-inf")
    anima = [line for line in _read_lines(folder / ROUNDS, max_bytes, folder.name)
             if line[0] >= since]
    return [event for _, event in heapq.merge(agents, anima, key=lambda line: line[0])]


def read_transcript(path: Path, tail_bytes: int | None = None,
                    milestone_id: str | None = None) -> list[TranscriptEvent]:
    """Events of a transcript file (of its last `tail_bytes`, from the first whole line);
    a torn last line (a kill mid-write) is skipped."""
    return [event for _, event in _read_lines(path, tail_bytes, milestone_id)]


def _read_lines(path: Path, tail_bytes: int | None,
                milestone_id: str | None) -> list[tuple[float, TranscriptEvent]]:
    """`read_transcript`, each event with the time it was written."""
    out: list[tuple[float, TranscriptEvent]] = []
    if not path.exists():
        return out
    with path.open("rb") as raw:
        if tail_bytes is not None and raw.seek(0, os.SEEK_END) > tail_bytes:
            raw.seek(-tail_bytes - 1, os.SEEK_END)
            raw.readline()  # the rest of a line cut by the seek (or the newline before)
        else:
            raw.seek(0)
        for binary in raw:
            line = binary.decode("utf-8", errors="replace")
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                continue
            cls = _TRANSCRIPT_TYPES.get(data.pop("type", ""))
            written = data.pop("t", 0.0)
            if cls is None:
                continue
            names = {f.name for f in dataclasses.fields(cls)}
            kwargs = {k: v for k, v in data.items() if k in names}
            kwargs["milestone_id"] = milestone_id
            for k, v in kwargs.items():
                if isinstance(v, list) and k in ("tools", "permission_denials"):
                    kwargs[k] = tuple(v)
            out.append((float(written), cls(**kwargs)))
    return out


events_log = logging.getLogger("anima.events")


def log_event(event: Event) -> None:
    """A bus subscriber: Anima's own lines and errors go to anima.log too."""
    if isinstance(event, LogLine):
        events_log.info("%s%s", f"{event.milestone_id}: " if event.milestone_id else "",
                        event.text)
    elif isinstance(event, EngineError):
        events_log.error("%s", event.message)
