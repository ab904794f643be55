"""The engine facade: one project, a worker that schedules, and a thread per running
milestone (up to `max_parallel_milestones`, each in its own worktree with its own pair).

The headless runner calls `run()` on its own thread; the app calls `start()`, which runs the
same loop on a worker thread, and sends requests (resume, approve, stop…) that the worker
carries out at once, whatever the running milestones are doing: they act on milestones that
wait for a human, or on one milestone's run. Everything the engine does is published on its
bus, each milestone's events stamped with its id.

One engine per project: `prepare()` takes `.anima/anima.lock` before anything else, then
repairs what a dead predecessor left behind (`anima.loop.recovery`), so an in_progress milestone
resumes exactly where it stopped.
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from anima import comments, procfs
from anima.atomic import create_atomic
from anima.config import Config
from anima.diffs import ChangeSet, milestone_changes
from anima.engine import read_only
from anima.engine.agents import AgentFactory, owns_process
from anima.engine.control import ControlServer
from anima.engine.milestones import MilestoneQueue
from anima.engine.outcome import RunOutcome
from anima.engine.project import ensure_gitignore
from anima.engine.settings import LiveConfig
from anima.engine.watcher import MilestoneWatcher
from anima.errors import (
    ActionError,
    AnimaError,
    ConfigError,
    LockError,
    MilestoneError,
    ProjectError,
    unexpected,
)
from anima.events import (
    ROLES,
    EngineError,
    Event,
    EventBus,
    LogLine,
    Notice,
    PhaseChanged,
    TranscriptEvent,
)
from anima.git import GitRepo
from anima.git.objects import take_objects
from anima.guard.restore import describe_held, describe_kept, put_back_interrupted
from anima.journal import Journal, log_event, read_transcript_tail
from anima.lock import ProjectLock
from anima.logsetup import configure_logging
from anima.loop import actions, rewind
from anima.loop.account import AccountGate
from anima.loop.completion import MergeQueue, finish_completed, merge_pending
from anima.loop.confinement import (
    BranchEpoch,
    MilestoneSandbox,
    SandboxPolicy,
    sandbox_problem,
)
from anima.loop.phases import TRANSITIONS
from anima.loop.recovery import AgentRegistry, note_unnamed_stashes, recover_project
from anima.loop.run import MilestoneRun
from anima.loop.seats import Agent, RunControl
from anima.loop.state import board, reconcile_state
from anima.loop.worktree import hide_copied_in, prune_leftover_worktrees
from anima.paths import ProjectPaths
from anima.phases import Phase
from anima.store.milestone_md import load_milestone
from anima.store.models import Feature as Feature  # the records' parts, for the UI's type hints
from anima.store.models import Iteration as Iteration
from anima.store.models import MilestoneRecord as MilestoneRecord
from anima.store.models import MilestoneStatus, now
from anima.store.names import validate_milestone_id
from anima.store.store import Scan, Store
from anima.text.context import ApiTokenCounter
from anima.text.prompts import PromptBuilder
from anima.text.redact import RedactingBus, add_known_secrets, environment_secrets
from anima.text.summarizer import Summarizer

log = logging.getLogger(__name__)

#: How often a merge into main that waits for the human's files is tried again.
_MERGE_RETRY_SECONDS = 3.0
#: How long a request from another process (`anima stop|resume|…`) waits for its outcome.
_ANSWER_SECONDS = 60.0
#: The API Anima's own summarizer and token counter speak (`Backend.api`).
_ANTHROPIC = "anthropic"


@dataclass
class _Session:
    """One running milestone: its run on its own thread, and the requests for it."""

    milestone_id: str
    control: RunControl = field(default_factory=RunControl)
    run: MilestoneRun | None = None
    thread: threading.Thread | None = None
    error: AnimaError | None = None  # what kept it from being driven at all
    left: str = ""  # what a stop by you left to do, once it paused the milestone


class Engine:
    """Drives one managed project. Not reentrant: one engine per project per process."""

    def __init__(self, root: Path, *, bus: EventBus | None = None,
                 config_overrides: dict[str, Any] | None = None) -> None:
        self.root = Path(root).resolve()
        self.paths = ProjectPaths(self.root)
        # Each agent's CLI inherits its own credentials (and `pass_env` any): secrets in
        # their output.
        add_known_secrets(environment_secrets(os.environ))
        self.bus = bus or RedactingBus()
        self.store = Store(self.paths)
        self.settings = LiveConfig(self.paths, self.bus, config_overrides, self._told_limit)
        self.config = self.settings.config
        self._repo: GitRepo | None = None
        self._lock = ProjectLock(self.paths.lock, command=shlex.join(sys.argv))
        self._locked = False
        self._recovered = False
        #: `sandbox: "auto"` without bubblewrap is said once, plainly
        self._sandbox = SandboxPolicy(lambda text: self.bus.publish(EngineError(text)))
        self._next_merge_try = 0.0
        self._registry = AgentRegistry(self.paths)
        self.agents = AgentFactory(self.root, self.bus, self._registry,
                                   lambda text: self._log(None, text))
        self._commands: queue.Queue[Callable[[], object]] = queue.Queue()
        self._looping = False  # requests wait for the loop's next step while it runs
        self._wake = threading.Event()
        self._shutdown = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: MilestoneWatcher | None = None
        #: the running milestones, by id (the worker adds and reaps; anyone may read)
        self._sessions: dict[str, _Session] = {}
        #: per agent CLI, the one API account behind every pair that uses it
        self._accounts: dict[str, AccountGate] = {}
        self._merge_queue = MergeQueue()
        self._branches = BranchEpoch()  # milestone branches made while agents run
        self.milestones = MilestoneQueue(self.store, self.bus, lambda: self.config, self._log)
        self.bus.subscribe(self._on_held)
        self.bus.subscribe(self._keep_lock)
        self.journal = Journal(self.paths, self.bus)
        self.summarizer: Summarizer | None = None
        #: summarizers a config change replaced, closed once no running milestone uses one
        self._retired: list[Summarizer] = []
        self._unlog: Callable[[], None] | None = None
        self._control_server: ControlServer | None = None

    # ------------------------------------------------------------------ set-up
    def prepare(self) -> None:
        """Everything that can be wrong before driving: the lock, config, git; then repair
        what a previous Anima that died left behind.

        The lock comes first: nothing may be written while another Anima drives the project.
        """
        if not self.paths.anima.is_dir():
            raise ProjectError(f"{self.root} has no .anima/ folder: run `anima init {self.root}`")
        if self._unlog is None:
            configure_logging(self.paths)
            self._unlog = self.bus.subscribe(log_event)
        if not self._locked:
            self._lock.acquire()
            self._locked = True
            if (old := self._lock.taken_over_from) is not None:
                self._log(None, f"took over the lock of an Anima that is gone ({old.describe()})")
        done = put_back_interrupted(self.paths)
        for line in done.changed:
            self._log(None, f"put back the human's {line}, changed by a Developer turn that "
                            "a kill cut short")
        if done.kept:
            self._log(None, describe_kept(done.kept))
        if done.held:
            self._log(None, describe_held(done.held, "a Developer turn that a kill cut short"))
        if done.record:
            self._log(None, f"put back {done.record} as Anima last wrote it: a Developer turn "
                            "that a kill cut short had changed it")
        self.config = self.agents.config = self.settings.load()
        sandbox_problem(self.config.sandbox)  # "required" without bubblewrap: refused here
        self.store.load_state()  # a newer Anima's is refused before a record is registered
        self.agents.start_probe()
        self.paths.milestones.mkdir(parents=True, exist_ok=True)
        ensure_gitignore(self.paths)
        # The window lists the milestones even when git (next) says the project can't run.
        self.milestones.refresh(republish=True)
        self._repo = GitRepo.open(self.root)
        if not self._recovered:
            self._recover()
            self._recovered = True
        self.summarizer = self._summarizer(self.config)
        if self._control_server is None:  # `anima stop|resume|… PROJECT ID` from a terminal
            server = ControlServer(self.root, self.control)
            try:
                server.start()
                self._control_server = server
            except AnimaError as e:
                self._log(None, str(e))

    def _summarizer(self, config: Config) -> Summarizer:
        """Round summaries from Anthropic's API only beside an agent that speaks it; with
        none (codex in both roles) they come from the reports, and the log says so."""
        settings = config.summarizer
        if settings.enabled and _ANTHROPIC not in self.agents.apis():
            self._log(None, "round summaries come from the reports: the summarizer uses "
                            "Anthropic's API and no role runs an agent on it")
            settings = settings.model_copy(update={"enabled": False})
        return Summarizer(settings)

    def _retry_waiting_merges(self, scan: Scan, *, now: bool = False) -> bool:
        """A merge that waits for the human's files is tried again every few seconds (`now`:
        at once): it goes on by itself once they commit or stash them. True when one was
        tried (it may have merged, or gone back for a merge round: the scan is stale)."""
        if not now and time.monotonic() < self._next_merge_try:
            return False
        if any(s.run is None or not s.run.sandbox.active for s in self._sessions.values()):
            # An agent (or the checks) running as you may have written any record, a merge
            # owed on a branch nobody judged: merges wait until the guard has put them back.
            return False
        self._next_merge_try = time.monotonic() + _MERGE_RETRY_SECONDS
        tried = False
        for record in filter(merge_pending, scan.records):
            if record.id not in self._sessions:  # a run finishing its own merge has it
                finish_completed(record, self.store, self.repo, self.config, self.bus)
                tried = True
        return tried

    def _recover(self) -> None:
        """After a crash: stop leftover agents, clean up files, finish a cut-short merge,
        make state.json agree with the records. Cheap and silent when nothing is wrong."""
        for line in recover_project(self.paths, self._registry, self.store.load_records(),
                                    self.repo, owns_process):
            self._log(None, line)
        records = self.milestones.read(register=False).records
        for record in records:  # a killed turn's commits: readable by your git again
            for line in take_objects(self.paths.agent_objects(record.id), self.repo.common_dir):
                self._log(record.id, line)
        for line in prune_leftover_worktrees(self.repo, self.paths, records):
            self._log(None, line)
        for line in rewind.finish_cut_short(self.store, self.repo, self.config, records,
                                            self.bus):
            self._log(None, line)
        # (as on disk: a stash made just now by the prune is not on record either)
        for record in note_unnamed_stashes(self.milestones.read(register=False).records,
                                           self.repo):
            self.store.save_record(record)
            self._log(record.id, record.notes[-1])
        if owed := list(filter(merge_pending, records)):
            for record in owed:
                self._log(record.id, "finishing the merge into main that a restart cut short")
                finish_completed(record, self.store, self.repo, self.config, self.bus)
            records = self.milestones.read(register=False).records  # merged, or reopened
        if reconcile_state(self.store, records):
            self._log(None, "state.json brought in line with the milestone records")

    @property
    def repo(self) -> GitRepo:
        if self._repo is None:
            self._repo = GitRepo.open(self.root)
        return self._repo

    def _parallel_limit(self) -> int:
        return self._limit_of(self.config)

    def _limit_of(self, config: Config) -> int:
        """How many milestones may run at once: without the sandbox, one (the guard that
        then puts back what an agent changed compares the whole project before and after a
        turn, which another milestone's turn would spoil)."""
        if not self._sandbox.active(config.sandbox):
            return 1
        return config.max_parallel_milestones

    def _told_limit(self, config: Config) -> int:
        """The limit the window is told (`EngineReady`); 0 where no milestone can start
        (`sandbox: "required"` without bubblewrap: the error says why)."""
        try:
            return self._limit_of(config)
        except ConfigError:
            return 0

    # ------------------------------------------------------------------ the loop
    def run(self, *, watch: bool = False, start_all: bool = False) -> RunOutcome:
        """Drive milestones until nothing can proceed (or, with `watch`, until shutdown).

        Errors that make the project undrivable (config, git, lock, no claude) are raised
        when not watching; when watching, a config error is published as EngineError and
        raised only if the run is stopped before you fix it. `start_all` starts
        pending milestones even when `auto_start` is off (an explicit `anima run`).
        """
        self.milestones.start_all = start_all
        if not watch:
            self.prepare()
        else:
            self._prepare_watching()
            self._watcher = MilestoneWatcher(self.paths.milestones, self._on_milestone_file)
            self._watcher.start()
            self.milestones.watch(self.paths.milestones)
        self._looping = True
        ending = False  # nothing to start or drive: one more step tries every owed merge
        try:
            while not self._shutdown.is_set():
                self._drain_commands()
                error = self._reap()
                if error is not None and not watch:
                    raise error
                self._reload_config()
                scan = self.milestones.scan()
                if self._retry_waiting_merges(scan, now=ending):
                    scan = self.milestones.scan()
                started = self.milestones.startable(scan, set(self._sessions),
                                                    self._parallel_limit())
                for record in started:
                    self._start(record)
                if not started and not self._sessions and not watch:
                    # A merge that lost a race to main (or met a lock) merges when tried
                    # again, and what depends on it starts: not left owed by the run's end.
                    if ending or not any(map(merge_pending, scan.records)):
                        return self._ended(scan)
                    ending = True
                    continue
                ending = False
                self._wait()
            return self._ended(self.milestones.scan())
        finally:
            self._stop_sessions("shutdown")
            self._looping = False
            self._drain_commands()  # a request that came meanwhile is not lost
            self.milestones.watching = False
            if self._watcher is not None:
                self._watcher.stop()
                self._watcher = None

    def _start(self, record: MilestoneRecord) -> None:
        """Drive `record` on a thread of its own."""
        session = _Session(record.id)
        if self._shutdown.is_set():
            session.control.stop.set()
        session.thread = threading.Thread(target=self._drive_session, args=(session, record),
                                          name=f"anima-{record.id}", daemon=True)
        self._sessions[record.id] = session
        session.thread.start()

    def _drive_session(self, session: _Session, record: MilestoneRecord) -> None:
        try:
            self._drive(session, record)
        except AnimaError as e:
            session.error = e
        except Exception as e:
            log.exception("milestone %s: unexpected error", record.id)
            session.error = AnimaError(unexpected(e))
        finally:
            self._wake.set()

    def _reap(self) -> AnimaError | None:
        """Forget the sessions whose run ended; a milestone that could not be driven at all
        is not started again in this run (it would fail the same way every second)."""
        first: AnimaError | None = None
        for milestone_id, session in list(self._sessions.items()):
            if session.thread is not None and session.thread.is_alive():
                continue
            del self._sessions[milestone_id]
            if (e := session.error) is not None:
                self.bus.publish(EngineError(f"{e}; {milestone_id} is left as it is until the "
                                             "next start", milestone_id))
                self.milestones.broken.add(milestone_id)
                self.milestones.requested.discard(milestone_id)
                first = first or e
        in_use = {id(s.run.summarizer) for s in self._sessions.values() if s.run is not None}
        for old in [s for s in self._retired if id(s) not in in_use]:
            self._retired.remove(old)
            old.close()  # its last summaries are in: the run that used it waited for them
        return first

    def _stop_sessions(self, reason: str) -> None:
        """Stop every run and wait for their threads (each milestone resumes next time)."""
        sessions = list(self._sessions.values())
        for session in sessions:
            self._stop_session(session, reason)
        for session in sessions:
            if session.thread is not None:
                session.thread.join(30)
        self._reap()

    @staticmethod
    def _stop_session(session: _Session, reason: str) -> None:
        session.control.stop_reason = reason
        session.control.stop.set()
        if (run := session.run) is not None:
            run.stop(reason)

    def _prepare_watching(self) -> None:
        """`prepare()`, a broken config.json reported and read again once the user saves it
        (the window's banner says to edit it: that must be enough). Stopped before then, the
        error is raised as without watching: nothing could start (`anima run --watch` exits
        2 on it, not "nothing left to do")."""
        while True:
            stamp = self.settings.stamp()
            try:
                self.prepare()
                return
            except ConfigError as e:
                self.bus.publish(EngineError(f"{e}; Anima reads it again when you save it"))
                standing = e
            while self.settings.stamp() == stamp:
                if self._shutdown.is_set():
                    raise standing
                self._wait()

    def _reload_config(self) -> None:
        """Before the next start: a config.json saved since it was read takes effect."""
        if (config := self.settings.reloaded()) is None:
            return
        apis = self.agents.apis()
        self.agents.use_config(config)
        changed = config.summarizer != self.config.summarizer or apis != self.agents.apis()
        if changed and self.summarizer is not None:  # the running milestones keep theirs
            self._retired.append(self.summarizer)
            self.summarizer = self._summarizer(config)
        self.config = config
        self._log(None, f"{self.paths.config} changed: settings reloaded")

    def start(self, *, watch: bool = True) -> None:
        """Run the loop on a worker thread; problems arrive as EngineError events."""
        def work() -> None:
            try:
                self.run(watch=watch)
            except AnimaError as e:
                self.bus.publish(EngineError(str(e)))
            except Exception as e:
                log.exception("engine worker failed")
                self.bus.publish(EngineError(unexpected(e)))
        self._thread = threading.Thread(target=work, name="anima-engine", daemon=True)
        self._thread.start()

    def request_stop(self) -> None:
        """From any thread but the worker (a signal handler's helper, the GUI): interrupt the
        turn and leave the loop; returns once the agents let go (a few seconds at most)."""
        self._shutdown.set()
        self._wake.set()
        for session in list(self._sessions.values()):
            self._stop_session(session, "shutdown")

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the agents (the milestone resumes on the next start) and release the lock."""
        self.request_stop()
        if self._control_server is not None:
            self._control_server.close()
            self._control_server = None
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("engine worker still busy after %ss; releasing the lock anyway",
                            timeout)
        self.agents.wait_for_probe(timeout)
        for summarizer in [*self._retired, self.summarizer]:
            if summarizer is not None:
                summarizer.close()
        self.settings.close()
        self.journal.detach()
        if self._unlog is not None:
            self._unlog()
            self._unlog = None
        if self._locked:
            self._lock.release()
            self._locked = False

    def _wait(self) -> None:
        self._wake.wait(timeout=1.0)
        self._wake.clear()

    def _drive(self, session: _Session, record: MilestoneRecord) -> Phase:
        """One milestone's run, on its session's thread."""
        # A missing CLI is reported before anything changes; its version goes on record.
        record.agents = self.agents.runs()
        self.agents.tell_kept_credentials()
        record.claude_version = next((run.version for run in record.agents.values()
                                      if run.agent == "claude"), record.claude_version)
        config = self.config
        self.journal.open(record.id, max_bytes=int(config.transcript_max_mb * 2**20))
        counter = ApiTokenCounter(config.summarizer.model) \
            if config.exact_token_count and _ANTHROPIC in self.agents.apis() else None
        prompts = PromptBuilder(self.paths, budget_tokens=config.context_budget_tokens,
                                recent_in_full=config.recent_rounds_in_full,
                                counter=counter,
                                tree=self.paths.worktree(record.id))
        assert self.summarizer is not None
        sandbox = MilestoneSandbox(self.paths, record.id,
                                   active=self._sandbox.active(config.sandbox),
                                   common_dir=self.repo.common_dir,
                                   visible=self.agents.install_paths())

        def make_agent(role: str, session_id: str, resume: bool) -> Agent:
            return self.agents.make(record, role, session_id, resume, sandbox=sandbox)

        control = session.control
        run = MilestoneRun(record=record, store=self.store, repo=self.repo, config=config,
                           prompts=prompts, agents=make_agent, bus=self.bus,
                           summarizer=self.summarizer, control=control,
                           dialects={role: self.agents.backend(role) for role in ROLES},
                           sandbox=sandbox, merge_queue=self._merge_queue,
                           branches=self._branches,
                           accounts={role: self._accounts.setdefault(
                               getattr(config, role).agent, AccountGate()) for role in ROLES})
        session.run = run
        if control.stop.is_set():  # a stop that came before the run existed
            run.stop(control.stop_reason or "shutdown")
        try:
            phase = run.run()
            # Stopped by you where it may pause; one that came to rest first (failed too,
            # at the same instant) stays as it came.
            if control.stop.is_set() and control.stop_reason == "user" and \
                    Phase.PAUSED in TRANSITIONS[phase]:
                session.left = run.left_by_stop(by_you=True)
                phase = run.pause_now("stopped by you")
            return phase
        finally:
            board(self.store).leave(record.id)
            self.milestones.requested.discard(record.id)
            self._stop_leftovers(record.id)
            self.journal.close(record.id)
            if counter is not None:
                counter.close()

    def _on_held(self, event: Event) -> None:
        """A held arrival's record (registered when it came) is gone: the list says so now."""
        if isinstance(event, Notice) and event.kind == "held":
            self.milestones.refresh()

    def _keep_lock(self, event: Event) -> None:
        """After each step of a run (an agent's shell may have deleted `.anima/` files): the
        lock file is still the one held, or taken again before anything else happens."""
        if not isinstance(event, PhaseChanged) or not self._locked:
            return
        try:
            if self._lock.ensure_held():
                self._log(event.milestone_id, "the project's lock file .anima/anima.flock was "
                          "deleted (by an agent's command, most likely); Anima took it again")
        except LockError as e:
            self._log(event.milestone_id, f"{e}: this Anima stops driving the project")
            self._locked = False
            self.request_stop()

    def _stop_leftovers(self, milestone_id: str) -> None:
        """Nothing the agents started outlives the milestone's run (each agent's stop took its
        own; this catches what an agent that could not be stopped cleanly left)."""
        if left := procfs.stop_marked(procfs.marker_prefix(self.root, milestone_id)):
            self._log(milestone_id, f"stopped {len(left)} process(es) the agents had left "
                                    f"running (pids {', '.join(map(str, left))})")

    def _ended(self, scan: Scan) -> RunOutcome:
        """Nothing is driven any more: state.json says so, as the records do."""
        reconcile_state(self.store, scan.records)
        return RunOutcome.of(scan.records, scan.problems, scan.dependencies.waiting,
                             scan.dependencies.broken, scan.orphans, self._parallel_limit())

    # ------------------------------------------------------------------ requests
    def _submit(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the worker at its next step; without a loop, run it now."""
        if not self._looping:
            self._guarded(fn)
            return
        self._commands.put(fn)
        self._wake.set()

    def _drain_commands(self) -> None:
        while True:
            try:
                fn = self._commands.get_nowait()
            except queue.Empty:
                return
            self._guarded(fn)

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except AnimaError as e:
            self.bus.publish(EngineError(str(e)))

    def add_milestone(self, md: Path) -> str:
        """Validate and copy a milestone file in, and register it (pending) at once."""
        md = Path(md)
        milestone_id = validate_milestone_id(md.stem, md)
        definition = load_milestone(md)
        target = self.paths.milestone_md(milestone_id)
        if self.paths.milestone_record(milestone_id).exists() and (problem := (
                self.store.not_run_again(self.store.load_record(milestone_id), definition,
                                         md))) is not None:
            raise problem  # what each scan would report of it, from then on
        if target.exists() and target.resolve() == md.resolve():  # already where it goes
            self.milestones.register(target, now())
            self._wake.set()
            return milestone_id
        taken = MilestoneError(md, f"a milestone named {milestone_id!r} already exists "
                                   f"({target}); rename the file")
        if target.exists():
            raise taken
        self.paths.milestones.mkdir(parents=True, exist_ok=True)
        content = md.read_bytes()
        for session in list(self._sessions.values()):  # yours, not an agent's: not held
            if (run := session.run) is not None:
                run.admit_definition(target, content)
        try:  # another `anima add` of the name may be at this very step
            create_atomic(target, content)
        except FileExistsError:
            raise taken from None
        # Written whole, atomically: no need to wait for it to settle.
        self.milestones.register(target, now())
        if md.resolve().parent == self.paths.held.resolve():
            md.unlink(missing_ok=True)  # a held milestone you added again
        self._wake.set()
        return milestone_id

    def start_milestone(self, milestone_id: str) -> None:
        """Start a pending milestone (auto_start off), or retry one whose start failed."""
        self.milestones.broken.discard(milestone_id)
        self.milestones.requested.add(milestone_id)
        self._wake.set()

    def _action(self, action: str, milestone_id: str,
                note: str = "") -> Callable[[], MilestoneRecord]:
        """A human's decision on a milestone that waits for them, to run on the worker."""
        if action == "resume":
            def resume() -> MilestoneRecord:
                self._reload_config()  # a config.json saved a moment ago: what it grants
                return actions.resume(self.store, self.config, milestone_id, note, self.bus)
            return resume
        if action == "approve":
            return lambda: actions.approve(self.store, self.repo, self.config, milestone_id,
                                           self.bus)
        if action == "abort":
            return lambda: self._abort(milestone_id)
        raise ActionError(f"unknown action {action!r}")

    def _stop_waiting(self, milestone_id: str) -> MilestoneRecord:
        """On the worker: a milestone in progress that no run drives pauses as stopped by
        you; one that started meanwhile is stopped, and pauses so."""
        if (session := self._sessions.get(milestone_id)) is not None:
            self._stop_session(session, "user")
            if session.thread is not None:
                session.thread.join(_ANSWER_SECONDS)
            return actions.load(self.store, milestone_id)
        return actions.stop_waiting(self.store, milestone_id, self.bus)

    def _abort(self, milestone_id: str) -> MilestoneRecord:
        """On the worker, so no run starts meanwhile: a milestone that runs (perhaps not on
        its record yet: it is starting) is stopped first, then cancelled; its run never saves
        over the cancel."""
        if (session := self._sessions.get(milestone_id)) is not None:
            self._stop_session(session, "user")  # it pauses as stopped by you, then goes
            if session.thread is not None:
                session.thread.join(60)
        return actions.abort(self.store, self.repo, self.config, milestone_id, self.bus)

    def resume(self, milestone_id: str, note: str = "") -> None:
        self.milestones.broken.discard(milestone_id)
        self._submit(self._action("resume", milestone_id, note))

    def continue_from_round(self, milestone_id: str, round_no: int, note: str = "") -> None:
        """Put a paused milestone's branch back to an accepted round, then resume it."""
        self.milestones.broken.discard(milestone_id)
        self._submit(lambda: rewind.continue_from_round(self.store, self.repo, self.config,
                                                        milestone_id, round_no, note, self.bus))

    def approve(self, milestone_id: str) -> None:
        self._submit(self._action("approve", milestone_id))

    def request_changes(self, milestone_id: str, note: str) -> None:
        self._submit(lambda: actions.request_changes(self.store, milestone_id, note,
                                                     self.bus))

    def abort(self, milestone_id: str) -> None:
        self._submit(self._action("abort", milestone_id))

    def add_comment(self, milestone_id: str, path: str, line: int, text: str) -> None:
        """Comments are written at once (not queued behind a running milestone): the
        milestone they belong to waits for the human, so no run writes its record."""
        comments.add_comment(self.store, milestone_id, path, line, text, self.bus)

    def edit_comment(self, milestone_id: str, comment_id: str, text: str) -> None:
        comments.edit_comment(self.store, milestone_id, comment_id, text, self.bus)

    def remove_comment(self, milestone_id: str, comment_id: str) -> None:
        comments.remove_comment(self.store, milestone_id, comment_id, self.bus)

    def _chosen(self, milestone_id: str | None) -> list[_Session]:
        """The running milestone named (None: every running one); an unknown id is refused
        in the words of the other actions. A run that ended is not one (the worker may not
        have reaped it yet)."""
        sessions = {i: s for i, s in list(self._sessions.items()) if self._running(i)}
        if milestone_id is None:
            return list(sessions.values())
        if milestone_id not in sessions:
            actions.load(self.store, milestone_id)
            raise ActionError(f"{milestone_id} is not running")
        return [sessions[milestone_id]]

    def pause_after_round(self, milestone_id: str | None = None) -> None:
        """Pause the milestone (None: every running one) once its round ends."""
        for session in self._chosen(milestone_id):
            session.control.pause_after_round.set()

    def stop_now(self, milestone_id: str | None = None) -> None:
        """Interrupt the milestone's agents (None: every running one's); it pauses and its
        round is redone on resume. The others go on."""
        for session in self._chosen(milestone_id):
            self._stop_session(session, "user")

    def control(self, action: str, milestone_id: str, note: str = "") -> str:
        """A request from another process (`anima stop|resume|abort|approve`, through the
        control socket): carried out, or refused with an AnimaError; a line to print."""
        if action == "stop":
            return self._stop_and_say(milestone_id)
        if action == "pause":
            self.pause_after_round(milestone_id)
            return f"{milestone_id} pauses after its round"
        done = self._action(action, milestone_id, note)
        self._await_hand_over(milestone_id)
        if self._running(milestone_id) and (action != "abort" or actions.load(
                self.store, milestone_id).status is MilestoneStatus.IN_PROGRESS):
            # An abort takes what no run drives, as with no Anima running (README, CLI): one
            # waiting or pending, or in progress waiting for a free slot; a pending one that
            # is starting is stopped first.
            raise ActionError(f"{milestone_id} is running: stop it first "
                              f"(`anima stop {shlex.quote(str(self.root))} {milestone_id}`)")
        self.milestones.broken.discard(milestone_id)
        outcome = self._answer(action, milestone_id, done)
        self._wake.set()
        if action == "approve":
            return actions.approved(outcome)
        return f"{action}: {milestone_id} is {outcome.status.value}"

    def _answer(self, action: str, milestone_id: str,
                done: Callable[[], MilestoneRecord]) -> MilestoneRecord:
        """`done` carried out on the worker (no run starts meanwhile), its record the answer;
        refused with its AnimaError."""
        result: queue.Queue[MilestoneRecord | AnimaError] = queue.Queue()

        def act() -> None:
            try:
                result.put(done())
            except AnimaError as e:
                result.put(e)  # the asking process prints it
        self._submit(act)
        try:
            outcome = result.get(timeout=_ANSWER_SECONDS)
        except queue.Empty:
            raise ActionError(f"Anima is busy: the {action} of {milestone_id} is queued and "
                              "happens shortly; check with `anima status`") from None
        if isinstance(outcome, AnimaError):
            raise outcome
        return outcome

    def _stop_and_say(self, milestone_id: str) -> str:
        """`anima stop`: answered once the run has let go of the milestone, with where it
        stands (a stop as it completes, or goes to review, changes nothing), so that a
        `resume` right after it finds it paused. One in progress that waits for a free slot
        (resumed while the others fill them) is paused the same way before it starts."""
        if not self._running(milestone_id) and actions.load(
                self.store, milestone_id).status is MilestoneStatus.IN_PROGRESS:
            self._answer("stop", milestone_id, lambda: self._stop_waiting(milestone_id))
            session = self._sessions.get(milestone_id)  # (one that started meanwhile)
            left = session.left if session is not None else ""
            left = left or "it goes on where it was on resume"
        elif not self._stopped(sessions := self._chosen(milestone_id)):
            return (f"stopping {milestone_id}: it pauses as stopped by you once its "
                    "agents let go (`anima status` says when)")
        else:
            left = sessions[0].left
        record = actions.load(self.store, milestone_id)
        if record.status is MilestoneStatus.PAUSED and left:
            return f"stop: {milestone_id} is paused ({record.pause_reason}); {left}"
        return f"stop: {milestone_id} is {record.status.value}: it got there before the stop"

    def _stopped(self, sessions: list[_Session]) -> bool:
        """Stop these runs; whether they let go within the time an answer waits."""
        for session in sessions:
            self._stop_session(session, "user")
        for session in sessions:
            if session.thread is not None:
                session.thread.join(_ANSWER_SECONDS)
                if session.thread.is_alive():
                    return False
        return True

    def _await_hand_over(self, milestone_id: str) -> None:
        """A run whose last write handed its milestone to you (paused, awaiting review,
        failed: what `anima status` shows at once) is only stopping its agents: a request
        waits for it to let go, rather than being refused as for a milestone that runs."""
        session = self._sessions.get(milestone_id)
        if session is None or session.thread is None or not session.thread.is_alive():
            return
        if actions.load(self.store, milestone_id).status in (
                MilestoneStatus.PAUSED, MilestoneStatus.AWAITING_REVIEW, MilestoneStatus.FAILED):
            session.thread.join(_ANSWER_SECONDS)

    def _running(self, milestone_id: str) -> bool:
        """Whether a run drives the milestone now (one that ended may not be reaped yet)."""
        session = self._sessions.get(milestone_id)
        return session is not None and session.thread is not None and \
            session.thread.is_alive()

    # ------------------------------------------------------------------ views
    def records(self) -> list[MilestoneRecord]:
        """The milestone records as they are now. Read-only (safe from the GUI thread):
        registering new files is the worker's job."""
        return self.milestones.read(register=False).records

    def changes(self, milestone_id: str, round_no: int | None = None) -> ChangeSet:
        """The milestone's whole change, or one round's commit, for the Changes view. What
        the Developer committed in the turn running now is taken in first (see
        `take_objects`): git could not read it yet."""
        take_objects(self.paths.agent_objects(milestone_id), self.repo.common_dir,
                     report=False)
        return milestone_changes(self.repo, self.store.load_record(milestone_id), round_no,
                                 hide_copied_in(self.paths, milestone_id))

    def last_transcript(self) -> tuple[str | None, list[TranscriptEvent]]:
        """What a restarted window replays. Read-only."""
        return read_only.last_transcript(self.root)

    def transcript(self, milestone_id: str) -> list[TranscriptEvent]:
        """The newest events of a milestone's transcripts (the last REPLAY_BYTES of them)."""
        return read_transcript_tail(self.paths.transcripts(milestone_id), read_only.REPLAY_BYTES)

    # ------------------------------------------------------------------ helpers
    def _on_milestone_file(self, path: Path, appeared: datetime) -> None:
        """Watcher thread: `path` has settled."""
        self.milestones.broken.discard(path.stem)
        self.milestones.register(path, appeared)
        self._wake.set()

    def _log(self, milestone_id: str | None, text: str) -> None:
        self.bus.publish(LogLine(milestone_id, text))
