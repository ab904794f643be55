"""The milestone queue: which definitions are registered, which milestone goes next, and what
the subscribers are told about the records.

A scan (every second in watch mode) reads the records and publishes only what changed since the
last publication, so an idle project publishes nothing; a file the watcher saw settle is
registered at once, in the order files arrived.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from anima.config import Config
from anima.engine.merged import merged_by_you
from anima.errors import MilestoneError, RecordError
from anima.events import (
    Event,
    EventBus,
    MilestoneChanged,
    MilestoneRedefined,
    MilestoneRemoved,
    MilestonesScanned,
    ProblemReported,
    ProblemResolved,
)
from anima.store.dependencies import held_by_pause
from anima.store.models import MilestoneRecord, MilestoneStatus
from anima.store.store import Scan, Store


class MilestoneQueue:
    """The engine's view of `.anima/milestones/`. `scan` runs on the worker; `register` on
    the worker or the watcher's thread."""

    def __init__(self, store: Store, bus: EventBus, config: Callable[[], Config],
                 log: Callable[[str | None, str], None]) -> None:
        self.store, self.bus, self._config, self._log = store, bus, config, log
        #: Milestones a human asked to start (auto_start off), and `anima run`'s "start all".
        self.requested: set[str] = set()
        self.start_all = False
        #: Milestones whose start failed in this run: not retried every second.
        self.broken: set[str] = set()
        # Watch mode registers only files the watcher saw settle (or present at its start):
        # a periodic scan must never parse a milestone that is still being written.
        self.watching = False
        self._settled: set[str] = set()
        # Registering writes a new record and publishes it: the watcher's thread (a file
        # arrived) and the worker's scan must not both do it for the same file, nor may a scan
        # read before a registration publish after it (it would remove the new record).
        self._registering = threading.Lock()
        self._reported_problems: set[str] = set()
        self._orphans_reported: set[str] = set()
        # What the subscribers were last told (records by id, problems).
        self._shown: dict[str, MilestoneRecord] | None = None
        self._shown_problems: set[str] = set()
        self._shown_redefined: dict[str, tuple[str, ...]] = {}
        bus.subscribe(self._note_published)

    def watch(self, folder: Path) -> None:
        """The watcher reports only what arrives after its start; these the scan takes."""
        self._settled = {p.name for p in folder.glob("*.md")}
        self.watching = True

    def scan(self) -> Scan:
        """Register, read and publish; log each problem once (again if it comes back after
        being fixed) and each new registration."""
        scan = self.refresh()
        current = {str(p): p for p in scan.problems}
        listed = {r.id for r in scan.records}
        for text in sorted(current.keys() - self._reported_problems):
            # One about a listed milestone (its `depends_on`, its `.md` edited since it was
            # registered) is in that milestone's log too, where one looks for why it waits.
            stem = getattr(current[text], "path", Path()).stem
            self._log(stem if stem in listed else None, f"skipped: {text}")
        self._reported_problems = set(current)
        for milestone_id in scan.registered:
            self._log(milestone_id, f"registered milestone {milestone_id} (pending)")
        return scan

    def refresh(self, *, republish: bool = False) -> Scan:
        """Register new files, read every record and publish what changed (with `republish`,
        the whole list, as to a new window), as one step against registrations on the
        watcher's thread."""
        with self._registering:
            if republish:
                self._shown = None
            scan = self.read(register=True)
            self._publish(scan)
        return scan

    def read(self, *, register: bool) -> Scan:
        """Every usable record; with `register`, new `.md` files become pending once the
        watcher has seen them settle (or they were there before it started)."""
        config = self._config()
        return self.store.scan(
            max_iterations=config.max_iterations_per_milestone,
            requires_human_review=config.requires_human_review, register=register,
            ready=(lambda md: md.name in self._settled) if self.watching else None,
            in_main=merged_by_you(self.store.paths.root))

    def startable(self, scan: Scan, running: set[str], limit: int) -> list[MilestoneRecord]:
        """What to start now so that at most `limit` run, besides the `running` ones: interrupted
        ones first, then pending ones, earliest first, whose dependencies are completed and
        merged. Run one at a time, nothing starts while one waits for a human after a
        pause (`held_by_pause`); with several, `depends_on` says what builds on what.
        Never one without its definition: the human's `.md` is what a milestone is, and a
        record alone may be anyone's."""
        self._report_orphans(scan)
        deps = scan.dependencies
        records = [r for r in scan.records if r.id not in self.broken | scan.orphans | running
                   and r.id not in deps.broken and r.id not in scan.unreadable]
        slots = limit - len(running)
        if slots <= 0:
            return []
        active = [r for r in records if r.status is MilestoneStatus.IN_PROGRESS]
        if limit == 1 and (running or held_by_pause(records, limit)):
            return active[:1] if not running else []
        pending = [r for r in records if r.status is MilestoneStatus.PENDING
                   and r.id not in deps.waiting]
        if not (self._config().auto_start or self.start_all):
            pending = [r for r in pending if r.id in self.requested]
        return (active + pending)[:slots]

    def _report_orphans(self, scan: Scan) -> None:
        startable = {r.id for r in scan.records if r.id in scan.orphans
                     and r.status in (MilestoneStatus.PENDING, MilestoneStatus.IN_PROGRESS)}
        for milestone_id in sorted(startable - self._orphans_reported):
            self._log(milestone_id, f"{self.store.paths.milestone_md(milestone_id)} is missing: "
                                    f"{milestone_id} is not started or continued without its "
                                    "definition (put the file back to go on)")
        self._orphans_reported = startable

    def register(self, md: Path, appeared: datetime) -> None:
        """Register a milestone file as pending at once, created when it appeared, even while
        another milestone runs: the queue is the order files arrived in. A file that cannot
        be registered is left to the worker's next scan, which reports it."""
        config = self._config()
        with self._registering:
            self._settled.add(md.name)
            try:
                record = self.store.register(
                    md, appeared, max_iterations=config.max_iterations_per_milestone,
                    requires_human_review=config.requires_human_review)
            except (MilestoneError, RecordError):
                record = None
            if record is not None:  # the window shows it at once
                self.bus.publish(MilestoneChanged(record.model_copy(deep=True)))
        if record is not None:
            self._log(record.id, f"registered milestone {record.id} (pending)")

    def _publish(self, scan: Scan) -> None:
        """The whole list once per start, then only what changed since it was published."""
        problems = {str(p) for p in scan.problems}
        if self._shown is None:
            self._shown = {r.id: r.model_copy(deep=True) for r in scan.records}
            self._shown_problems = problems
            self.bus.publish(MilestonesScanned(tuple(self._shown.values()),
                                               tuple(str(p) for p in scan.problems)))
            self._shown_redefined = {}
            self._publish_redefined(scan)
            return
        for record in scan.records:
            if self._shown.get(record.id) != record:
                self.bus.publish(MilestoneChanged(record.model_copy(deep=True)))
        for milestone_id in self._shown.keys() - {r.id for r in scan.records}:
            del self._shown[milestone_id]
            self.bus.publish(MilestoneRemoved(milestone_id))
        for text in sorted(problems - self._shown_problems):
            self.bus.publish(ProblemReported(text))
        for text in sorted(self._shown_problems - problems):
            self.bus.publish(ProblemResolved(text))
        self._shown_problems = problems
        self._publish_redefined(scan)

    def _publish_redefined(self, scan: Scan) -> None:
        """What changed in which milestone waiting for your review (`Scan.redefined`)."""
        for milestone_id in sorted(self._shown_redefined.keys() | scan.redefined.keys()):
            changed = scan.redefined.get(milestone_id, ())
            if self._shown_redefined.get(milestone_id, ()) != changed:
                self.bus.publish(MilestoneRedefined(milestone_id, changed))
        self._shown_redefined = dict(scan.redefined)

    def _note_published(self, event: Event) -> None:
        """Bus subscriber: a record the run or an action published is already shown."""
        if isinstance(event, MilestoneChanged) and self._shown is not None:
            self._shown[event.record.id] = event.record
