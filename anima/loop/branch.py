"""The milestone branch around a Developer round: back on it before the round, main followed
when someone else moved it, the reported commit verified (git is the truth), accepted history
kept append-only, and what a Developer turn may not do (the human's definitions, main) undone
and turned into the round's rejection."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable

from pydantic import ValidationError

from anima.atomic import read_regular, write_model_atomic
from anima.errors import GitError
from anima.git import GitRepo, TreeSnapshot
from anima.git.locks import clear_stale_locks, wait_for_git
from anima.guard import TurnFindings, TurnGuard, TurnStart, describe_held, put_back
from anima.loop.ledger import Ledger
from anima.store.models import FeatureStatus, MilestoneRecord, RoundKind, Verdict
from anima.text.formats import DeveloperReport

# A git the agent left running in the background gets this long to finish before Anima's.
_GIT_WAIT = 5.0


class ReviewStart(TurnStart):
    """`.anima/review_guard.json`: a kill during a review or a check run still tells main the
    reviewer moved from main someone else moved."""

    who: str


class BranchKeeper:
    """The git side of a round; the loop turns what it finds into rejections and pauses."""

    def __init__(self, *, record: MilestoneRecord, repo: GitRepo, guard: TurnGuard,
                 ledger: Ledger, save: Callable[[], None], log_line: Callable[[str], None],
                 request_pause: Callable[[str], None], notice: Callable[[str], None]) -> None:
        self.record = record
        self.repo = repo
        self.guard = guard
        self.ledger = ledger
        self._save = save
        self._log = log_line
        self._request_pause = request_pause
        self._notice = notice
        # What the Developer's turns did that they may not: the round is rejected for it.
        self.guarded: list[str] = []
        self._review_began: tuple[float, str] = (0.0, "")  # (time, main's tip): see snapshot

    def take_guarded(self) -> list[str]:
        """The problems found since the last rejection, which then starts with them."""
        guarded, self.guarded = self.guarded, []
        return guarded

    def back_on_branch(self) -> None:
        """The Developer has a shell: if it left the milestone branch, return to it, before a
        round and before its work is checked, tested and reviewed (which happen on the branch,
        never on wherever the Developer's tree was). Uncommitted changes git will not carry
        over are stashed under a recorded name."""
        branch = self.record.branch_name
        current = self.repo.current_branch()
        if not branch or current == branch:
            return
        if not self.repo.branch_exists(branch):
            self._recreate(branch)
        where = current or f"a detached HEAD at {(self.repo.head() or '?')[:7]}"
        try:
            self.repo.switch(branch)
            note = f"the tree was on {where}; back on {branch}"
        except GitError:
            name = f"anima-{self.record.id}-left-on-{current or 'detached-head'}"
            if (stash := self.repo.stash_all(name)) is None:
                raise
            self.repo.switch(branch)
            note = (f"the tree was on {where}, with uncommitted changes that could not come "
                    f"along; they are stashed as {stash[:7]} ({name}); back on {branch}")
        self._note([note])

    def _recreate(self, branch: str) -> None:
        """The milestone branch deleted (only a shell in the project can): back where the
        round began, or at the last accepted commit; a round in flight is rejected for it."""
        rnd = self.ledger.round
        at = (rnd.previous_head if rnd is not None else None) or \
            (self.accepted_commits() or [self.record.base_commit or ""])[-1]
        self.repo.keep_ref(f"refs/heads/{branch}", at)
        problem = f"{branch} was deleted; Anima recreated it at {at[:7]}"
        self._log(problem)
        if rnd is not None:
            self.guarded.append(problem)

    def _commit_leftovers(self, what: str) -> str | None:
        """Every round's work is committed: what the Developer left uncommitted, Anima
        commits on the milestone branch (and says so)."""
        rnd = self.ledger.round
        assert rnd is not None
        leftover = self.repo.commit_leftovers(
            f"chore(anima): commit uncommitted work of round {rnd.round}" + what)
        if leftover:
            rnd.auto_committed = True
            self._note([f"Anima committed the Developer's uncommitted changes as "
                        f"{leftover[:7]}"])
        return leftover

    def _new_this_round(self, commit: str) -> bool:
        rnd = self.ledger.round
        assert rnd is not None
        return commit != rnd.previous_head and (
            not rnd.previous_head or self.repo.is_ancestor(rnd.previous_head, commit))

    def final_tip(self) -> str | None:
        """What the final acceptance judges is what gets merged: the milestone branch's
        tip, with the Developer's uncommitted work committed."""
        self._commit_leftovers(" (final)")
        return self.repo.resolve(f"refs/heads/{self.record.branch_name}")

    def _unreported_commit(self, named: str | None) -> str | None:
        """A report without a Commit field, or naming a hash that does not exist (a model's
        hallucination): the newest commit made on the branch this round, if any."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None
        tip = self.repo.resolve(f"refs/heads/{rec.branch_name}")
        if tip is None or tip == rnd.previous_head:
            return None
        named = f"{named[:12]}, which does not exist" if named else "no commit"
        rnd.notes.append(f"the report named {named}; reviewing {tip[:7]}, the newest of the "
                         f"commits made on {rec.branch_name} this round")
        self._log(rnd.notes[-1])
        return tip

    def accepted_commits(self) -> list[str]:
        """The commits of the accepted feature rounds, oldest first."""
        return list(dict.fromkeys(it.commit for it in self.record.iterations
                                  if it.verdict is Verdict.ACCEPTED and it.commit
                                  and it.kind is not RoundKind.FINAL))

    def history_rewritten(self) -> str | None:
        """Accepted history is append-only: if an accepted commit left the branch (amend,
        reset, rebase), put the branch back to the last accepted commit, keeping what the
        Developer had under a ref, and say why the round is rejected."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None and rec.branch_name
        accepted = self.accepted_commits()
        tip = self.repo.resolve(f"refs/heads/{rec.branch_name}")
        missing = [c for c in accepted if tip is None or not self.repo.is_ancestor(c, tip)]
        if not missing:
            return None
        if self.repo.current_branch() == rec.branch_name:
            self.repo.commit_leftovers(f"chore(anima): uncommitted work of round {rnd.round}, "
                                       "kept before the branch is put back")
            tip = self.repo.head()
        ref = f"refs/anima/rewritten/{rec.id}/{rnd.round}"
        if tip is not None:
            self.repo.keep_ref(ref, tip)
        last = accepted[-1]
        self.repo.reset_branch(rec.branch_name, last)
        gone = ", ".join(c[:7] for c in missing)
        note = (f"history was rewritten: accepted commit(s) {gone} are no longer on "
                f"{rec.branch_name}; Anima put {rec.branch_name} back to {last[:7]}, the last "
                f"accepted commit" + (f", and kept what you had under {ref}" if tip else ""))
        rnd.notes.append(note)
        self._log(note)
        return (note + f". Accepted commits must stay as they are: add new commits on top "
                       f"of {last[:7]} (you can cherry-pick from {ref}).")

    def after_developer_turn(self, findings: TurnFindings) -> None:
        """Undo what a Developer turn may not do, and say so; the round is rejected for it."""
        problems: list[str] = []
        self._note(self._settle_git())
        if ended := self.repo.end_operations("abort"):
            problems.append(f"the round left git mid-operation: {'; '.join(ended)}, which "
                            "put things back as they were before it began; finish or abort "
                            "such operations within your turn")
            self._log("; ".join(ended))
        self._held(findings.held, "the Developer")
        if findings.records:
            self._log("put back " + ", ".join(findings.records))
            problems.append("the round changed Anima's records, which only Anima writes: "
                            f"{', '.join(findings.records)}; Anima put them back")
        if findings.definitions:
            self._log("put back the human's " + ", ".join(findings.definitions))
            problems.append("the round changed definitions only the human may change: "
                            + ", ".join(findings.definitions)
                            + "; Anima put the human's versions back")
        if (reverted := self._revert_branch_definitions(findings.head_before)) is not None:
            problems.append(reverted)
        if (deleted := self._main_deleted("the Developer", findings.main_before)) is not None:
            problems.append(deleted)
        elif findings.main_after and findings.developer_moved_main:
            problems.append(self._foreign_main("the Developer", findings.main_before,
                                               findings.main_after, findings.main_commits))
        elif findings.main_after:
            self.follow_main()
        self.guarded += problems

    def _foreign_main(self, who: str, before: str, after: str,
                      commits: list[tuple[str, str]]) -> str:
        """An agent (or the checks, which run the Developer's code) moved main: it is kept
        under a ref and left as it is, and the loop pauses for the human, who alone decides
        where main goes. Returns the problem, for the round."""
        rec, main = self.record, self.record.main_branch or ""
        ref = f"refs/anima/foreign-main/{rec.id}/{rec.rounds + 1}"
        self.repo.keep_ref(ref, after)
        listed = ", ".join(f"{c[:7]} {subject}" for c, subject in commits[:5])
        moved = f"{who} moved {main} from {before[:7]} to {after[:7]}" + (
            f" ({listed})" if listed else "")
        request = (f"{moved}; kept under {ref}. Anima left {main} as it is: put it where "
                   f"you want it, then resume (Anima takes {main} as you leave it)")
        self._request_pause(request)
        self._log(request)
        return f"{moved}; only the human may change {main}"

    def _main_deleted(self, who: str, before: str) -> str | None:
        """main deleted during a turn (only a shell in the project can): it is put back where
        it was, and the round says so. Returns the problem, or None."""
        main = self.record.main_branch
        if not main or not before or self.repo.resolve(f"refs/heads/{main}") is not None:
            return None
        self.repo.keep_ref(f"refs/heads/{main}", before)
        problem = f"{who} deleted {main}; Anima put it back at {before[:7]}"
        self._log(problem)
        return problem

    def snapshot(self, who: str) -> TreeSnapshot:
        """Before a review or the project's checks: what `undo_changes` puts back."""
        self.guard.note_records()
        main = self.record.main_branch
        self._review_began = (time.time(), self.repo.resolve(f"refs/heads/{main}") or "")
        snapshot = self.repo.snapshot()
        write_model_atomic(self.guard.paths.review_guard, ReviewStart(
            milestone=self.record.id, who=who, started=self._review_began[0],
            main_before=self._review_began[1], head_before=snapshot.head))
        return snapshot

    def undo_changes(self, snapshot: TreeSnapshot, who: str) -> None:
        """A review (or a check run) leaves the tree as it found it, and the round says so;
        main it moved becomes the round's problem (see `_foreign_main`)."""
        undone = self._settle_git()
        undone += self.repo.restore(snapshot)
        self._main_moved_during(snapshot.head, who)
        with contextlib.suppress(FileNotFoundError):
            self.guard.paths.review_guard.unlink()
        if not self.guard.confined:  # in the sandbox they cannot be changed
            undone += [f"{r} put back" for r in self.guard.restore_records()]
            done = put_back(self.guard.paths, self.guard.copy, self.guard.mentions.named)
            self._held(done.held, who)
            undone += [f"the human's {d} put back" for d in done.changed]
        if undone and self.ledger.round is not None:
            note = f"{who} changed the repository; undone: " + "; ".join(undone)
            self.ledger.round.notes.append(note)
            self._log(note)

    def after_restart(self) -> None:
        """A Developer turn, a review or a check run that a kill cut short: what it did to
        main and the definitions is judged now, as it would have been at its end."""
        if (findings := self.guard.resume_interrupted()) is not None:
            self.after_developer_turn(findings)
        path = self.guard.paths.review_guard
        try:
            start = ReviewStart.model_validate(json.loads(read_regular(path)))
        except (OSError, ValueError, ValidationError):
            return
        if start.milestone == self.record.id:  # another's waits for its own restart
            self._review_began = (start.started, start.main_before)
            self._main_moved_during(start.head_before, start.who)
            self.guarded.clear()  # no round to reject: the pause request says it
            path.unlink()

    def _main_moved_during(self, reviewed: str, who: str) -> None:
        """Only the reviewed tree's own HEAD tells the reviewer's moves from someone else's:
        main on a commit it visited (committed, checked out) or on the reviewed commit."""
        main, (began, before) = self.record.main_branch, self._review_began
        if (deleted := self._main_deleted(who, before)) is not None:
            self.guarded.append(deleted)
            return
        if not main or (after := self.repo.resolve(f"refs/heads/{main}")) in (None, before):
            return
        commits = self.repo.branch_log(before, after) if before else []
        visited = self.repo.agent_visits_since(began, main) | {reviewed}
        if after in visited or any(c in visited for c, _ in commits):
            self.guarded.append(self._foreign_main(who, before, after, commits))

    def _settle_git(self) -> list[str]:
        """A turn or a check may leave git's lock files behind (a git it killed, one it ran in
        the background): Anima's next git command would fail on them."""
        notes = []
        if busy := wait_for_git(self.repo.root, _GIT_WAIT):
            notes.append(f"git still running in the project after {_GIT_WAIT:g}s (pids "
                         f"{', '.join(map(str, busy))}); its locks are left alone")
        notes += [f".git/{lock} was left by a git command that no longer runs; removed"
                  for lock in clear_stale_locks(self.repo.root, self.repo.git_dir)]
        return notes

    def _note(self, notes: list[str]) -> None:
        for note in notes:
            if self.ledger.round is not None:
                self.ledger.round.notes.append(note)
            self._log(note)

    def _held(self, held: list[tuple[str, str]], who: str) -> None:
        """Milestones that arrived during the work: held, said everywhere the human looks."""
        if not held:
            return
        line = describe_held(held, who)
        if self.ledger.round is not None:
            self.ledger.round.notes.append(line)
        self._log(line)
        self._notice(line)

    def _revert_branch_definitions(self, turn_began_at: str) -> str | None:
        """Commits of the turn on the milestone branch that change the human's definitions
        (compared with Anima's copy) are undone by a commit of Anima's, so main never gets
        them."""
        rec = self.record
        if not turn_began_at or self.repo.current_branch() != rec.branch_name:
            return None
        changed = self.repo.anima_changes(turn_began_at, self.repo.head(), self.guard.copy)
        if not changed:
            return None
        paths = [path for path, _ in changed]
        commit = self.repo.commit_anima_revert(
            turn_began_at, paths, "chore(anima): put back the human's definitions")
        note = (f"commits on {rec.branch_name} changed {', '.join(paths)}, which only the human "
                f"may change; Anima committed {commit[:7]} putting them back")
        self._log(note)
        return note

    def follow_main(self) -> None:
        """main moved by someone other than the Developer is the new reference: the milestone
        goes on and merges on top of it at completion."""
        rec = self.record
        tip = self.repo.resolve(f"refs/heads/{rec.main_branch}") if rec.main_branch else None
        if tip is None or tip == rec.main_head:
            return
        self._log(f"{rec.main_branch} moved from {(rec.main_head or '?')[:7]} to {tip[:7]}, not "
                  "by the Developer: it is the new reference, and the milestone merges on top "
                  "of it at completion")
        rec.main_head = tip
        self._save()

    def check_commit(self, report: DeveloperReport) -> str | None:
        """Git is the truth: verify the reported commit before any Acceptor token is spent.
        Returns why the round is rejected, or None when the commit is the round's."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None
        rnd.feature = report.feature
        if (f := rec.feature(report.feature)) is not None and f.status is not FeatureStatus.DONE:
            f.status = FeatureStatus.IN_PROGRESS
        leftover = self._commit_leftovers(f" ({report.feature})" if report.feature else "")
        reported = self.repo.resolve(report.commit) if report.commit else None
        # Anima's own commit of the leftovers sits on top of whatever the Developer named.
        commit = leftover or reported or self._unreported_commit(report.commit)
        if leftover and report.commit and not (reported and self._new_this_round(reported)):
            what = "which is not a commit of this round" if reported else "which does not exist"
            named = reported[:7] if reported else report.commit[:12]
            self._note([f"the report named {named}, {what}; reviewing "
                        f"{leftover[:7]}, Anima's commit of the round's uncommitted work"])
        tip = self.repo.resolve(f"refs/heads/{rec.branch_name}")
        if commit and tip and tip != commit and self.repo.is_ancestor(commit, tip):
            self._note([f"the report named {commit[:7]}, but {rec.branch_name} has newer "
                        f"commits up to {tip[:7]}; reviewing all of the round's commits"])
            commit = tip
        accepted = self.accepted_commits()
        if commit is None:
            problems = [f"the reported commit {report.commit} does not exist in the repository"
                        if report.commit else "the report names no commit hash"]
            problems[0] += f" and nothing was committed on {rec.branch_name} this round"
        elif accepted and self.repo.is_ancestor(commit, accepted[-1]):
            problems = [f"commit {commit[:7]} is already part of the accepted history (the last "
                        f"accepted commit is {accepted[-1][:7]}), so it is not new work: commit "
                        f"this round's work as new commits on top of {accepted[-1][:7]} and "
                        "report the newest one"]
        else:
            problems = self.repo.check_developer_commit(
                commit, branch=rec.branch_name or "", base_commit=rec.base_commit or "",
                main=rec.main_branch or "", main_head=rec.main_head or "",
                definitions=self.guard.copy)
        if problems:
            return "git check failed: " + "; ".join(problems)
        assert commit is not None
        rnd.commit = commit
        rnd.changed_files = self.repo.changed_files_between(rnd.previous_head, commit)
        self._log(f"commit {commit[:7]} verified on {rec.branch_name} "
                  f"({len(rnd.changed_files)} files)")
        return None
