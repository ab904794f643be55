"""Whether the Developer's reported commit may go to review: on its branch, new work on top of
the last accepted commit (so the accepted commits form a chain), and without edits to the
human's definitions under `.anima/`."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from anima.git.history import History, RawChange
from anima.git.repo import blob_id, listing, short_hash
from anima.paths import (
    ANIMA_DIR,
    WORKTREE_INCLUDE,
    is_definition_path,
    is_memory_path,
    is_under_anima,
)


@dataclass(frozen=True)
class Resolved:
    """A reported commit and the refs it is checked against, resolved (None: missing)."""

    commit: str | None
    base: str | None
    tip: str | None  # the milestone branch's
    main_tip: str | None
    #: `commit` is new work: it descends from the last accepted commit (or the base), is
    #: not that commit, and the branch tip is it or one of its descendants
    on_path: bool


class CommitCheck(History):
    """The checks on a Developer's commit."""

    def check_developer_commit(
        self,
        commit: str,
        *,
        branch: str,
        base_commit: str,
        main: str,
        definitions: Mapping[str, bytes],
        since: str | None = None,
    ) -> list[str]:
        """Why the Developer's reported commit cannot go to review (empty list: it can).
        Main may have moved meanwhile, as it does when other milestones merge: the loop's
        turn guard judges who moved it.

        `definitions` is Anima's copy of the human's definitions taken before the round (see
        `anima_changes`): the files on disk may be the Developer's by now. `since` is the
        last accepted commit: the reported one must be new work on top of it, so the
        accepted commits form a chain on the branch (None: on top of the base).

        Each problem is a sentence that can be handed back to the Developer as a rejection.
        Usually three git calls: resolve everything, walk since..branch (the round's commits,
        not the milestone's), diff `.anima/`. The loop, which has read the refs and the
        round's commits already, calls `check_resolved`: one call.
        """
        revs = [commit, base_commit, f"refs/heads/{branch}", f"refs/heads/{main}"]
        c, base, tip, main_tip, *rest = self._resolve_many(
            revs + ([since] if since else []))
        start = (rest[0] if rest else None) or base
        on_path = False
        if c is not None and base is not None and tip is not None and start is not None:
            _, out, _ = self._run(
                ["rev-list", "--ancestry-path", f"{start}..{tip}"],
                what=f"Cannot read the history of {branch} in {self.root}",
            )
            on_path = c in set(os.fsdecode(out).split())
        found = Resolved(commit=c, base=base, tip=tip, main_tip=main_tip, on_path=on_path)
        return self.check_resolved(
            commit, found, branch=branch, base_commit=base_commit, main=main,
            definitions=definitions, since=since)

    def check_resolved(
        self,
        commit: str,
        found: Resolved,
        *,
        branch: str,
        base_commit: str,
        main: str,
        definitions: Mapping[str, bytes],
        since: str | None = None,
    ) -> list[str]:
        """`check_developer_commit` once `found` is known: one git call (the `.anima/` diff)
        when the commit is good; the explanations of a bad one ask git more."""
        problems: list[str] = []
        c, base, tip, main_tip = found.commit, found.base, found.tip, found.main_tip
        if c is None:
            problems.append(f"Commit {commit} does not exist in the repository.")
        if base is None:
            problems.append(f"The milestone's base commit {base_commit} does not exist.")
        if tip is None:
            problems.append(f"The milestone branch {branch} does not exist.")
        if main_tip is None:
            problems.append(f"The main branch {main} does not exist.")
        if c is not None and base is not None and tip is not None and not found.on_path:
            problems += self._off_branch(commit, c, branch, tip, base_commit, base, since)
        if c is not None and base is not None:
            problems += self._anima_violations(commit, c, base, definitions)
        return problems

    def _off_branch(
        self, commit: str, c: str, branch: str, tip: str, base_commit: str, base: str,
        since: str | None = None,
    ) -> list[str]:
        """Explain why `c` is not new work between the last accepted commit (or the base)
        and the branch tip (failure path)."""
        if c == base:
            return [
                f"Commit {commit} is the milestone's base commit: there is no new work on {branch}."
            ]
        problems: list[str] = []
        if not self.is_ancestor(c, tip):
            _, out, _ = self._run(
                ["branch", "--contains", c, "--format=%(refname:short)"], check=False
            )
            holders = os.fsdecode(out).split()
            where = f" (it is on {listing(holders, 3)})" if holders else ""
            problems.append(
                f"Commit {commit} is not on the milestone branch {branch}{where}; "
                f"commit your work on {branch}."
            )
        if not self.is_ancestor(base, c):
            problems.append(
                f"Commit {commit} does not descend from the milestone's base commit "
                f"{short_hash(base_commit)}."
            )
        elif since and since != base and (last := self.resolve(since)) is not None and (
                last == c or not self.is_ancestor(last, c)):
            problems.append(
                f"Commit {commit} is not new work on top of the last accepted commit "
                f"{short_hash(last)}: commit this round's work as new commits on top of it."
            )
        return problems or [
            f"Commit {commit} is not between the base commit {short_hash(base_commit)} and the "
            f"tip of {branch}."
        ]

    def _anima_violations(
        self, commit: str, c: str, base: str, definitions: Mapping[str, bytes]
    ) -> list[str]:
        """Say which paths under `.anima/` base..commit may not change."""
        offending = self.anima_changes(base, c, definitions)
        if not offending:
            return []
        words = {"A": "added", "D": "deleted", "M": "modified", "T": "type changed"}
        named = [f"{p} ({words.get(letter, 'changed')})" for p, letter in offending]
        where = "under .anima/ " if any(is_under_anima(p) for p, _ in offending) else ""
        return [
            f"Commit {commit} changes files {where}that belong to Anima or the human: "
            f"{listing(named)}. Only .anima/memory/ may be committed (a milestone, soul.md, "
            f"config.json or {WORKTREE_INCLUDE}, which says which of the human's ignored "
            "files every milestone gets, only exactly as the human wrote it)."
        ]

    def anima_changes(
        self, base: str, commit: str, definitions: Mapping[str, bytes],
        changes: Sequence[RawChange] | None = None,
    ) -> list[tuple[str, str]]:
        """(path, git status letter) of each path under `.anima/` (and `.worktreeinclude`)
        that base..commit may not change, sorted: memory/ is free; a definition may be
        committed only byte for byte as in `definitions` (Anima's copy of the human's files,
        never the worktree's, which are the Developer's). `changes`: base..commit's
        `raw_changes` when they were read already (no git call)."""
        if changes is None:
            changes = self.raw_changes(base, commit, ANIMA_DIR, WORKTREE_INCLUDE)
        offending: list[tuple[str, str]] = []
        for change in changes:
            path, letter = change.path, change.letter
            if not (is_under_anima(path) or is_definition_path(path)) or is_memory_path(path) or (
                is_definition_path(path)
                and self._as_written(path, letter, change.blob, definitions)
            ):
                continue
            offending.append((path, letter))
        return sorted(offending)

    def _as_written(
        self, path: str, letter: str, blob: str, definitions: Mapping[str, bytes]
    ) -> bool:
        """True when a committed definition is the human's file as it is (or a deletion of
        one the human does not have)."""
        content = definitions.get(path)
        if letter == "D":
            return content is None
        if content is None:
            return False
        if blob_id(content, len(blob)) == blob:
            return True
        # Content filters (e.g. autocrlf) may explain a difference: ask git.
        _, out, _ = self._run(
            ["hash-object", "--stdin", f"--path={path}"], stdin=content, check=False
        )
        return os.fsdecode(out).strip() == blob
