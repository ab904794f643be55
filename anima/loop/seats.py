"""The two agent seats of a milestone: a session per role (started, resumed, replaced when
lost, rolled over when its context fills), one turn at a time with the seed's failure handling
around it (a crash restarts and retries once, a timeout stops the agent, faults of the API go
through anima.loop.fault_policy), and a stop from any thread."""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from anima.agents.dialect import Dialect
from anima.config import Config
from anima.errors import AgentCrashed, AnimaError, SessionLost, TurnTimeout
from anima.events import (
    ACCEPTOR,
    DEVELOPER,
    AgentEvent,
    ApiRetry,
    Compacted,
    ContextUsage,
    EventBus,
    Notice,
    RateLimitChanged,
    SandboxFailure,
    SessionStarted,
    SpendSoFar,
    ToolResult,
    ToolUse,
    TurnResult,
    UsageLimitWait,
)
from anima.loop.account import AccountGate
from anima.loop.confinement import BranchEpoch
from anima.loop.fault_policy import FaultPolicy, Retry
from anima.loop.ledger import Ledger
from anima.loop.limits import TIMED_OUT
from anima.loop.state import board
from anima.remotes import RefMap, pushed, remote_refs
from anima.store.models import ContextUse, LimitWait, MilestoneRecord, Rollover, now
from anima.store.store import Store


class Agent(Protocol):
    """What the loop needs of an agent process (anima.agents.process.AgentProcess)."""

    @property
    def session_id(self) -> str: ...

    @property
    def went_on(self) -> bool: ...

    @property
    def held_still(self) -> bool: ...

    def send(self, prompt: str, waiting: Callable[[], None] | None = None) -> TurnResult: ...

    def take_unclaimed(self) -> list[TurnResult]: ...

    def interrupt(self, timeout: float = 10.0) -> None: ...

    def stop(self, grace: float = 5.0) -> None: ...


#: A write the sandbox refused (EROFS: all but the agent's own paths are mounted read-only),
#: as the tools print it at the end of a line: "<path>: Read-only file system" (the shell,
#: coreutils, git), "[Errno 30] Read-only file system: '<path>'" (Python), "EROFS: read-only
#: file system, open '<path>'" (node: the CLI's own Write). Not a line that merely quotes
#: the words (a grep through source).
_REFUSED = re.compile(r"(?:(?:: |\[Errno 30\] )Read-only file system(?:: (?:'[^']*'|\"[^\"]*\"))?"
                      r"|EROFS: read-only file system, \w+ '[^']*')\s*$")
#: Where git records the remote's branches after a push or fetch: only the Developer's own
#: branch is writable, so a push that went through (allowed, or told of by `check_pushes`)
#: still ends with git refused these; that is no write of the command's, and it would read
#: as the push refused.
_REMOTE_TRACKING = "/refs/remotes/"

#: (role, session_id, resume) -> a started agent.
AgentFactory = Callable[[str, str, bool], Agent]


class RunControl:
    """Requests from outside the worker thread: stop now, or pause after this round."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.pause_after_round = threading.Event()
        self.stop_reason = ""


class Stopped(Exception):
    """A stop was requested while a turn was running; leave without recording."""


class Seats:
    """The Developer's and the Acceptor's agents, started on demand."""

    def __init__(self, *, record: MilestoneRecord, store: Store, root: Path, config: Config,
                 make_agent: AgentFactory, dialects: Mapping[str, Dialect], bus: EventBus,
                 control: RunControl, ledger: Ledger,
                 save: Callable[[], None], log_line: Callable[[str], None],
                 request_pause: Callable[[str], None],
                 accounts: Mapping[str, AccountGate] | None = None,
                 branches: BranchEpoch | None = None, confined: bool = False,
                 outdated: Callable[[str], str | None] = lambda role: None) -> None:
        self.record = record
        self.confined = confined  # its agents run in the sandbox
        #: why a role's running agent must start again before its next turn (its sandbox
        #: no longer fits the tree: `MilestoneSandbox.outdated`), or None
        self.outdated = outdated
        #: per role, the API account it shares with the agents of every running milestone
        #: that use the same vendor
        shared = AccountGate()
        self.accounts = accounts or {DEVELOPER: shared, ACCEPTOR: shared}
        #: milestone branches made while this milestone runs (see `BranchEpoch`)
        self.branches = branches or BranchEpoch()
        self._confined_at: dict[str, int] = {}  # role -> the epoch its agent started in
        self.store = store
        self.root = root
        self.config = config
        self.make_agent = make_agent
        self.dialects = dialects  # per role: a pair may mix vendors
        self.bus = bus
        self.control = control
        self.ledger = ledger
        self._save = save
        self._log = log_line
        self._request_pause = request_pause
        self._agents: dict[str, Agent] = {}
        self.idle = threading.Event()  # set while no agent turn is in flight
        self.idle.set()
        # Each live session's context after its last turn (None until it has had one).
        self.context: dict[str, ContextUse] = {}
        self.fresh_developer: str | None = None  # why the next Developer session is fresh
        # The latest `rate_limit_event` per role: a rejected one explains the next 429.
        self.rate_limits: dict[str, RateLimitChanged] = {}
        self._remote_refs: RefMap | None = None  # see `remote_refs`
        # role -> the session id an agent is starting on (a CLI that names its own sessions
        # reports another one while it starts)
        self._opening: dict[str, str] = {}

    # ------------------------------------------------------------------ sessions
    def roll_over(self, new_feature: bool) -> None:
        """Between rounds: end a session whose context passed `context_rollover_percent` (and,
        with `session_per_feature`, the Developer's before each new feature), so the CLI never
        has to compact on its own. The fresh Developer session's first prompt carries the
        iteration history (seed 000); the Acceptor's prompts carry everything anyway."""
        limit = self.config.context_rollover_percent
        for role in (DEVELOPER, ACCEPTOR):
            use = self.context.get(role)
            if use is not None and limit is not None and use.percent >= limit:
                self._start_fresh(role, use, f"context at {use.percent:.0f}% of the "
                                             f"{use.window // 1000}k window (limit {limit:g}%)")
        if self.config.session_per_feature and new_feature and \
                self.record.rounds > 0 and self.record.sessions.developer is not None:
            self._start_fresh(DEVELOPER, self.context.get(DEVELOPER),
                              "a new feature (session_per_feature)")

    def _start_fresh(self, role: str, use: ContextUse | None, reason: str) -> None:
        """Note the rollover and forget the session (persisted first), then stop its process;
        the next turn starts a new session, which a restart then resumes."""
        rec = self.record
        rec.rollovers.append(Rollover(
            round=rec.rounds + 1, role=role, tokens=use.tokens if use else 0,
            window=use.window if use else 0, reason=reason,
            old_session=getattr(rec.sessions, role), at=now()))
        setattr(rec.sessions, role, None)
        self.context.pop(role, None)
        if role == DEVELOPER:
            self.fresh_developer = reason
        self._save()
        self.drop(role)
        self._log(f"{role}: fresh session from round {rec.rounds + 1}: {reason}")

    def _agent(self, role: str) -> Agent:
        agent = self._agents.get(role)
        if agent is not None:
            return agent
        sessions = self.record.sessions
        session_id = getattr(sessions, role)
        # The Acceptor's session files are in a HOME its commands (the Developer's code, run
        # as its tests) can write: a session it resumed would take what they appended there
        # for its history and instructions ("answer ACCEPTED"). Its prompts carry everything.
        resume = session_id is not None and role != ACCEPTOR
        if not resume:
            session_id = str(uuid.uuid4())
            setattr(sessions, role, session_id)
            setattr(sessions, f"{role}_model", None)
            self._save()  # the session id is known before the process can write anything
        self._opening[role] = session_id
        self._confined_at[role] = self.branches.value
        try:
            agent = self.make_agent(role, session_id, resume)
        finally:
            del self._opening[role]
        self._agents[role] = agent
        if agent.session_id != session_id:  # a CLI that names its own sessions (codex)
            setattr(sessions, role, agent.session_id)
            self._save()
        return agent

    def _fresh_session(self, role: str, note: str) -> None:
        setattr(self.record.sessions, role, None)
        setattr(self.record.sessions, f"{role}_model", None)
        self.record.notes.append(note)
        self._log(note)
        self.drop(role)

    def went_on(self, role: str) -> bool:
        """Whether `role`'s agent worked after its turn had ended (`AgentProcess.went_on`)."""
        agent = self._agents.get(role)
        return agent is not None and agent.went_on

    def drop(self, role: str) -> None:
        agent = self._agents.pop(role, None)
        if agent is not None:
            agent.stop()

    def stop_all(self) -> None:
        for role in list(self._agents):
            self.drop(role)

    # ------------------------------------------------------------------ turns
    def turn(self, role: str, prompt: str) -> str:
        """One turn, with the seed's failure handling around it.

        A lost session is replaced by a fresh one; a crash restarts the agent on its session
        and retries once; a timeout stops the agent (the next turn resumes its session).
        """
        crashed = False
        faults = FaultPolicy(self.config, self.control.stop, self._log,
                             lambda until, message: self._usage_wait(role, until, message),
                             lambda: self._wait_for_account(role))
        while True:
            self.idle.clear()  # before the stop check: `stop()` waits on it (no lost wake-up)
            refs = None if self.config.allow_push else self.remote_refs()
            try:
                if self.control.stop.is_set():
                    raise Stopped
                if role == DEVELOPER and role in self._agents and \
                        self._confined_at.get(role, 0) < self.branches.value:
                    self._log(f"{role}: restarted on its session, so the sandbox protects "
                              "the milestone branch made since it started")
                    self.drop(role)
                if role in self._agents and (why := self.outdated(role)) is not None:
                    self._log(f"{role}: restarted, so that {why}")
                    self.drop(role)
                agent = self._agent(role)
                if (kept := self.record.limit_wait) is not None:
                    self._wait_kept(kept)
                # Last, right before sending: a limit another pair met meanwhile holds it too.
                if (held := self.accounts[role].holding()) is not None:
                    self._log(f"{role}: waits for the account's usage limit ({held[1]})")
                    self._wait_for_account(role)
                    self._show_wait(None)
                    if not self.control.stop.is_set():
                        self._forget_wait()  # its wait is over (whoever met it)
                if self.control.stop.is_set():  # it came while the agent started (or waited)
                    raise Stopped
                # Unconfined, the agent may be deleting `.anima/` as Anima writes (its `rm
                # -rf` would fail on the new file): the spend so far reaches disk at the end.
                result = agent.send(prompt, self.ledger.write_running if self.confined
                                    else None)
                self._claim(agent)
                if not agent.held_still:
                    self._stop_unheld(role)
                if self.control.stop.is_set():  # an interrupted turn's result: not an answer
                    self.ledger.account(result)  # though spent all the same
                    raise Stopped
            except SessionLost as e:
                self._fresh_session(role, f"{role} session could not be resumed ({e}); "
                                          "started a fresh one")
                continue
            except (TurnTimeout, AgentCrashed) as e:
                if (gone := self._agents.get(role)) is not None:
                    self._claim(gone)
                self.drop(role)
                if self.control.stop.is_set():
                    raise Stopped from e
                if isinstance(e, TurnTimeout):
                    self._log(f"{role} timed out: {e}")
                    raise
                self._log(f"{role} crashed: {e} {e.stderr_tail[-300:]}")
                if crashed:
                    raise
                crashed = True
                continue
            finally:
                self.idle.set()
                if refs is not None:
                    self.check_pushes(role, refs)
            self.ledger.account(result)
            fault = self.dialects[role].classify(result, self.rate_limits.get(role))
            if fault is None:
                return result.text
            if faults.handle(role, fault) is Retry.FRESH_SESSION:
                self._fresh_session(role, f"{role}: the prompt is too long for its session "
                                          f"({fault.message}); started a fresh one")

    def _claim(self, agent: Agent) -> None:
        """What the turns no answer came from spent (interrupted, late) counts too."""
        for result in agent.take_unclaimed():
            self.ledger.account(result)

    def _wait_kept(self, wait: LimitWait) -> None:
        """The record's wait, which a kill cut short: the account is held until its reset
        again, as when the limit was met (one already past is forgotten)."""
        until = wait.until.timestamp()
        if wait.until > now():
            self._usage_wait(wait.role, until, wait.reason)
        else:
            self._forget_wait()

    def _wait_for_account(self, role: str) -> None:
        """Until the account's usage limit resets, or a stop: the record and state.json say
        the reset it waits for (a start after a kill waits for it too), and each later one
        another pair meets meanwhile, whichever pair met the first."""
        held = self.accounts[role].holding()
        while held is not None:
            self._keep_wait(role, *held)
            self._show_wait(held)
            held = self.accounts[role].wait(self.control.stop, held)

    def _keep_wait(self, role: str, until: float, reason: str) -> None:
        """On the record, the wait `role`'s next turn is held for (whichever pair met it)."""
        wait = LimitWait(role=role, until=datetime.fromtimestamp(until, UTC), reason=reason)
        if wait != self.record.limit_wait:
            self.record.limit_wait = wait
            self._save()

    def _forget_wait(self) -> None:
        if self.record.limit_wait is not None:
            self.record.limit_wait = None
            self._save()

    def _show_wait(self, held: tuple[float, str] | None) -> None:
        """state.json says this milestone's next turn waits until `held` (or does not)."""
        if held is None:
            board(self.store).waiting(self.record.id, None)
        else:
            board(self.store).waiting(self.record.id, datetime.fromtimestamp(held[0], UTC),
                                      held[1])

    def _usage_wait(self, role: str, until: float | None, message: str) -> None:
        """The record, state.json, the log, the window and a notification say the loop
        waits (or not); the record keeps a wait a stop ended (the limit still holds)."""
        rec = self.record
        if until is None:
            if message:  # stopped: the account may well still wait
                self._log(message)
            else:
                self._log("the usage limit has reset: sending the prompt again")
                self._forget_wait()
            # Held longer (another pair met it again since), the next turn waits on.
            self._show_wait(held := self.accounts[role].holding())
            if held is not None:
                return  # other pairs still wait for it, and the window says so
        else:
            self._log(message)
            self._keep_wait(role, until, message)
            news = self.accounts[role].hold(until, message)
            self._show_wait(self.accounts[role].holding())  # this limit, or a later one
            if news is None:
                return  # another pair met it first and said so: every pair waits anyway
            if news:  # the same limit met again is not announced again
                self.bus.publish(Notice(rec.id, "waiting", f"{rec.title}: {message}"))
        self.bus.publish(UsageLimitWait(rec.id, until, message))

    def remote_refs(self) -> RefMap:
        """The refs a push could move, as the last check left them (nothing but a push or a
        fetch moves them between two turns), else as they are now."""
        if self._remote_refs is None:
            self._remote_refs = remote_refs(self.root)
        return self._remote_refs

    def _stop_unheld(self, role: str) -> None:
        """What the agent left running could not be held (it forks on and on): it would go
        on writing the tree while it is checked and reviewed. Stopping the agent ends it
        (confined, with the sandbox: everything started in it); it resumes its session next
        turn."""
        what = (f"the {role} left processes running that kept forking faster than they "
                "could be held; its agent was stopped with them (it resumes its session "
                "next turn)")
        self._log(what)
        self.ledger.note(what)
        self.drop(role)

    def _note_refused_writes(self, event: ToolResult) -> None:
        """Writes the sandbox refused the Developer (outside the worktree, another ref): a
        command that goes on after one still succeeds, and only the model reads its output.
        The Acceptor reads only: its test runs' caches are refused by design."""
        refused = dict.fromkeys(line.strip()[:300] for line in event.content.splitlines()
                                if _REFUSED.search(line) and _REMOTE_TRACKING not in line)
        if refused:
            self.ledger.note(f"{event.role}: the sandbox refused a write: " + "; ".join(refused))

    def check_pushes(self, who: str, before: RefMap) -> None:
        """A push the tool rules missed (an agent's, or the checks' running the Developer's
        code): say so in the round's notes and pause after it."""
        moved, self._remote_refs = pushed(self.root, before)
        if not moved:
            return
        what = (f"the {who} pushed although pushing is not allowed (allow_push is off): "
                + "; ".join(moved) + ". Check the remote, then resume.")
        self._request_pause(what)
        self.ledger.note(what)

    def on_event(self, event: object) -> None:
        """What this milestone's agents' events tell the seats and the round in flight (the
        bus carries every running milestone's)."""
        if not isinstance(event, AgentEvent) or event.milestone_id != self.record.id:
            return
        if isinstance(event, ToolUse) and event.role == DEVELOPER and self.ledger.round:
            self.ledger.round.tool_calls += 1
        elif isinstance(event, ContextUsage):
            use = ContextUse(tokens=event.tokens, window=event.window)
            self.context[event.role] = use
            if self.ledger.round is not None:
                self.ledger.round.context[event.role] = use
        elif isinstance(event, SpendSoFar):
            self.ledger.running(event)
        elif isinstance(event, Compacted):
            self._log(f"{event.role}: the CLI compacted its context by itself "
                      f"({event.trigger}){event.sizes()}")
        elif isinstance(event, RateLimitChanged):
            self.rate_limits[event.role] = event
        elif isinstance(event, ApiRetry):
            self._log(f"{event.role}: {event.describe()}")
        elif isinstance(event, SandboxFailure):
            self.ledger.note(f"{event.role}: {event.message}")
        elif isinstance(event, ToolResult) and self.confined and event.role == DEVELOPER:
            self._note_refused_writes(event)
        elif (isinstance(event, SessionStarted) and event.model
              and getattr(self.record.sessions, event.role, None) in (
                  event.session_id, self._opening.get(event.role))):
            # Persisted with the next save; a resume passes it again (2.1.197 resumes on a
            # smaller context window without it: tests/test_agent_process.py).
            setattr(self.record.sessions, f"{event.role}_model", event.model)

    @staticmethod
    def failure(e: AnimaError) -> str:
        if isinstance(e, TurnTimeout):
            return f"{TIMED_OUT}: {e}"
        if isinstance(e, AgentCrashed):
            tail = f" (stderr: {e.stderr_tail.strip()[-200:]})" if e.stderr_tail.strip() else ""
            return f"crashed twice in this round: {e}{tail}"
        return str(e)

    def stop(self, reason: str = "", grace: float = 3.0) -> None:
        """From any thread: end the running turn and leave the loop without recording it.

        The turn is interrupted first, so the CLI ends it properly and its session can be
        resumed; an agent that has not let go of the turn after `grace` seconds is stopped.
        The worker then stops both agents on its way out. Returns within ~2 × grace.
        """
        self.control.stop_reason = reason
        self.control.stop.set()
        for agent in list(self._agents.values()):
            agent.interrupt(timeout=grace)  # returns at once when no turn runs
        if self.idle.wait(grace):
            return
        self._log(f"an agent did not answer the interrupt within {grace:g}s; stopping it")
        # Taken again: one that was starting is among them now, or sees the stop before its
        # turn (`turn` checks it once the agent is in `_agents`).
        for agent in list(self._agents.values()):
            agent.stop(grace=1.0)
