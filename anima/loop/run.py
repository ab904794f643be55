"""The iteration loop of one milestone: an explicit state machine.

`MilestoneRun.run` reads like the M4 seed's pseudocode: Developer prompt → report → git
checks → Acceptor review → ACCEPTED / REJECTED → … → ALL_FEATURES_COMPLETE → final
acceptance. Every phase change and every finished round is written to the milestone record
(atomically) before the next action, so a kill at any instant resumes correctly: a round is
appended to `iterations` only when its verdict is known, and a round in flight is redone.
What a restart finds (wrong branch, dirty tree) is handled by `anima.loop.recovery`.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from anima import procfs
from anima.agents.dialect import Dialect
from anima.config import Config
from anima.errors import (
    AgentCrashed,
    GitStopped,
    InTheWay,
    MilestoneError,
    ProjectError,
    TurnTimeout,
)
from anima.events import (
    ACCEPTOR,
    DEVELOPER,
    CheckFinished,
    CheckStarted,
    EngineError,
    EventBus,
    LogLine,
    MilestoneChanged,
    Notice,
    PhaseChanged,
)
from anima.git import GitRepo
from anima.git.branches import Tips
from anima.git.objects import taking_objects
from anima.git.watch import watching
from anima.guard.restore import RestoringGuard
from anima.guard.turns import TurnGuard
from anima.loop.account import AccountGate
from anima.loop.branch import BranchKeeper, UnreportedWork
from anima.loop.checks import CheckCancelled, display, run_check
from anima.loop.completion import (
    MergeQueue,
    begin_completion,
    finish_completed,
    merge_pending,
    merging,
)
from anima.loop.confinement import BranchEpoch, MilestoneSandbox
from anima.loop.fault_policy import AgentFault, NotLoggedIn
from anima.loop.ledger import Ledger
from anima.loop.limits import LIMITS, REJECTIONS
from anima.loop.phases import STATUS_OF, TRANSITIONS, check_transition
from anima.loop.recovery import recover_milestone
from anima.loop.seats import AgentFactory, RunControl, Seats, Stopped
from anima.loop.state import StateBoard, board, reconcile_state
from anima.loop.worktree import MilestoneWorktree
from anima.phases import PHASE_TEXT, RUNNING, Phase
from anima.store.models import (
    CheckRun,
    FeatureStatus,
    Iteration,
    MilestoneRecord,
    MilestoneStatus,
    RoundKind,
    Verdict,
    Withdrawn,
    now,
)
from anima.store.store import Store
from anima.text.formats import (
    DeveloperReport,
    ReportKind,
    ReviewVerdict,
    parse_developer_report,
    parse_verdict,
)
from anima.text.prompts import DeveloperContext, PromptBuilder, check_outcome, check_passed, render
from anima.text.redact import redact
from anima.text.summarizer import Summarizer

log = logging.getLogger(__name__)


class _ConfigurationProblem(Exception):
    """Internal: `check_command` cannot run at all, or `worktree_setup_command` failed (a
    configuration error, not the Developer's fault): pause without recording the round,
    which is redone on resume."""


class _NotNow(Exception):
    """Internal: a pending milestone's `.md`, read again as it starts, no longer reads, or
    now depends on other milestones: it stays pending, and the queue looks again."""


class MilestoneRun:
    """Drives one milestone until it completes, pauses, fails or is stopped."""

    def __init__(self, *, record: MilestoneRecord, store: Store, repo: GitRepo, config: Config,
                 prompts: PromptBuilder, agents: AgentFactory, bus: EventBus,
                 summarizer: Summarizer, control: RunControl, dialects: Mapping[str, Dialect],
                 sandbox: MilestoneSandbox | None = None,
                 accounts: Mapping[str, AccountGate] | None = None,
                 merge_queue: MergeQueue | None = None,
                 branches: BranchEpoch | None = None) -> None:
        self.record = record
        self.store = store
        #: state.json's list of running milestones, shared with the engine's other runs
        self.board: StateBoard = board(store)
        self.merge_queue = merge_queue or MergeQueue()
        #: a merge round is owed: main moved and the branch conflicts with it in these files
        self._conflicts: list[str] | None = None
        self._conflict_main = ""  # main's commit the merge round must take in
        #: The human's checkout, never switched; `repo` becomes the milestone's worktree.
        self.project = self.repo = repo
        self.worktree = MilestoneWorktree(repo, store.paths, record.id, config, self._log)
        self.sandbox = sandbox or MilestoneSandbox.off()
        self.config = config
        self.prompts = prompts
        self.make_agent = agents
        self.bus = bus
        self.summarizer = summarizer
        self.control = control
        self.phase = Phase.IDLE
        self._recovery_log: str | None = None
        # After a restart, until the first round: look for work the killed round committed
        # and never reported (see `_unreported_round`); set once that round took the
        # recovery round's place.
        self._look_for_unreported = False
        self._recovery_reviewed = False
        self._stopped_in: Phase | None = None  # the phase on disk at a restart
        # Each finished round's copy for the other threads, made once (see `_snapshot`):
        # id -> (the round, its JSON when copied, the copy)
        self._copies: dict[int, tuple[Iteration, str, Iteration]] = {}
        self.ledger = Ledger(record, config, bus, summarizer, self._save, self._log)
        self.seats = Seats(record=record, store=store, root=repo.root, config=config,
                           make_agent=agents, dialects=dialects, bus=bus, control=control,
                           ledger=self.ledger, save=self._save, log_line=self._log,
                           request_pause=self._request_pause, accounts=accounts,
                           branches=branches, confined=self.sandbox.active,
                           outdated=self.sandbox.outdated)
        self._guard = (TurnGuard if self.sandbox.active else RestoringGuard)(
            store.paths, repo, record.id)
        self.branch = BranchKeeper(record=record, repo=repo, guard=self._guard, ledger=self.ledger,
                                   save=self._save, log_line=self._log,
                                   request_pause=self._request_pause, notice=lambda line:
                                   bus.publish(Notice(record.id, "held", line)),
                                   worktree=self.worktree)
        # Pause before the next round, and why (a main an agent moved, a push past the rules).
        self._pause_request: str | None = None
        self._unreadable = ""  # why the `.md` did not read, said once (`_follow_definition`)
        self._detach: list[Callable[[], None]] = [  # until `run` ends
            bus.subscribe(self.seats.on_event), *self._guard.listen(bus.subscribe, store.on_save)]

    # ------------------------------------------------------------------ the loop
    def run(self) -> Phase:
        """The seed's scheduler loop. Returns the phase it ended in. Its git commands are
        watched (anima.git.watch): one that runs long is named in the log, and a stop ends
        one that only reads, as it interrupts a turn."""
        try:
            with watching(self.control.stop, self._log):
                return self._loop()
        except (Stopped, GitStopped):
            why = self.control.stop_reason or "shutdown"
            self.ledger.drop(f"stopped: {why}")
            self._save()
            by = "by you" if why == "user" else "as Anima shuts down"
            self._log(f"stopped {by} during {self.phase}; {self.left_by_stop(why == 'user')}")
            return self.phase
        except _NotNow as e:
            self._log(str(e))
            return self.phase
        except (_ConfigurationProblem, AgentFault, InTheWay) as e:  # not the agent's doing
            phase = self.pause_now(str(e))
            if isinstance(e, NotLoggedIn):  # this machine's set-up: an error, shown as one
                self.bus.publish(EngineError(str(e)))
            return phase
        except Exception as e:
            # A project that cannot be driven at all (dirty tree, no git) is the caller's to
            # report; anything else is this milestone's failure, and the others go on.
            if (self.phase is Phase.IDLE and isinstance(e, ProjectError)) \
                    or Phase.FAILED not in TRANSITIONS[self.phase]:
                raise
            return self._fail(e)
        finally:
            self.merge_queue.withdraw(self.record.id)
            self.seats.stop_all()
            self.ledger.apply_summaries(wait=True)
            for detach in self._detach:
                detach()

    def left_by_stop(self, by_you: bool) -> str:
        """What a stop in the phase the run is in leaves to do (its log line, and `anima
        stop`'s answer): a milestone in the merge queue, or completed, has no round to redo,
        only its merge (a completed one's the engine retries)."""
        if self.phase is Phase.MERGING:
            return (f"no round was in flight: its merge into {self.record.main_branch} is "
                    "tried again on resume")
        if self.phase is not Phase.COMPLETED:
            return "the round is redone on resume"
        if merge_pending(self.record):
            return f"the merge into {self.record.main_branch} is still owed: " + (
                "the running Anima tries it again" if by_you
                else "the next `anima run` or the app finishes it")
        return "nothing is redone; its worktree goes at the next start"

    def _loop(self) -> Phase:
        """`run`'s rounds, until one ends the run (`run` handles how).

        The pause checks (rejections, limits, a pause you asked for) come before each round
        rather than after the verdict: the same thing in a running loop, and a restart right
        after a third rejection then pauses instead of running a fourth round.
        """
        if self.control.stop.is_set():
            return self.phase
        self._begin()
        while True:
            self.ledger.apply_summaries()
            if self.control.stop.is_set():
                return self.phase
            if (gone := self._definition_gone()) is not None:
                return self.pause_now(gone)
            self._follow_definition()
            # Finally accepted work merges first: no limit stands between it and main.
            if not self._ready_to_merge():
                self.merge_queue.withdraw(self.record.id)  # its acceptance no longer stands
            elif (phase := self._merge()) is not None:
                return phase
            if (reason := self._pause_reason()) is not None:
                return self.pause_now(reason)
            self.seats.roll_over(new_feature=self._next_kind() is RoundKind.FEATURE)
            report = self._developer_round()
            if report is None:  # rejected before review (git check, timeout, unreadable)
                continue
            if report.kind is ReportKind.ALL_COMPLETE:
                if self._final_acceptance(report).accepted and \
                        (phase := self._complete()) is not None:
                    return phase
                continue  # final rejection: back to the Developer, not counted
            self._review(report)  # ACCEPTED or REJECTED, recorded with its counters

    # ------------------------------------------------------------------ phases
    def enter(self, target: Phase, reason: str = "", deadline: float | None = None) -> None:
        """Persist the new phase (and the status that goes with it), then announce it, before
        its log line: the headless output names the milestone a line is about by whether
        another one runs (anima.cli.printer)."""
        check_transition(self.phase, target)
        previous, self.phase = self.phase, target
        self.record.phase = target
        if (status := STATUS_OF.get(target)) is not None:
            if status is not MilestoneStatus.IN_PROGRESS:
                # The record is the human's from this write on (a resume, an approve may
                # follow at once): what the run still had to write goes in it, never after.
                self.ledger.apply_summaries(wait=True, persist=False)
            self.record.status = status
        self._save()
        if target in RUNNING:
            self.board.awake(self.record, activity=f"{PHASE_TEXT[target]}: {reason}"
                             if reason else PHASE_TEXT[target])
        self.bus.publish(PhaseChanged(self.record.id, target, previous, reason,
                                      deadline))
        self._log(f"phase {previous} → {target}" + (f": {reason}" if reason else ""))

    def _begin(self) -> None:
        """The seed's "自动触发" for a new milestone, or its "重启恢复" for one in progress."""
        rec = self.record
        self.ledger.settle_in_flight()
        if rec.status is MilestoneStatus.PENDING:
            self._retake_definition()
        if rec.status is MilestoneStatus.PENDING or rec.base_commit is None:
            self._start_branch()
        else:
            self._enter_worktree()
            self.branch.after_restart()
            self._recover()
            self._look_for_unreported = self._recovery_log is not None
        self._setup_worktree()
        # Set while the loop runs; cleared when it leaves for a human (pause, review,
        # completion). Any other ending — a kill, a shutdown — resumes with recovery context.
        rec.interrupted = True
        self.board.awake(rec, worktree=self.worktree.path.relative_to(self.project.root)
                         .as_posix())
        self._save()
        if (tip := rec.accepted_tip) is not None and tip != self.branch.head():
            # Finally accepted, and commits on top that no review saw (a merge round that was
            # rejected, or cut short by a kill): a merge round goes on with them.
            self._owe_merge_round(tip)

    def _retake_definition(self) -> None:
        """The `.md` as it is now, which the human may have edited since the queue read it."""
        try:
            changed = self.store.retake_definition(
                self.record, max_iterations=self.config.max_iterations_per_milestone,
                requires_human_review=self.config.requires_human_review)
        except MilestoneError as e:
            raise _NotNow(f"not started: {e}") from e
        if changed:
            self._log(f"{', '.join(changed)} taken from its definition and the config as they "
                      "are now (the record said otherwise)")
        if "depends_on" in changed and self.record.depends_on:
            self._save()
            raise _NotNow(f"not started: it now depends on {', '.join(self.record.depends_on)}")

    def _follow_definition(self) -> None:
        """Before each round: what you changed in the `.md` while the milestone ran counts
        from this round on. A file that does not read (saved half edited) is said once; the
        milestone goes on with what it last read."""
        try:
            changed = self.store.retake_definition(
                self.record, max_iterations=self.record.max_iterations,
                requires_human_review=self.config.requires_human_review)
        except MilestoneError as e:
            if str(e) != self._unreadable:
                self._unreadable = str(e)
                self._log(f"{e}; going on with the definition as it last read")
            return
        self._unreadable = ""
        if not changed:
            return
        self._log(f"{', '.join(changed)} taken from "
                  f"{self.store.paths.milestone_md(self.record.id).name}, as you edited it")
        if set(changed) - {"title"} and self.record.accepted_tip is not None:
            for it in self.record.standing:  # it judged what the milestone no longer is
                if it.kind is RoundKind.FINAL and it.verdict is Verdict.ACCEPTED:
                    it.withdrawn = Withdrawn.REDEFINED
            self._log("its final acceptance judged the milestone as it was defined before "
                      "your edit: it is asked again once the Developer is done")
        self._save()

    def _start_branch(self) -> None:
        """Create `milestone/<id>` from main in the milestone's own worktree. Also finishes a
        start cut short (by a kill, or a pause before it: no base commit yet): the branch and
        the worktree are reused if they exist, unless the branch holds commits main lacks,
        which no round of this milestone made (no agent ran before the base commit)."""
        rec = self.record
        main = self.project.main_branch(self.config.main_branch)
        self.enter(Phase.STARTING, f"creating milestone/{rec.id} from {main} in its worktree")
        rec.branch_name = f"milestone/{rec.id}"
        rec.main_branch = main
        rec.main_head = self.project.branch_head(main)
        rec.base_commit = self._enter_worktree(never_started=True)
        if self.sandbox.active:  # the other milestones' Developers are confined again
            self.seats.branches.bump()
        rec.started_at = rec.started_at or now()
        self._log(f"branch {rec.branch_name} at {rec.base_commit[:7]}, in "
                  f"{self.repo.root.relative_to(self.project.root)}")

    def _enter_worktree(self, never_started: bool = False) -> str:
        """From here on every git command, agent and check of the milestone works in its
        worktree (made, or re-attached after a crash); returns the base commit."""
        rec = self.record
        assert rec.branch_name and rec.main_branch
        self.repo = self.worktree.open(rec.branch_name, rec.main_branch, never_started)
        self.branch.repo = self._guard.repo = self.repo
        self.seats.root = self.repo.root
        return self.worktree.base

    def _setup_worktree(self) -> None:
        """`worktree_setup_command`, once in a new worktree, before the first Developer turn;
        failing or not starting, the milestone pauses as a configuration error."""
        try:
            result = self.worktree.setup(self.control.stop, self.sandbox.confine("setup"))
        except CheckCancelled as e:
            raise Stopped from e
        if result is not None and not result.passed:
            raise _ConfigurationProblem(
                f"worktree_setup_command {result.outcome} in "
                f"{self.worktree.path.relative_to(self.project.root)}; fix it in "
                ".anima/config.json (or the project), then resume")

    def _recover(self) -> None:
        """Continue an in_progress milestone: right branch, clean tree, recovery context for
        the first Developer prompt (anima.loop.recovery does the work)."""
        rec = self.record
        on_disk = self._stopped_in = rec.phase
        # A phase that was active when Anima stopped is over; a human's phase is the origin.
        self.phase = Phase.IDLE if on_disk in RUNNING else on_disk
        why = "interrupted while running; continuing where it stopped" if rec.interrupted \
            else f"resumed after {on_disk}"
        self.enter(Phase.RECOVERING, why)
        self._recovery_log = recover_milestone(
            rec, self.repo, ask_developer=lambda prompt: self._turn(DEVELOPER, prompt),
            log=self._log)

    # ------------------------------------------------------------------ Developer
    def _developer_round(self) -> DeveloperReport | None:
        """One Developer turn. Returns its report, or None when the round was rejected."""
        rec = self.record
        last = rec.to_fix
        fix = last is not None
        kind = self._next_kind()
        self.branch.back_on_branch()
        self.branch.follow_main()
        if self._look_for_unreported:
            self._look_for_unreported = False
            if (work := self.branch.unreported_work()) is not None:
                return self._unreported_round(work)
        rnd = self.ledger.open(kind, self.branch.head())
        note = next((n for n in rec.human_notes if not n.delivered), None)
        fresh = self.seats.fresh_developer
        ctx = DeveloperContext(fix_reason=last.reason if fix and last else None,
                               failed_check=last.check if fix and last and last.check
                               and not last.check.passed else None,
                               final_rejection=bool(fix and last and last.kind is RoundKind.FINAL),
                               human_note=note.text if note else None,
                               recovery_log=self._recovery_log,
                               fresh_session=fresh,
                               commit_log=self.repo.oneline_log(rec.base_commit or "",
                                                                rec.branch_name or "HEAD")
                               if fresh is not None else "",
                               merge_conflicts=self._conflicts
                               if kind is RoundKind.MERGE else None)
        self.enter(Phase.DEVELOPER, f"round {rnd.round} ({kind})",
                   deadline=time.time() + self.config.agent_timeout_seconds)
        try:
            text = self._turn(DEVELOPER, self.prompts.developer(rec, ctx), self.branch.tips())
        except (TurnTimeout, AgentCrashed) as e:
            self._reject(f"Developer {self.seats.failure(e)}")
            return None
        if note is not None:
            note.delivered = True
        self._recovery_log = self.seats.fresh_developer = None
        report = parse_developer_report(text)
        if report is None:
            try:
                text = self._turn(DEVELOPER, render("developer_restate", round=rnd.round),
                                  self.branch.tips())
            except (TurnTimeout, AgentCrashed) as e:
                self._reject(f"Developer {self.seats.failure(e)}")
                return None
            report = parse_developer_report(text)
        if report is None:
            self._reject("unreadable report: the Developer's reply did not contain an "
                         "Implementation Report or ALL_FEATURES_COMPLETE, even when asked "
                         "to restate it")
            return None
        if kind is RoundKind.MERGE:  # whatever it calls it, a merge round reports its merge
            report = dataclasses.replace(report, kind=ReportKind.IMPLEMENTATION)
        return self._verified(report)

    def _verified(self, report: DeveloperReport) -> DeveloperReport | None:
        """The git checks and the project's checks on a report, before any Acceptor token is
        spent: the report back, or None when the round was rejected."""
        rnd = self.ledger.round
        assert rnd is not None
        rnd.report = report.text
        # first the trees: git can neither switch to nor commit on a tip holding one it refuses
        if (refused := self.branch.trees_refused() or self.branch.history_rewritten()
                ) is not None:
            self._reject(refused)
            return None
        self.branch.back_on_branch(fresh=False)
        leftover = self.branch.commit_round_work(report)
        if (refused := (leftover and self.branch.trees_refused(f"{leftover}^"))
                or self.branch.secrets_committed()) is not None:
            self._reject(refused)
            return None
        if self.branch.guarded:
            self._reject("")
            return None
        if report.kind is ReportKind.ALL_COMPLETE:
            return report
        if (wrong := self.branch.check_commit(report, leftover)
                or self._unmerged_main()) is not None:
            self._reject(wrong)
            return None
        if self._checks_failed(report):
            return None
        return report

    def _unreported_round(self, work: UnreportedWork) -> DeveloperReport | None:
        """The first round after a restart, when the killed round had committed work and no
        review saw it (Anima died before the Developer reported, or before the verdict):
        that work is checked and reviewed as a round of its own, for the feature it was for,
        before the Developer is asked for anything new. Otherwise a Developer told not to
        redo committed work goes on to the next feature, and the killed round's commits
        would reach main with no review of their own and their feature still pending."""
        self._recovery_reviewed = True  # this is the recovery round; the Developer's is not
        rnd = self.ledger.open(RoundKind.RECOVERY, work.since)
        count = f"{len(work.commits)} commit{'s' if len(work.commits) != 1 else ''}"
        # Killed during the review, the Developer had reported (its report went with Anima).
        reviewed = self._stopped_in in (Phase.ACCEPTOR, Phase.FINAL_ACCEPTANCE)
        never = "never judged" if reviewed else "never reported"
        self.enter(Phase.DEVELOPER, f"round {rnd.round} ({rnd.kind}): the {count} made "
                   f"before the restart, {never}, go to review as {work.feature}")
        what = (f"(Anima was restarted during its review of this work for {work.feature}, "
                "before a verdict; the Developer's report went with it." if reviewed else
                f"(No report: Anima was restarted after the Developer had committed this "
                f"work for {work.feature} and before it reported.")
        text = (f"{what} Anima sends the {count} made since {work.since[:7]} to review as "
                f"they are; judge them against {work.feature}.)")
        return self._verified(DeveloperReport(
            kind=ReportKind.IMPLEMENTATION, text=text, round=rnd.round, feature=work.feature,
            commit=work.tip))

    def _next_kind(self) -> RoundKind:
        if self._conflicts is not None:
            return RoundKind.MERGE
        if self._recovery_log is not None and not self._recovery_reviewed:
            return RoundKind.RECOVERY
        return RoundKind.FIX if self.record.to_fix is not None else RoundKind.FEATURE

    # ------------------------------------------------------------------ the project's checks
    def _checks_failed(self, report: DeveloperReport) -> bool:
        """Run `check_command` on the round's commit; a failure rejects the round before any
        Acceptor token is spent. False also when no check is configured."""
        rnd = self.ledger.round
        command = self.config.check_command
        if command is None or rnd is None:
            return False
        shown, timeout = redact(display(command)), self.config.check_timeout_seconds
        self._log(f"checks: running `{shown}` on {(rnd.commit or 'HEAD')[:7]}")
        self.bus.publish(CheckStarted(self.record.id, rnd.round, shown, time.time(), timeout))
        snapshot = self.branch.snapshot("the checks")
        refs = None if self.config.allow_push else self.seats.remote_refs()
        try:
            result = run_check(command, self.repo.root, timeout=timeout, cancel=self.control.stop,
                               marker=procfs.agent_marker(self.project.root, self.record.id,
                                                          "checks"),
                               confine=self.sandbox.confine("checks"),
                               keep=self.config.pass_env)
        except CheckCancelled as e:
            raise Stopped from e
        finally:
            self._developer_went_on("the checks")
            self._worktree_still_there("the checks")
            self.branch.undo_changes(snapshot, "the checks")
            if refs is not None:  # they run the Developer's code
                self.seats.check_pushes("checks", refs)
        self.bus.publish(CheckFinished(self.record.id, rnd.round, shown, result.passed,
                                       result.outcome, result.tail))
        self._log(f"checks: `{shown}` {result.outcome}"
                  + ("" if result.passed or not result.tail else "\n" + result.tail))
        if result.error is not None:
            raise _ConfigurationProblem(f"checks could not start: {result.error}; fix "
                                     "check_command in .anima/config.json, then resume")
        claim = None if result.passed else report.claimed_tests_passed()
        rnd.check = check = CheckRun(
            command=shown, passed=result.passed, exit_code=result.exit_code,
            timed_out=result.timed_out, duration_seconds=round(result.duration, 2),
            tail=result.tail, report_claim=claim)
        if check.passed and not self.branch.guarded:  # guarded: the checks moved main
            return False
        reason = "" if check.passed else render(
            "check_rejection", command=shown, outcome=check_outcome(check)).strip()
        if claim is not None:
            reason += " " + render("check_false_claim", claim=claim).strip()
        self._reject(reason)
        return True

    # ------------------------------------------------------------------ Acceptor
    def _review(self, report: DeveloperReport) -> None:
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None and rnd.commit is not None
        self.enter(Phase.ACCEPTOR, f"reviewing {rnd.commit[:7]}",
                   deadline=time.time() + self.config.agent_timeout_seconds)
        # Everything since the last accepted commit, not only this round's own commits.
        since, reviewed = self.branch.review_range(rnd.commit)
        commits = "\n".join(f"- {h[:7]} {s}" for h, s in reviewed)
        if rnd.kind is RoundKind.MERGE:
            prompt = self.prompts.acceptor_merge(
                rec, report=report.text, commit=rnd.commit, previous_head=since,
                commits=commits, conflicts=self._conflicts or [], checks=self._checks_text())
        else:
            prompt = self.prompts.acceptor_review(rec, report=report.text, feature=rnd.feature,
                                                  commit=rnd.commit, previous_head=since,
                                                  commits=commits, checks=self._checks_text())
        verdict = self._acceptor_verdict(prompt)
        if verdict is None:
            return
        self.ledger.finish(verdict)
        if verdict.accepted and rnd.kind is RoundKind.MERGE:
            self._conflicts = None  # the resolution is reviewed: the queue tries again
            self._enlist()

    def _final_acceptance(self, report: DeveloperReport) -> ReviewVerdict:
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None
        rnd.kind = RoundKind.FINAL
        rnd.commit = self.branch.final_tip()
        if self._checks_failed(report):
            return ReviewVerdict(accepted=False, reason=rec.iterations[-1].reason)
        self.enter(Phase.FINAL_ACCEPTANCE, "the Developer reports ALL_FEATURES_COMPLETE",
                   deadline=time.time() + self.config.agent_timeout_seconds)
        commits = self.repo.oneline_log(rec.base_commit or "", rec.branch_name or "HEAD")
        verdict = self._acceptor_verdict(self.prompts.acceptor_final(
            rec, report=report.text, commits=commits, checks=self._checks_text()))
        if verdict is None:
            return ReviewVerdict(accepted=False, reason=rec.iterations[-1].reason)
        self.ledger.finish(verdict, persist=not verdict.accepted)  # accepted: `_complete` writes it
        return verdict

    def _checks_text(self) -> str:
        check = self.ledger.round.check if self.ledger.round is not None else None
        return check_passed(check) if check is not None else ""

    def _acceptor_verdict(self, prompt: str) -> ReviewVerdict | None:
        """Ask the Acceptor, undo anything it changed, read its verdict (restating once).
        None: the round is already recorded as rejected (timeout, crash, unreadable).
        Confined, the Acceptor can change nothing (its tree and git are read-only to it):
        there is nothing to take note of before, or to undo after."""
        snapshot = None if self.sandbox.active else self.branch.snapshot("the Acceptor")
        try:
            try:
                verdict = parse_verdict(self._turn(ACCEPTOR, prompt))
                if verdict is None:
                    verdict = parse_verdict(self._turn(ACCEPTOR, render("acceptor_restate")))
            finally:
                self._developer_went_on("the review")
                if snapshot is not None:
                    self.branch.undo_changes(snapshot, "the Acceptor")
        except (TurnTimeout, AgentCrashed) as e:
            self._reject(f"Acceptor {self.seats.failure(e)}")
            return None
        if verdict is None or self.branch.guarded:  # guarded: the Acceptor moved main
            self._reject("its verdict is not taken" if verdict else "unreadable verdict: the "
                         "Acceptor's reply had neither ACCEPTED nor REJECTED, even when asked "
                         "to restate it")
            return None
        return verdict

    # ------------------------------------------------------------------ verdicts
    def _reject(self, reason: str) -> None:
        """Record a rejection; what the Developer's turns did that they may not comes first."""
        guarded = self.branch.take_guarded()
        self.ledger.finish(ReviewVerdict(accepted=False,
                                   reason="; ".join(r for r in [*guarded, reason] if r)))

    # ------------------------------------------------------------------ endings
    def _definition_gone(self) -> str | None:
        """A milestone never goes on without its definition: you took the `.md` away (to
        stop it, or to rework it) while it ran."""
        md = self.store.paths.milestone_md(self.record.id)
        if md.is_file():
            return None
        return (f"{md.relative_to(self.store.paths.root)} is gone, and a milestone does not go "
                "on without its definition: put the file back, then resume it (or abort it)")

    def _pause_reason(self) -> str | None:
        """Why the loop must pause before another round (the seed's three stops, a main an
        agent moved, a push that got past the tool rules), or None."""
        if (request := self._pause_request) is not None:
            self._pause_request = None
            return request
        for limit in LIMITS:
            if (reason := limit.reached(self.record, self.config)) is not None:
                if limit is REJECTIONS and (last := self.record.to_fix) is not None and \
                        (f := self.record.feature(last.feature)):
                    f.status = FeatureStatus.BLOCKED
                return reason
        if self.control.pause_after_round.is_set():
            self.control.pause_after_round.clear()
            return "paused by you after the round"
        return None

    def pause_now(self, reason: str) -> Phase:
        """Paused for you: the round in flight is dropped and redone on resume, and what was
        spent since the last round joins the totals now (an abort may follow)."""
        reason = redact(reason)  # it may quote git's output, not only redacted agent text
        self.ledger.drop(reason)
        self.record.pause_reason = reason
        self.record.interrupted = False
        self.enter(Phase.PAUSED, reason)
        self.board.leave(self.record.id)
        self.bus.publish(Notice(self.record.id, "paused", f"{self.record.title}: {reason}"))
        return self.phase

    def _fail(self, error: Exception) -> Phase:
        """`failed`, with the error in the record, the log (with its traceback in
        .anima/logs/anima.log) and the window; its worktree stays as it is. `anima resume`
        retries it (recovery, then the next round)."""
        rec = self.record
        log.error("milestone %s failed during %s", rec.id, self.phase, exc_info=error)
        text = redact(f"{type(error).__name__}: {error}")
        self.ledger.drop(f"failed: {text}")
        rec.error = text
        rec.notes.append(f"failed during {self.phase}: {text}")
        self.enter(Phase.FAILED, f"unexpected error: {text}")
        self._log("details in .anima/logs/anima.log; `anima resume` retries the milestone")
        reconcile_state(self.store, self.store.load_records())
        self.bus.publish(Notice(rec.id, "failed", f"{rec.title} failed: {text}"))
        return self.phase

    def _complete(self) -> Phase | None:
        """The accepted final round goes to disk in the same write as the new phase (awaiting
        your review, or merging): a kill on either side of it never records the acceptance
        twice. None: the milestone waits its turn to merge (the loop's next step)."""
        rec = self.record
        if rec.requires_human_review:
            rec.interrupted = False
            self.enter(Phase.AWAITING_REVIEW, "final acceptance passed; waiting for your review")
            self.board.leave(rec.id)
            self.bus.publish(Notice(rec.id, "awaiting_review",
                                    f"{rec.title} passed final acceptance: review it"))
            return self.phase
        self._enlist()
        self.enter(Phase.MERGING, "final acceptance passed: its turn to merge into "
                                  f"{rec.main_branch} comes after those accepted earlier")
        return None

    def _ready_to_merge(self) -> bool:
        """Finally accepted (and any merge round since reviewed), the branch where the
        review left it: its turn in the merge queue comes next."""
        tip = self.record.accepted_tip
        return tip is not None and self._conflicts is None and tip == self.branch.head()

    def _merge(self) -> Phase | None:
        """The merge queue: wait for the milestones accepted earlier, then main takes the
        branch (completed). When it conflicts with what main got meanwhile, None: the next
        round is a merge round, reviewed like any other, and then the queue again."""
        rec = self.record
        accepted = self._last_accepted()
        if self.phase is not Phase.MERGING:
            self.enter(Phase.MERGING, f"its turn to merge into {rec.main_branch} comes after "
                                      "those accepted earlier")
        with self.merge_queue.turn(rec.id, accepted.ended_at, self.control.stop) as ours:
            if not ours:
                raise Stopped
            main = rec.main_branch or ""
            with merging():  # no other merge between the check and this one
                if self.config.merge_on_complete and \
                        self._owe_merge_round(accepted.commit or ""):
                    self._log(f"{rec.branch_name} no longer merges into {main} cleanly "
                              f"(conflicts in {', '.join(self._conflicts or [])}): the "
                              f"Developer merges {main} into it in a merge round, reviewed "
                              "before the merge is tried again")
                    return None
                # The completion and the intent to merge go to disk before git merges.
                rec.interrupted = False
                begin_completion(rec, self.config)
                self.enter(Phase.COMPLETED, "final acceptance passed")
                self.board.leave(rec.id)
                finish_completed(rec, self.store, self.project, self.config, self.bus)
        return self.phase

    def _last_accepted(self) -> Iteration:
        """The acceptance that lets the branch merge: when it came is its place in the queue."""
        return next(it for it in reversed(self.record.standing)
                    if it.verdict is Verdict.ACCEPTED)

    def _enlist(self) -> None:
        """Accepted just now: its place in the merge queue is taken at once, not when the
        loop gets to its turn (one accepted after it could get there first)."""
        self.merge_queue.enlist(self.record.id, self._last_accepted().ended_at)

    def _owe_merge_round(self, tip: str) -> bool:
        """Whether `tip` conflicts with main as it is now; if so (or when `tip` is not the
        branch's tip: a merge round was cut short or rejected), the next round is a merge
        round, which must take in main's commit as read here."""
        main = self.record.main_branch or ""
        self._conflict_main = self.project.branch_head(main)
        conflicts = self.project.merge_conflicts(tip, main)
        if conflicts or tip != self.branch.head():
            self._conflicts = conflicts
        return bool(conflicts)

    def _unmerged_main(self) -> str | None:
        """A merge round's commit must hold main as the round found it: otherwise nothing
        was merged (main moving again meanwhile is the merge queue's to find)."""
        rnd, main = self.ledger.round, self.record.main_branch
        if rnd is None or rnd.kind is not RoundKind.MERGE or not main or not rnd.commit:
            return None
        tip = self._conflict_main or self.project.branch_head(main)
        if self.repo.is_ancestor(tip, rnd.commit):
            return None
        return (f"the merge round's commit {rnd.commit[:7]} does not contain {tip[:7]}, "
                f"{main}'s commit when the round began: merge {main} into "
                f"{self.record.branch_name} (`git merge {main}`), resolve the conflicts and "
                "commit the merge")

    def _turn(self, role: str, prompt: str, tips: Tips | None = None) -> str:
        """One turn; a Developer's is guarded (see anima.guard). `tips`: the refs as just
        read (none: the guard reads them)."""
        if role != DEVELOPER:
            try:
                return self._seated_turn(role, prompt)
            finally:
                self._worktree_still_there(f"the {role}'s turn")
        self._guard.begin(self.record.main_branch or self.repo.main_branch(
            self.config.main_branch), tips)
        try:
            with taking_objects(self.store.paths.agent_objects(self.record.id),
                                self.project.common_dir):
                return self._seated_turn(role, prompt)
        finally:
            self._worktree_still_there("the Developer's turn")
            settled = self.branch.settle_git()
            self.branch.after_developer_turn(self._guard.end(), settled)

    def _seated_turn(self, role: str, prompt: str) -> str:
        """The agent's answer. With its worktree gone from under it (its CLI dies without a
        folder to work in, and a restart cannot be confined to one) the turn ends as a
        crash, and `_worktree_still_there` makes the worktree again."""
        try:
            return self.seats.turn(role, prompt)
        except (Stopped, TurnTimeout, AgentCrashed):
            raise
        except Exception as e:
            if (self.worktree.path / ".git").exists():
                raise
            raise AgentCrashed(f"{role} could not go on: its worktree was deleted") from e

    def _developer_went_on(self, during: str) -> None:
        """A Developer that works on after its turn ended (a sub-agent it started and left
        running, which nothing holds inside codex's own process, or a turn ended on a result
        its CLI did not give: one of its tools can write to the CLI's output): the tree may
        have changed while `during` looked at it. The Developer is stopped (it resumes its
        session next turn) and the round rejected."""
        if not self.seats.went_on(DEVELOPER):
            return
        self.seats.drop(DEVELOPER)
        self.branch.settle()
        problem = (f"the Developer went on working after its turn had ended, during {during} "
                   "(a sub-agent it started and did not wait for, or a result one of its tools "
                   "wrote that ended the turn early), so the tree may have changed while it "
                   "was looked at; Anima stopped it: wait for your sub-agents before you "
                   "report")
        self._log(problem)
        self.branch.guarded.append(problem)

    def _worktree_still_there(self, during: str) -> None:
        """Without the sandbox an agent (or the checks) can delete the worktree (`rm -rf
        .anima`): it is made again from the branch, and the round is rejected for what was
        lost with it."""
        if (self.worktree.path / ".git").exists():
            return
        self._enter_worktree()
        problem = (f"the milestone's worktree was deleted during {during}, with whatever was "
                   f"not committed in it; Anima made it again from {self.record.branch_name}")
        self._log(problem)
        self.branch.guarded.append(problem)

    def admit_definition(self, md: Path, content: bytes) -> None:
        """From the window's thread: the human adds `md`; it is not an agent's arrival."""
        self._guard.admit(md.relative_to(self.store.paths.root).as_posix(), content)

    def stop(self, reason: str = "", grace: float = 3.0) -> None:
        """From any thread: end the running turn and leave the loop without recording it."""
        self.seats.stop(reason, grace)

    def _request_pause(self, reason: str) -> None:
        """Pause before the next round (a push that got past the tool rules)."""
        self._pause_request = reason

    # ------------------------------------------------------------------ persistence
    def _save(self) -> None:
        self.store.save_record(self.record)
        self.bus.publish(MilestoneChanged(self._snapshot()))

    def _snapshot(self) -> MilestoneRecord:
        """A deep copy of the record for the other threads, whose cost does not grow with
        the rounds: each round is copied once and its copy reused while the round is as it
        was (a summary arriving changes it), by handing those copies to `deepcopy`'s memo.
        Nothing that receives a record changes it."""
        memo: dict[int, object] = {}
        copies: dict[int, tuple[Iteration, str, Iteration]] = {}
        for it in self.record.iterations:
            now_json = it.model_dump_json()
            kept = self._copies.get(id(it))
            if kept is None or kept[0] is not it or kept[1] != now_json:
                kept = (it, now_json, it.model_copy(deep=True))
            copies[id(it)] = kept
            memo[id(it)] = kept[2]
        self._copies = copies
        return copy.deepcopy(self.record, memo)

    def _log(self, text: str) -> None:
        self.bus.publish(LogLine(self.record.id, text))

