"""The one place where engine threads meet the GUI thread.

The engine publishes events synchronously on whatever thread produced them (its worker, or an
agent's reader thread). `EngineBridge` subscribes once, queues each event, and re-emits it as a
Qt signal on the GUI thread. Events are coalesced: a flood of agent output costs one wake-up per
drain, not one queued Qt call per event, and a drain is time-boxed so the event loop keeps
breathing. Engine calls that may block (resume, approve, add, changes…) run on one worker
thread and report back through the same queue. No widget is ever touched off the GUI thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from PySide6.QtCore import QMetaMethod, QObject, Qt, QTimer, Signal, SignalInstance, Slot

from anima import events as ev
from anima.text.redact import redact

if TYPE_CHECKING:
    from anima.diffs import ChangeSet
    from anima.engine.facade import MilestoneRecord

log = logging.getLogger(__name__)

# A drain never holds the GUI thread longer than this; the rest waits for the next turn.
_DRAIN_BUDGET_S = 0.008


class EngineLike(Protocol):
    """What the UI needs from `anima.engine.Engine` (kept structural so tests can stand in)."""

    bus: ev.EventBus

    def start(self, *, watch: bool = True) -> None: ...
    def shutdown(self, timeout: float = 10.0) -> None: ...
    def add_milestone(self, md: Path) -> str: ...
    def resume(self, milestone_id: str, note: str = "") -> None: ...
    def approve(self, milestone_id: str) -> None: ...
    def request_changes(self, milestone_id: str, note: str) -> None: ...
    def abort(self, milestone_id: str) -> None: ...
    def start_milestone(self, milestone_id: str) -> None: ...
    def pause_after_round(self, milestone_id: str | None = None) -> None: ...
    def stop_now(self, milestone_id: str | None = None) -> None: ...
    def records(self) -> list[MilestoneRecord]: ...
    def transcript(self, milestone_id: str) -> list[ev.TranscriptEvent]: ...
    def changes(self, milestone_id: str, round_no: int | None = None) -> ChangeSet: ...
    def add_comment(self, milestone_id: str, path: str, line: int, text: str) -> None: ...
    def edit_comment(self, milestone_id: str, comment_id: str, text: str) -> None: ...
    def remove_comment(self, milestone_id: str, comment_id: str) -> None: ...
    def continue_from_round(self, milestone_id: str, round_no: int, note: str = "") -> None: ...


EngineFactory = Callable[[Path], EngineLike]


def default_engine_factory(root: Path) -> EngineLike:
    """The real engine, imported when the first project opens (not at the window's start)."""
    from anima.engine.facade import Engine

    return Engine(root)


class EngineCallError(Exception):
    """An engine call's error as the window may show it."""


class _Call:
    """The outcome of a background engine call, queued back to the GUI thread."""

    __slots__ = ("error", "label", "on_done", "on_error", "result")

    def __init__(self, label: str, result: Any, error: BaseException | None,
                 on_done: Callable[[Any], None] | None,
                 on_error: Callable[[BaseException], None] | None) -> None:
        self.label = label
        self.result = result
        # Shown in the window as it is: an error quoting git (a remote URL with its token)
        # is redacted first, like everything the engine publishes.
        self.error = error if error is None else EngineCallError(redact(str(error)))
        self.on_done = on_done
        self.on_error = on_error


class EngineBridge(QObject):
    """Re-emits engine events as Qt signals on the GUI thread; runs engine calls off it.

    Every signal below fires on the GUI thread (the thread that owns the bridge), in the order
    the engine published the events.
    """

    #: Every engine event, in order. GUI thread.
    event_received = Signal(object)
    #: An agent event (`anima.events.AgentEvent`: text, tool use, result…). GUI thread.
    agent_event_received = Signal(object)
    #: A run of consecutive agent events as one list: the cheap way to follow a flood of
    #: output (one call per drain instead of one per event). GUI thread.
    agent_events_received = Signal(object)
    #: `PhaseChanged`. GUI thread.
    phase_changed = Signal(object)
    #: `MilestoneChanged` (its `record` is the engine's private copy). GUI thread.
    milestone_changed = Signal(object)
    #: `MilestonesScanned` (once per start: the whole list). GUI thread.
    milestones_scanned = Signal(object)
    #: `MilestoneRemoved`. GUI thread.
    milestone_removed = Signal(object)
    #: `MilestoneRedefined`. GUI thread.
    milestone_redefined = Signal(object)
    #: `ProblemReported` / `ProblemResolved`. GUI thread.
    problem_reported = Signal(object)
    problem_resolved = Signal(object)
    #: `EngineReady` (the config the engine runs with). GUI thread.
    engine_ready = Signal(object)
    #: `VerdictReached`. GUI thread.
    verdict_reached = Signal(object)
    #: `LogLine`. GUI thread.
    log_line_received = Signal(object)
    #: `EngineError`, and failures of calls made through `call()`, as `EngineError`. GUI thread.
    error_raised = Signal(object)
    #: `CheckStarted` / `CheckFinished`: Anima runs the project's checks. GUI thread.
    check_event = Signal(object)
    #: `Notice` (paused, completed, awaiting_review, failed). GUI thread.
    notice_posted = Signal(object)
    #: `UsageLimitWait`: the loop waits for a usage limit to reset (or stopped waiting).
    usage_limit_wait = Signal(object)
    #: A background call finished: (label, result). GUI thread.
    call_finished = Signal(str, object)

    # Internal wake-up; emitted from any thread, delivered queued to the GUI thread.
    _woken = Signal()

    def __init__(self, bus: ev.EventBus, engine: EngineLike | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.bus = bus
        self.engine = engine
        self._lock = threading.Lock()
        self._queue: deque[object] = deque()
        self._wake_pending = False
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._busy = 0
        self._woken.connect(self._on_woken, Qt.ConnectionType.QueuedConnection)
        self._unsubscribe: Callable[[], None] | None = bus.subscribe(self._on_published)
        self._typed: dict[type, SignalInstance] = {
            ev.PhaseChanged: self.phase_changed,
            ev.MilestoneChanged: self.milestone_changed,
            ev.MilestonesScanned: self.milestones_scanned,
            ev.MilestoneRemoved: self.milestone_removed,
            ev.MilestoneRedefined: self.milestone_redefined,
            ev.ProblemReported: self.problem_reported,
            ev.ProblemResolved: self.problem_resolved,
            ev.EngineReady: self.engine_ready,
            ev.VerdictReached: self.verdict_reached,
            ev.LogLine: self.log_line_received,
            ev.EngineError: self.error_raised,
            ev.Notice: self.notice_posted,
            ev.CheckStarted: self.check_event,
            ev.CheckFinished: self.check_event,
            ev.UsageLimitWait: self.usage_limit_wait,
        }

    # --- any thread ---------------------------------------------------------------------------
    def _on_published(self, event: ev.Event) -> None:
        """Bus subscriber: runs on the publisher's thread, so it only queues."""
        self._post(event)

    def _post(self, item: object) -> None:
        with self._lock:
            if self._closed:
                return
            self._queue.append(item)
            if self._wake_pending:
                return
            self._wake_pending = True
        self._woken.emit()

    # --- GUI thread -----------------------------------------------------------------------------
    @Slot()
    def _on_woken(self) -> None:
        """Drain the queue for at most a few milliseconds, then yield to the event loop."""
        deadline = time.perf_counter() + _DRAIN_BUDGET_S
        while True:
            with self._lock:
                if not self._queue:
                    self._wake_pending = False
                    return
                batch = [self._queue.popleft() for _ in range(min(512, len(self._queue)))]
            try:
                self._dispatch_all(batch)
            except Exception:
                # A failing consumer must not stall the queue (the wake-up would stay pending
                # forever): report it and go on with the next batch.
                log.exception("a consumer of engine events failed")
            if time.perf_counter() > deadline:
                # Leave the wake-up pending and come back after the event loop ran.
                QTimer.singleShot(0, self._on_woken)
                return

    def _connected(self, signal: Any) -> bool:
        return self.isSignalConnected(QMetaMethod.fromSignal(signal))

    def _dispatch_all(self, items: list[object]) -> None:
        """Emit in publication order; per-event signals only when someone listens."""
        each = self._connected(self.event_received)
        each_agent = self._connected(self.agent_event_received)
        run: list[ev.AgentEvent] = []
        for item in items:
            if isinstance(item, ev.AgentEvent):
                if each:
                    self.event_received.emit(item)
                if each_agent:
                    self.agent_event_received.emit(item)
                run.append(item)
                continue
            if run:
                self.agent_events_received.emit(run)
                run = []
            try:
                self._dispatch(item)
            except Exception:  # one failing consumer costs its own event, not the batch's
                log.exception("a consumer of %s failed", type(item).__name__)
        if run:
            self.agent_events_received.emit(run)

    def _dispatch(self, item: object) -> None:
        if isinstance(item, _Call):
            self._busy -= 1
            self._finish_call(item)
            return
        self.event_received.emit(item)
        if isinstance(item, ev.AgentEvent):
            self.agent_event_received.emit(item)
            self.agent_events_received.emit([item])
            return
        signal = self._typed.get(type(item))
        if signal is not None:
            signal.emit(item)

    def _finish_call(self, call: _Call) -> None:
        if call.error is None:
            if call.on_done is not None:
                call.on_done(call.result)
            self.call_finished.emit(call.label, call.result)
            return
        if call.on_error is not None:
            call.on_error(call.error)
            return
        self.error_raised.emit(ev.EngineError(message=f"{call.label} failed: {call.error}"))

    def flush(self) -> None:
        """Deliver everything queued right now (tests, and before a replay)."""
        with self._lock:
            items = list(self._queue)
            self._queue.clear()
        self._dispatch_all(items)

    # --- engine calls --------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """True while a background call is in flight."""
        return self._busy > 0

    def call(self, label: str, fn: Callable[[], Any], *,
             on_done: Callable[[Any], None] | None = None,
             on_error: Callable[[BaseException], None] | None = None) -> None:
        """Run `fn` on the bridge's worker thread; report back on the GUI thread.

        One worker serialises the calls, so "resume" never overtakes an earlier "add".
        Without `on_error`, a failure is shown like any engine error.
        """
        if self._closed:
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="anima-ui-call")
        self._busy += 1

        def run() -> None:
            try:
                result, error = fn(), None
            except Exception as e:  # reported on the GUI thread, never swallowed
                log.debug("background call %s failed", label, exc_info=True)
                result, error = None, e
            self._post(_Call(label, result, error, on_done, on_error))

        self._executor.submit(run)

    def _engine(self) -> EngineLike:
        if self.engine is None:
            raise RuntimeError("no engine attached to the bridge")
        return self.engine

    def add_milestone(self, md: Path, on_done: Callable[[str], None] | None = None) -> None:
        self.call(f"Adding {md.name}", lambda: self._engine().add_milestone(md), on_done=on_done)

    def resume(self, milestone_id: str, note: str = "") -> None:
        self.call(f"Resuming {milestone_id}", lambda: self._engine().resume(milestone_id, note))

    def approve(self, milestone_id: str) -> None:
        self.call(f"Approving {milestone_id}", lambda: self._engine().approve(milestone_id))

    def request_changes(self, milestone_id: str, note: str) -> None:
        self.call(f"Requesting changes on {milestone_id}",
                  lambda: self._engine().request_changes(milestone_id, note))

    def abort(self, milestone_id: str) -> None:
        self.call(f"Aborting {milestone_id}", lambda: self._engine().abort(milestone_id))

    def start_milestone(self, milestone_id: str) -> None:
        self.call(f"Starting {milestone_id}", lambda: self._engine().start_milestone(milestone_id))

    def pause_after_round(self, milestone_id: str | None = None, *,
                          on_error: Callable[[BaseException], None] | None = None) -> None:
        """Pause that milestone after its round (None: every running one)."""
        self.call("Pause after this round",
                  lambda: self._engine().pause_after_round(milestone_id), on_error=on_error)

    def stop_now(self, milestone_id: str | None = None) -> None:
        """Stop that milestone's agents now (None: every running one's); the others go on."""
        self.call("Stop now", lambda: self._engine().stop_now(milestone_id))

    def add_comment(self, milestone_id: str, path: str, line: int, text: str) -> None:
        self.call(f"Saving a comment on {path}:{line}",
                  lambda: self._engine().add_comment(milestone_id, path, line, text))

    def edit_comment(self, milestone_id: str, comment_id: str, text: str) -> None:
        self.call("Saving a comment",
                  lambda: self._engine().edit_comment(milestone_id, comment_id, text))

    def remove_comment(self, milestone_id: str, comment_id: str) -> None:
        self.call("Removing a comment",
                  lambda: self._engine().remove_comment(milestone_id, comment_id))

    def records(self, on_done: Callable[[list[MilestoneRecord]], None]) -> None:
        self.call("Reading milestones", lambda: self._engine().records(), on_done=on_done)

    def transcript(self, milestone_id: str,
                   on_done: Callable[[list[ev.TranscriptEvent]], None]) -> None:
        """The milestone's recorded events; an unreadable transcript is logged and reads as
        none (the live output must not wait for it)."""
        def unreadable(error: BaseException) -> None:
            log.warning("could not read the transcript of %s: %s", milestone_id, error)
            on_done([])

        self.call(f"Reading the transcript of {milestone_id}",
                  lambda: self._engine().transcript(milestone_id), on_done=on_done,
                  on_error=unreadable)

    # --- lifetime ------------------------------------------------------------------------------
    def close(self, *, wait: bool = True) -> None:
        """Unsubscribe and stop the worker; queued events are dropped. Idempotent."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        with self._lock:
            self._closed = True
            self._queue.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=wait, cancel_futures=True)
            self._executor = None
