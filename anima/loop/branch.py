"""The milestone branch around a Developer round: back on it before the round, main followed
when someone else moved it, the reported commit verified (git is the truth), accepted history
kept append-only, and what a Developer turn may not do (the human's definitions, main) undone
and turned into the round's rejection.

What a round costs in git stays flat however long the milestone runs: the accepted commits
form a chain on the branch (each one is new work on top of the one before, which
`check_commit` requires), so "every accepted commit is still on the branch" is "the last one
is", and one `git log` of last-accepted..tip serves the history check, the commit check and
the review's list of commits. The refs are read once before a turn and once after it
(`Tips`); what Anima itself moves in between it notes rather than reads again.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from anima.errors import GitError
from anima.git import GitRepo, TreeSnapshot
from anima.git.branches import Tips
from anima.git.check import Resolved
from anima.git.history import Ancestry, RawChange
from anima.git.locks import (
    READ_IN_EVERY_FOLDER,
    clear_stale_locks,
    mend_branch_ref,
    remove_links,
    remove_special_rule_files,
    wait_for_git,
)
from anima.git.objects import take_objects
from anima.git.repo import listing
from anima.guard.restore import describe_held, describe_kept
from anima.guard.turns import ReviewStart, TurnFindings, TurnGuard
from anima.loop.ledger import Ledger
from anima.loop.worktree import MilestoneWorktree
from anima.store.models import FeatureStatus, MilestoneRecord, RoundKind, Verdict
from anima.text.formats import DeveloperReport, ReportKind

#: The length from which a value of the copied-in files may not be in a commit.
_COMMITTED_VALUE_CHARS = 12
# A git the agent left running in the background gets this long to finish before Anima's.
_GIT_WAIT = 5.0


@dataclass(frozen=True)
class UnreportedWork:
    """After a restart: what the killed round committed and never had reviewed."""

    feature: str  # the feature that round was on
    since: str  # the last accepted commit (or the base): where that round began
    tip: str
    commits: tuple[tuple[str, str], ...]  # (hash, subject), oldest first


class BranchKeeper:
    """The git side of a round; the loop turns what it finds into rejections and pauses."""

    def __init__(self, *, record: MilestoneRecord, repo: GitRepo, guard: TurnGuard,
                 ledger: Ledger, save: Callable[[], None], log_line: Callable[[str], None],
                 request_pause: Callable[[str], None], notice: Callable[[str], None],
                 worktree: MilestoneWorktree | None = None) -> None:
        self.record = record
        self.worktree = worktree  # its secrets (`.worktreeinclude`) no commit may hold
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
        # The refs as last read (`refresh`), kept up to date with what Anima moves itself.
        self._tips: Tips | None = None
        self._ancestry: Ancestry | None = None  # the last `since..tip` read (never stale)
        # Whether every accepted commit was found on the branch with one walk this run; from
        # then on the chain check of `check_commit` keeps it so, and the last one suffices.
        self._chain_checked = False
        # What the Developer's last turn changed (head before, tip after, the paths): also
        # the round's changed files when nothing was committed since.
        self._turn_changes: tuple[str, str, list[RawChange]] | None = None

    def take_guarded(self) -> list[str]:
        """The problems found since the last rejection, which then starts with them."""
        # a problem found after each of a round's turns (a report asked again) is said once
        guarded, self.guarded = list(dict.fromkeys(self.guarded)), []
        return guarded

    def refresh(self) -> Tips:
        """Read where the branch, main and HEAD are (one git call): before a round, after a
        Developer turn, and after Anima moved something in a way it does not just note.
        A branch made a symbolic ref is made a branch again first (`_made_symbolic`)."""
        rec = self.record
        tips = self.repo.tips(rec.branch_name or "", rec.main_branch)
        if tips.symbolic is not None:
            self.guarded.append(self._made_symbolic(tips.symbolic))
            tips = self.repo.tips(rec.branch_name or "", rec.main_branch)
        self._tips = tips
        return tips

    def _known(self) -> Tips:
        return self._tips if self._tips is not None else self.refresh()

    def tips(self) -> Tips | None:
        """The refs as last read and kept up to date since (None: not read yet)."""
        return self._tips

    def _moved(self, **changes: str | bool | None) -> None:
        """Note what Anima itself just moved (a commit of its own, main put back)."""
        if self._tips is not None:
            self._tips = dataclasses.replace(self._tips, **changes)  # type: ignore[arg-type]

    def head(self) -> str:
        """HEAD of the milestone's tree once `back_on_branch` put it on the branch."""
        tips = self._known()
        return tips.branch if tips.on_branch and tips.branch else self.repo.head()

    def back_on_branch(self, *, fresh: bool = True) -> None:
        """The Developer has a shell: if it left the milestone branch, return to it, before a
        round and before its work is checked, tested and reviewed (which happen on the branch,
        never on wherever the Developer's tree was). Uncommitted changes git will not carry
        over are stashed under a recorded name. `fresh=False`: as the refs were read after
        the Developer's turn (nothing but Anima ran since)."""
        branch = self.record.branch_name
        if not branch or (self.refresh() if fresh else self._known()).on_branch:
            return
        current = self.repo.current_branch()
        if not self.repo.branch_exists(branch):
            # (deleted under the tree, HEAD still names it: the next commit would be a root)
            self._recreate(branch)
            if current == branch:
                self.refresh()
        if current == branch:
            return
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
        self.refresh()
        self._note([note])

    def _recreate(self, branch: str) -> None:
        """The milestone branch deleted (only a shell in the project can): back where the
        round began, or at the last accepted commit; a round in flight is rejected for it."""
        rnd = self.ledger.round
        at = (rnd.previous_head if rnd is not None else None) or \
            (self.accepted_commits() or [self.record.base_commit or ""])[-1]
        self.repo.keep_ref(f"refs/heads/{branch}", at)
        self._moved(branch=at)
        problem = f"{branch} was deleted; Anima recreated it at {at[:7]}"
        self._log(problem)
        if rnd is not None:
            self.guarded.append(problem)

    def _commit_leftovers(self, what: str) -> str | None:
        """Every round's work is committed: what the Developer left uncommitted, Anima
        commits on the milestone branch (and says so)."""
        rnd = self.ledger.round
        assert rnd is not None
        done = self.repo.commit_leftovers(
            f"chore(anima): commit uncommitted work of round {rnd.round}" + what,
            keep_out=self._secrets())
        if done.nested:
            self._note([f"left out of Anima's commit, as git repositories of their own: "
                        f"{listing(done.nested)} (git would take each for a submodule that "
                        "only this disk holds); delete them, or commit their files in the "
                        "milestone's own repository"])
        if leftover := done.commit:
            self._moved(branch=leftover)  # on the branch: `back_on_branch` came first
            rnd.auto_committed = True
            self._note([f"Anima committed the Developer's uncommitted changes as "
                        f"{leftover[:7]}"])
        return leftover

    def _new_this_round(self, commit: str) -> bool:
        rnd = self.ledger.round
        assert rnd is not None
        return commit != rnd.previous_head and (
            not rnd.previous_head or self.repo.is_ancestor(rnd.previous_head, commit))

    def commit_round_work(self, report: DeveloperReport) -> str | None:
        """A round's uncommitted work, committed before it is checked (what a review judges
        is what gets merged): a value of the copied-in files in it is caught as in any commit
        of the round, not reviewed and merged unseen; so is, in the final round (whose commit
        is not checked like a feature's), a change to the human's definitions (a line added
        to `.worktreeinclude`). Returns Anima's commit, or None."""
        final = report.kind is ReportKind.ALL_COMPLETE
        before = self._known().branch
        leftover = self._commit_leftovers(" (final)" if final else
                                          f" ({report.feature})" if report.feature else "")
        if final and leftover and before and \
                (reverted := self._revert_branch_definitions(before)) is not None:
            self.guarded.append(reverted)
        return leftover

    def final_tip(self) -> str | None:
        """What the final acceptance judges: the milestone branch's tip, the round's work
        committed and checked already (`commit_round_work`)."""
        return self.repo.resolve(f"refs/heads/{self.record.branch_name}")

    def _unreported_commit(self, named: str | None) -> str | None:
        """A report without a Commit field, or naming a hash that does not exist (a model's
        hallucination): the newest commit made on the branch this round, if any."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None
        tip = self._known().branch
        if tip is None or tip == rnd.previous_head:
            return None
        named = f"{named[:12]}, which does not exist" if named else "no commit"
        self._note([f"the report named {named}; reviewing {tip[:7]}, the newest of the "
                    f"commits made on {rec.branch_name} this round"])
        return tip

    def accepted_commits(self) -> list[str]:
        """The commits of the accepted feature rounds, oldest first."""
        return list(dict.fromkeys(it.commit for it in self.record.standing
                                  if it.verdict is Verdict.ACCEPTED and it.commit
                                  and it.kind is not RoundKind.FINAL))

    def _since(self) -> str:
        """Where the next accepted round's review starts: the last accepted commit, else the
        base. The reviews of the accepted rounds so cover the whole branch between them."""
        accepted = self.accepted_commits()
        return accepted[-1] if accepted else self.record.base_commit or ""

    def ancestry(self, since: str, tip: str) -> Ancestry:
        """`since..tip` (one `git log`), kept: the ancestry of two commits never changes."""
        if (known := self._ancestry) is None or (known.since, known.tip) != (since, tip):
            known = self._ancestry = self.repo.ancestry(since, tip)
        return known

    def _missing(self, accepted: list[str], tip: str | None) -> list[str]:
        """The accepted commits that are no longer on the branch. The first time in a run, all
        of them in one walk (`merge-base --independent`: accepted by an earlier Anima, moved
        while none ran); then only the last, since the commit check makes each accepted
        commit descend from the one before: one `git log` of the round's own commits."""
        if not accepted:
            return []
        if tip is None:
            return accepted
        if not self._chain_checked:
            if self.repo.independent([tip, *accepted]) == [tip]:
                self._chain_checked = True
                return []
        elif self.ancestry(accepted[-1], tip).descends:
            return []
        return [c for c in accepted if not self.repo.is_ancestor(c, tip)]  # naming them

    def history_rewritten(self) -> str | None:
        """Accepted history is append-only: if an accepted commit left the branch (amend,
        reset, rebase), put the branch back to the last accepted commit, keeping what the
        Developer had under a ref, and say why the round is rejected. Reads the refs as
        they were after the Developer's turn."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None and rec.branch_name
        accepted = self.accepted_commits()
        tips = self._known()
        tip = tips.branch
        missing = self._missing(accepted, tip)
        if not missing:
            return None
        ref = f"refs/anima/rewritten/{rec.id}/{rnd.round}"
        last = accepted[-1]
        tip = self._put_back(last, ref, tip)
        gone = ", ".join(c[:7] for c in missing)
        note = (f"history was rewritten: accepted commit(s) {gone} are no longer on "
                f"{rec.branch_name}; Anima put {rec.branch_name} back to {last[:7]}, the last "
                f"accepted commit" + (f", and kept what you had under {ref}" if tip else ""))
        self._note([note])
        return (note + f". Accepted commits must stay as they are: add new commits on top "
                       f"of {last[:7]} (you can cherry-pick from {ref}).")

    def _put_back(self, to: str, ref: str, tip: str | None, *, keep_files: bool = False
                  ) -> str | None:
        """Reset the milestone branch to `to`, keeping what it had (`tip`) under `ref`; the
        uncommitted work in its tree is committed on it first, or the reset would take it
        (`keep_files`: the tree and index stay as they are instead, when `tip` holds a tree
        git can commit nothing on). Returns what was kept."""
        rec, rnd = self.record, self.ledger.round
        assert rec.branch_name
        if not keep_files and self.repo.current_branch() == rec.branch_name:
            self.repo.commit_leftovers(
                f"chore(anima): uncommitted work of round {rnd.round if rnd else rec.rounds + 1}"
                ", kept before the branch is put back", keep_out=self._secrets())
            tip = self.repo.head()
        if tip is not None:
            self.repo.keep_ref(ref, tip)
        self.repo.reset_branch(rec.branch_name, to, keep_files=keep_files)
        self.refresh()
        return tip

    def _secrets(self) -> frozenset[str]:
        return self.worktree.secrets() if self.worktree is not None else frozenset()

    def secrets_committed(self) -> str | None:
        """The files copied in from `.worktreeinclude` (a `.env`) and the values they hold
        are secrets: a commit since the last accepted one that holds one never reaches a
        review, the Changes view or main. The branch goes back to before it (the commits are
        kept under a local ref, to pick from), the files are copied in again, and the round
        is rejected for it. Returns the rejection, or None."""
        rec, rnd, wt = self.record, self.ledger.round, self.worktree
        tip = self._known().branch
        if wt is None or not tip or not rec.branch_name:
            return None
        since = self._since()
        # A short value (`DB_PASS=postgres`) may be in code for other reasons; a long one
        # is not there by chance.
        leak = self.repo.first_leak(since, tip, wt.secrets(),
                                    wt.secret_values(_COMMITTED_VALUE_CHARS), self._known().main)
        if leak is None:
            return None
        commit, where, value = leak
        back_to = self.repo.resolve(f"{commit}^") or since
        ref = f"refs/anima/secrets/{rec.id}/{rnd.round if rnd else rec.rounds + 1}"
        self._put_back(back_to, ref, tip)
        wt.copy_secrets_again()
        what = (f"a value of the files copied in from .worktreeinclude, in {where}" if value
                else f"{where}, copied in from .worktreeinclude")
        note = (f"{commit[:7]} committed {what}: a secret, which must never be committed; "
                f"Anima put {rec.branch_name} back to {back_to[:7]} and kept the commits "
                f"under {ref} (on this machine only)")
        self._note([note])
        fix = (f"have {where} read it at run time (from the environment, or from the file "
               "it was copied from) instead of holding it" if value else
               f"`git rm --cached {where}` before you commit (it stays in your tree)")
        return (f"{note}. Redo the work without it: `git cherry-pick -n` the commits you "
                f"need, then {fix}.")

    def trees_refused(self, since: str | None = None) -> str | None:
        """A commit since the last accepted one (or since `since`) whose tree git refuses (a
        `.GIT/` folder: see `first_refused_tree`) never reaches a review or main: git cannot
        commit the round's leftovers on it, and a host that checks pushes would refuse main.
        The branch goes back to before it (the commits are kept under a local ref), its tree
        and index as they are, and the round is rejected for it. Returns the rejection, or
        None."""
        rec, rnd = self.record, self.ledger.round
        tips = self._known()
        if not tips.branch or not rec.branch_name:
            return None
        found = self.repo.first_refused_tree(since or self._since(), tips.branch, tips.main)
        if found is None:
            return None
        commit, folder, why = found
        parent, last = self.repo.resolve(f"{commit}^"), self._since()
        # not before the last accepted commit, when the round rewrote history too
        back_to = parent if parent and self.repo.is_ancestor(last, parent) else last
        ref = f"refs/anima/refused-trees/{rec.id}/{rnd.round if rnd else rec.rounds + 1}"
        self._put_back(back_to, ref, tips.branch, keep_files=True)
        note = (f"{commit[:7]} commits a tree git refuses (in {folder or 'the top folder'}: "
                f"{why}): git cannot check it out, and a host that checks pushes refuses it; "
                f"Anima put {rec.branch_name} back to {back_to[:7]}, with your files as they "
                f"are, and kept the commits under {ref} (on this machine only)")
        self._note([note])
        return (f"{note}. Commit your work again without that path: a name git itself would "
                "take for its own folder (`.git` in any case or spelling), `.`, `..`, an "
                "empty one or one holding `/`; or without what git refuses in `.gitmodules` "
                "(a command as a submodule's `update`, a URL or path starting with `-`).")

    def after_developer_turn(self, findings: TurnFindings, settled: list[str]) -> None:
        """Undo what a Developer turn may not do, and say so; the round is rejected for it.
        `settled`: what `settle_git` did first, before the guard read anything."""
        problems: list[str] = []
        self._note(settled)
        if ended := self.repo.end_operations("abort", self.record.branch_name or ""):
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
            if findings.kept:
                self._log(describe_kept(findings.kept))
            problems.append("the round changed definitions only the human may change: "
                            + ", ".join(findings.definitions)
                            + "; Anima put the human's versions back")
        self.refresh()  # after the abort: where the turn left the branch, main and HEAD
        if (reverted := self._revert_branch_definitions(findings.head_before)) is not None:
            problems.append(reverted)
        if (deleted := self._main_deleted("the Developer", findings.main_before,
                                          self._known().main)) is not None:
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

    def _main_deleted(self, who: str, before: str, now: str | None) -> str | None:
        """main deleted during a turn (only a shell in the project can): it is put back where
        it was, and the round says so. `now`: main's commit as just read. Returns the
        problem, or None."""
        main = self.record.main_branch
        if not main or not before or now is not None:
            return None
        self.repo.keep_ref(f"refs/heads/{main}", before)
        self._moved(main=before)
        problem = f"{who} deleted {main}; Anima put it back at {before[:7]}"
        self._log(problem)
        return problem

    def snapshot(self, who: str) -> TreeSnapshot:
        """Before a review or the project's checks: what `undo_changes` puts back."""
        # main as read after the Developer's turn (or after the last review or check run): a
        # move since then is judged at the end like one during the review
        self._review_began = (time.time(), self._known().main or "")
        snapshot = self.repo.snapshot()
        self.guard.before_review(ReviewStart(
            milestone=self.record.id, who=who, started=self._review_began[0],
            main_before=self._review_began[1], head_before=snapshot.head))
        return snapshot

    def undo_changes(self, snapshot: TreeSnapshot, who: str) -> None:
        """A review (or a check run) leaves the tree as it found it, and the round says so;
        main it moved becomes the round's problem (see `_foreign_main`)."""
        undone = self.settle_git()
        undone += self.repo.restore(snapshot)
        self._main_moved_during(snapshot.head, who)
        put_back = self.guard.after_review()
        self._held(put_back.held, who)
        undone += put_back.changed
        if undone and self.ledger.round is not None:
            self._note([f"{who} changed the repository; undone: " + "; ".join(undone)])

    def after_restart(self) -> None:
        """A Developer turn, a review or a check run that a kill cut short: what it did to
        main and the definitions is judged now, as it would have been at its end."""
        settled = self.settle_git()
        if (findings := self.guard.resume_interrupted()) is not None:
            self.after_developer_turn(findings, settled)
        else:
            self._note(settled)
        if (start := self.guard.interrupted_review()) is not None:
            self._review_began = (start.started, start.main_before)
            self._main_moved_during(start.head_before, start.who)
            self.guarded.clear()  # no round to reject: the pause request says it

    def _main_moved_during(self, reviewed: str, who: str) -> None:
        """Only the reviewed tree's own HEAD tells the reviewer's moves from someone else's:
        main on a commit it visited (committed, checked out) or on the reviewed commit."""
        main, (began, before) = self.record.main_branch, self._review_began
        after = self.repo.resolve(f"refs/heads/{main}") if main else None
        self._moved(main=after)
        if (deleted := self._main_deleted(who, before, after)) is not None:
            self.guarded.append(deleted)
            return
        if not main or after in (None, before):
            return
        commits = list(self.repo.ancestry(before, after).commits) if before else []
        visited = self.repo.agent_visits_since(began, main) | {reviewed}
        if after in visited or any(c in visited for c, _ in commits):
            self.guarded.append(self._foreign_main(who, before, after, commits))

    def settle_git(self) -> list[str]:
        """A turn or a check may leave git's lock files behind (a git it killed, one it ran in
        the background), or the worktree's HEAD or index broken: Anima's next git command
        would fail on them. Links it left in git's folder, or its branch made a symbolic ref,
        would have Anima's git write outside the sandbox, or move main: those reject the
        round. The objects the confined Developer's git wrote are taken into the repository.
        Before anything else reads git after a turn."""
        notes = []
        project = self.guard.paths.root  # git in the human's checkout shares the refs' locks
        if busy := wait_for_git(project, _GIT_WAIT):
            notes.append(f"git still at work in the project (pids {', '.join(map(str, busy))}"
                         f"; stopped or still running after {_GIT_WAIT:g}s); its locks are "
                         "left alone")
        notes += take_objects(self.guard.paths.agent_objects(self.record.id),
                              self.repo.common_dir)
        branch = self.record.branch_name or ""
        # First what needs no git: git would fail on (or write through) what these mend.
        for rel in remove_special_rule_files(self.repo.root, self.repo.git_dir):
            what = "its rules" if rel.rpartition("/")[2] in READ_IN_EVERY_FOLDER \
                else "a nested repository's HEAD and refs"
            notes.append(f"{rel} was a FIFO (or another special file) where git reads {what}: "
                         "every git command in the worktree would have waited for it for ever; "
                         "removed")
        ref_file = mend_branch_ref(self.repo.common_dir, branch) if branch else None
        if branch and (links := remove_links(self.repo.common_dir, self.repo.git_dir, branch)):
            self.guarded.append(
                f"the round left links (or special files) in git's own folder: "
                f"{', '.join(links)}; through them Anima's git would have written the files "
                "they name, outside the sandbox; removed")
        # The worktree's own locks only a git in the worktree holds (not another milestone's,
        # at work in its own worktree meanwhile); the shared ones any git in the project.
        for git_dir, where in dict.fromkeys([(self.repo.git_dir, self.repo.root),
                                             (self.repo.common_dir, project)]):
            notes += [f"{git_dir.relative_to(project)}/{lock} was left by a git command "
                      "that no longer runs; removed"
                      for lock in clear_stale_locks(where, git_dir)]
        reindex = False
        if self.repo.git_dir != self.repo.common_dir and branch:
            mended = self.repo.mend_git_folder(branch)
            notes += mended.notes
            self.guarded += mended.forged
            reindex = mended.reindex
        # Then the branch, before any git of Anima's reads or writes it (an abort, a commit).
        if ref_file == "":
            self.guarded.append(self._branch_mended(
                "left unreadable (its ref file held no commit)"))
        elif ref_file is not None:
            self.guarded.append(self._made_symbolic(ref_file))
        if reindex:
            self.repo.rebuild_index()
        return notes

    def settle(self) -> None:
        """`settle_git` outside a turn's end (an agent stopped for working past its turn:
        its commits' objects taken in), its notes on the round."""
        self._note(self.settle_git())

    def _made_symbolic(self, target: str) -> str:
        return self._branch_mended(f"made a symbolic ref to {target}, so that commits on it "
                                   f"would move {target}")

    def _branch_mended(self, how: str) -> str:
        """The Developer writes its branch's ref file (it must, to commit). Made a symbolic
        ref (`ref: refs/heads/main`), the branch is main to git, and every commit Anima makes
        on it (the leftovers, a put-back, an abort) would move main, with Anima's unconfined
        git; left unreadable, every git command reading it fails. It is made a branch again
        where it stood before the turn; returns the round's problem. `how`: what it was."""
        branch = self.record.branch_name or ""
        back_to = (self._tips.branch if self._tips else None) or self._since()
        self.repo.keep_ref(f"refs/heads/{branch}", back_to)
        self._moved(branch=back_to)
        problem = (f"{branch} was {how}; Anima made it a branch again at {back_to[:7]}, "
                   "where it stood before the turn (its commits since are dropped from it)")
        self._log(problem)
        return problem

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
        self._note([line])
        self._notice(line)

    def _revert_branch_definitions(self, turn_began_at: str) -> str | None:
        """Commits of the turn on the milestone branch that change the human's definitions
        (compared with Anima's copy) are undone by a commit of Anima's, so main never gets
        them."""
        rec, tips = self.record, self._known()
        if not turn_began_at or not tips.on_branch or not tips.branch \
                or tips.branch == turn_began_at:  # not on the branch, or nothing committed
            return None
        # every path, not only `.anima/`: the same diff gives the round's changed files
        changes = self.repo.raw_changes(turn_began_at, tips.branch)
        self._turn_changes = (turn_began_at, tips.branch, changes)
        changed = self.repo.anima_changes(turn_began_at, tips.branch, self.guard.definitions,
                                          changes)
        if not changed:
            return None
        paths = [path for path, _ in changed]
        commit = self.repo.commit_anima_revert(
            turn_began_at, paths, "chore(anima): put back the human's definitions")
        self._moved(branch=commit)
        note = (f"commits on {rec.branch_name} changed {', '.join(paths)}, which only the human "
                f"may change; Anima committed {commit[:7]} putting them back")
        self._log(note)
        return note

    def follow_main(self) -> None:
        """main moved by someone other than the Developer is the new reference: the milestone
        goes on and merges on top of it at completion."""
        rec = self.record
        tip = self._known().main if rec.main_branch else None
        if tip is None or tip == rec.main_head:
            return
        self._log(f"{rec.main_branch} moved from {(rec.main_head or '?')[:7]} to {tip[:7]}, not "
                  "by the Developer: it is the new reference, and the milestone merges on top "
                  "of it at completion")
        rec.main_head = tip
        self._save()

    def check_commit(self, report: DeveloperReport, leftover: str | None) -> str | None:
        """Git is the truth: verify the reported commit before any Acceptor token is spent;
        `leftover` is Anima's commit of the round's uncommitted work (`commit_round_work`).
        Returns why the round is rejected, or None when the commit is the round's."""
        rec, rnd = self.record, self.ledger.round
        assert rnd is not None
        rnd.feature = report.feature
        if (f := rec.feature(report.feature)) is not None and f.status is not FeatureStatus.DONE:
            f.status = FeatureStatus.IN_PROGRESS
        tips = self._known()  # as after the turn, with Anima's own commits
        tip, since = tips.branch, self._since()
        try:  # the commits since the last accepted one (usually read by the history check)
            new_work = self.ancestry(since, tip) if tip else None
        except GitError:
            new_work = None  # the slow path below says what is missing
        reported = self._resolve_reported(report.commit, new_work)
        # Anima's own commit of the leftovers sits on top of whatever the Developer named.
        commit = leftover or reported or self._unreported_commit(report.commit)
        if leftover and report.commit and not (reported and self._new_this_round(reported)):
            what = "which is not a commit of this round" if reported else "which does not exist"
            named = reported[:7] if reported else report.commit[:12]
            self._note([f"the report named {named}, {what}; reviewing "
                        f"{leftover[:7]}, Anima's commit of the round's uncommitted work"])
        on_path = new_work is not None and commit in new_work.path
        if commit and tip and tip != commit and (on_path or self.repo.is_ancestor(commit, tip)):
            self._note([f"the report named {commit[:7]}, but {rec.branch_name} has newer "
                        f"commits up to {tip[:7]}; reviewing all of the round's commits"])
            commit = tip
            on_path = new_work is not None and tip in new_work.path
        accepted = self.accepted_commits()
        if commit is None:
            problems = [f"the reported commit {report.commit} does not exist in the repository"
                        if report.commit else "the report names no commit hash"]
            problems[0] += f" and nothing was committed on {rec.branch_name} this round"
        elif accepted and not on_path and self.repo.is_ancestor(commit, accepted[-1]):
            problems = [f"commit {commit[:7]} is already part of the accepted history (the last "
                        f"accepted commit is {accepted[-1][:7]}), so it is not new work: commit "
                        f"this round's work as new commits on top of {accepted[-1][:7]} and "
                        "report the newest one"]
        elif new_work is None:
            problems = self.repo.check_developer_commit(
                commit, branch=rec.branch_name or "", base_commit=rec.base_commit or "",
                main=rec.main_branch or "",
                definitions=self.guard.definitions, since=since)
        else:  # everything is read already: only the `.anima/` diff is left to ask git
            problems = self.repo.check_resolved(
                commit, Resolved(commit=commit, base=rec.base_commit, tip=tip,
                                 main_tip=tips.main, on_path=on_path),
                branch=rec.branch_name or "", base_commit=rec.base_commit or "",
                main=rec.main_branch or "",
                definitions=self.guard.definitions, since=since)
        if problems:
            return "git check failed: " + "; ".join(problems)
        assert commit is not None
        rnd.commit = commit
        turn = self._turn_changes
        rnd.changed_files = [c.path for c in (
            turn[2] if turn is not None and turn[:2] == (rnd.previous_head, commit)
            else self.repo.raw_changes(rnd.previous_head, commit))]
        self._log(f"commit {commit[:7]} verified on {rec.branch_name} "
                  f"({len(rnd.changed_files)} files)")
        return None

    def _resolve_reported(self, named: str | None, new_work: Ancestry | None) -> str | None:
        """The reported commit's full hash: a full hash the round's commits include is taken
        as it is; anything else is asked of git."""
        if not named:
            return None
        name = named.strip().lower()
        if new_work is not None and len(name) in (40, 64) and any(
                c == name for c, _ in new_work.commits):
            return name
        return self.repo.resolve(named)

    def review_range(self, commit: str) -> tuple[str, list[tuple[str, str]]]:
        """What the review of a round's `commit` covers: every commit since the last accepted
        one (or the base), not only the round's own. Work committed before the round began
        (a rejected attempt, a round a kill cut short) is reviewed with it, so no commit
        reaches main outside an accepted review's range."""
        since = self._since()
        return since, list(self.ancestry(since, commit).commits)

    def unreported_work(self) -> UnreportedWork | None:
        """After a restart: the commits a killed round made on the branch that no review has
        seen (Anima died before the Developer reported, or before the verdict). They are
        reviewed in a round of their own, for the feature that round was on: the one its
        report made in_progress, else the first unfinished one (the task of every feature
        round is the first unfinished feature). None when there are none, when the killed
        round was a fix (its Developer goes on with it, and its review covers them) or when
        the branch no longer has the last accepted commit (the next round's history check
        puts it back)."""
        rec = self.record
        last = rec.standing[-1] if rec.standing else None
        if last is not None and (last.verdict is not Verdict.ACCEPTED
                                 or last.kind is RoundKind.FINAL):
            return None
        feature = next((f for f in rec.features if f.status is FeatureStatus.IN_PROGRESS),
                       None) or next((f for f in rec.features
                                      if f.status is not FeatureStatus.DONE), None)
        tip = self._known().branch
        if feature is None or tip is None or not rec.base_commit:
            return None
        since = self._since()
        work = self.ancestry(since, tip)
        if not work.commits or not work.descends:
            return None
        return UnreportedWork(feature=feature.id, since=since, tip=tip, commits=work.commits)
