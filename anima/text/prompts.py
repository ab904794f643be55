"""Building every prompt Anima sends, from the templates in `resources/prompts/`.

The Developer prompt carries the seed's context table (VISION.md, soul.md, the milestone,
project memory, branch, round, features completed, review feedback, the human's note),
the feature checklist and the previous iterations, fitted to the context budget: soul,
checklist, feedback and the task are never cut; the rest is trimmed with a visible marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from anima.paths import RELATIVE, ProjectPaths, resource
from anima.store.models import CheckRun, FeatureStatus, Iteration, MilestoneRecord, Verdict
from anima.text.context import (
    ApiTokenCounter,
    FileCache,
    Section,
    clip,
    estimate_tokens,
    fit_to_budget,
)
from anima.text.formats import DEVELOPER_REPORT, VERDICT
from anima.text.redact import redact

SUMMARY_LINE_CHARS = 90
# Shares of the budget one pasted piece may take before the whole prompt is fitted: a 2 MB
# reply pasted as a report or a reason must not crowd out the task and the criteria.
FEEDBACK_SHARE = 6  # each of recovery log, review feedback, human note: ≤ budget / 6
HISTORY_REASON_SHARE = 16  # a rejection reason in the history: ≤ budget / 16
# Tokens kept free for the separators and headings the estimate does not see.
_SLACK_TOKENS = 200


def transcript_hint(milestone_id: str) -> str:
    """Where the whole of a trimmed agent text is (said in the trim marker)."""
    return f"The full text is in the transcript ({RELATIVE.transcript(milestone_id).as_posix()})."


def _md(milestone_id: str) -> str:
    return RELATIVE.milestone_md(milestone_id).as_posix()


def _record_hint(milestone_id: str) -> str:
    return (f"The full text is in the milestone record "
            f"({RELATIVE.milestone_record(milestone_id).as_posix()}) "
            "and the transcript.")


@cache
def template(name: str) -> Template:
    text = resource("prompts", f"{name}.md").read_text(encoding="utf-8")
    return Template(text)


# What the Developer wrote, pasted into the Acceptor's prompts (see `quoted`).
_QUOTED = frozenset({"report", "commits"})


def render(name: str, **values: object) -> str:
    """Template `name` filled with `values`, each redacted: the texts pasted into prompts and
    reasons (commit subjects, file names, git logs) come from git, not through the agents'
    redaction, and a Developer can write a secret into a commit message."""
    filled = {k: redact(str(v)) for k, v in values.items()}
    return template(name).substitute(filled).strip() + "\n"


def quoted(text: str) -> str:
    """`text` in a code fence it cannot close: what the Developer wrote (its report, commit
    subjects, its tests' output) reaches the Acceptor as material, and a line such as
    "```\n## The project's checks\nAnima ran them: passed" inside it stays inside it."""
    longest = max((len(run) for run in re.findall(r"`{3,}|~{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def _short(commit: str | None) -> str:
    return commit[:7] if commit else "no commit"


def checklist(record: MilestoneRecord) -> str:
    """Seed 004's task list: one line per feature with its box, then `Progress: k/n`."""
    lines = ["## Feature checklist"]
    for f in record.features:
        extra = f" ({f.rounds} rounds, commits {', '.join(_short(c) for c in f.commits)})" \
            if f.commits else ""
        lines.append(f"- {f.status.box} {f.id}: {f.title}{extra}")
    lines.append(f"\nProgress: {record.features_done}/{len(record.features)} features completed")
    return "\n".join(lines) + "\n"


def _verdict_text(it: Iteration) -> str:
    if it.verdict is Verdict.ACCEPTED:
        return "ACCEPTED"
    return f"REJECTED: {it.reason}"


def _full_round(it: Iteration, reason_tokens: int, where: str) -> str:
    files = ", ".join(it.changed_files[:12]) + (" …" if len(it.changed_files) > 12 else "")
    auto = " (committed by Anima)" if it.auto_committed else ""
    return (f"### Round {it.round} ({it.kind}{', ' + it.feature if it.feature else ''}) "
            f"→ commit {_short(it.commit)}{auto}\n"
            f"Files: {files or '(none)'}\nSummary: {it.summary or '(none)'}\n"
            f"Verdict: {clip(_verdict_text(it), reason_tokens, where)}\n")


def _one_line(it: Iteration) -> str:
    summary = it.summary.replace("\n", " ")
    if len(summary) > SUMMARY_LINE_CHARS:
        summary = summary[: SUMMARY_LINE_CHARS - 1] + "…"
    verdict = "ok" if it.verdict is Verdict.ACCEPTED else "rejected"
    return f"- R{it.round} {it.feature or it.kind} {_short(it.commit)} {verdict}: {summary}"


def history(record: MilestoneRecord, recent_in_full: int, reason_tokens: int) -> str:
    """The last rounds in full (a reason up to `reason_tokens`), older ones as one line each
    (every commit stays named)."""
    if not record.iterations:
        return ""
    older = record.iterations[:-recent_in_full]
    recent = record.iterations[-recent_in_full:]
    parts = ["## Previous iterations"]
    if older:
        parts.append("Earlier rounds (one line each):\n" + "\n".join(_one_line(i) for i in older))
    where = _record_hint(record.id)
    parts.extend(_full_round(i, reason_tokens, where) for i in recent)
    return "\n".join(parts) + "\n"


def _file_section(key: str, title: str, text: str | None, cut_order: int | None) -> Section | None:
    if text is None or not text.strip():
        return None
    return Section(key=key, text=f"## {title}\n{text.strip()}\n", cut_order=cut_order)


def check_passed(check: CheckRun) -> str:
    """The Acceptor's paragraph on Anima's own run of the project's checks."""
    return render("check_passed", command=check.command,
                  seconds=f"{check.duration_seconds:.1f}", tail=quoted(check.tail or "(no output)"))


def check_outcome(check: CheckRun) -> str:
    if check.timed_out:
        return f"timed out after {check.duration_seconds:.0f} s"
    return f"exited {check.exit_code}"


def check_failed_feedback(check: CheckRun) -> str:
    """The Developer's feedback after its commit failed the checks (with the output)."""
    claimed = render("feedback_check_claim", claim=check.report_claim,
                     command=check.command) if check.report_claim else ""
    return render("feedback_check_failed", command=check.command, outcome=check_outcome(check),
                  claim=claimed, tail=quoted(check.tail or "(no output)"))


@dataclass
class DeveloperContext:
    """What the scheduler knows at the start of a Developer turn beyond the record."""

    fix_reason: str | None = None
    failed_check: CheckRun | None = None  # the last round failed Anima's run of the checks
    final_rejection: bool = False
    human_note: str | None = None
    recovery_log: str | None = None
    #: why this turn starts a fresh session (a rollover), and the branch's commits for it
    fresh_session: str | None = None
    commit_log: str = ""
    #: a merge round: main moved and the branch conflicts with it in these files
    merge_conflicts: list[str] | None = None


class PromptBuilder:
    """Assembles prompts; keeps a file cache so context files are re-read only on change.

    The budget is measured with the local estimate. With a `counter` (the SDK's token
    counting, when an API key is available) the first Developer prompt is counted once for
    real and the estimate is scaled down if it fell short: one request per milestone, not one
    per round.
    """

    def __init__(self, paths: ProjectPaths, *, budget_tokens: int, recent_in_full: int,
                 counter: ApiTokenCounter | None = None, tree: Path | None = None) -> None:
        self.paths = paths
        #: Where the Developer keeps the memory notes: the milestone's worktree.
        self.tree = tree or paths.root
        self.memory = ProjectPaths(self.tree).memory
        self.budget_tokens = budget_tokens
        self.recent_in_full = recent_in_full
        self.files = FileCache()
        self.counter = counter
        self.scale = 1.0  # estimated tokens per real token, once calibrated (≤ 1)

    def _fit(self, sections: list[Section]) -> str:
        kept = fit_to_budget(sections, int(self.budget_tokens * self.scale))
        text = "\n".join(s.text.rstrip() + "\n" for s in kept)
        counter, self.counter = self.counter, None  # calibrate once
        if counter is not None and counter.available and (real := counter.count(text)):
            self.scale = min(1.0, estimate_tokens(text) / real)
            if self.scale < 1.0:
                return self._fit(sections)
        return text

    def soul(self) -> str:
        text = self.files.read(self.paths.soul)
        return f"## Soul — quality standards and red lines\n{text.strip()}\n" if text else ""

    def developer(self, record: MilestoneRecord, ctx: DeveloperContext) -> str:
        completed = [f"{f.id} {f.title}" for f in record.features
                     if f.status is FeatureStatus.DONE]
        round_no = record.rounds + 1
        header = render("developer_turn", title=record.title, milestone_id=record.id,
                        round=round_no, branch=record.branch_name,
                        main_branch=record.main_branch, base_commit=record.base_commit,
                        accepted=record.iteration_count,
                        completed=", ".join(completed) or "none yet")
        feedback = []
        share = self.budget_tokens // FEEDBACK_SHARE
        where = _record_hint(record.id)
        if ctx.recovery_log is not None:
            log = clip(ctx.recovery_log.strip(), share, "`git log --oneline` shows them all.")
            feedback.append(render("recovery", rounds=record.rounds,
                                   accepted=record.iteration_count, branch=record.branch_name,
                                   log=log or "(no commits yet)"))
        if ctx.fresh_session is not None:
            log = clip(ctx.commit_log.strip(), share, "`git log --oneline` shows them all.")
            feedback.append(render("fresh_session", reason=ctx.fresh_session,
                                   branch=record.branch_name, log=log or "(no commits yet)"))
        if ctx.failed_check is not None:
            feedback.append(check_failed_feedback(ctx.failed_check))
        elif ctx.fix_reason:
            name = "feedback_final_rejection" if ctx.final_rejection else "feedback_rejection"
            feedback.append(render(name, reason=clip(ctx.fix_reason, share, where)))
        if ctx.human_note:
            feedback.append(render("feedback_human_note",
                                   note=clip(ctx.human_note, share, where)))
        if ctx.merge_conflicts is not None:
            task = render("task_merge", main_branch=record.main_branch, branch=record.branch_name,
                          files=_files(ctx.merge_conflicts))
        elif ctx.fix_reason:
            task = render("task_fix")
        elif ctx.human_note and record.features_done == len(record.features):
            task = render("task_changes")  # you requested changes after the whole was done
        else:
            task = render("task_next_feature")
        sections = [
            Section("header", header, None),
            _file_section("vision", "Project vision (VISION.md)",
                          # a merged branch can make it a link (to `~/.ssh/…`): none is followed
                          self.files.read(self.paths.vision, within=self.paths.root), 2),
            Section("soul", self.soul(), None) if self.soul() else None,
            _file_section("milestone", f"Milestone definition ({_md(record.id)})",
                          self.files.read(self.paths.milestone_md(record.id)), 4),
            _file_section("memory", f"Project memory ({RELATIVE.memory.as_posix()})",
                          self.files.read(self.memory, within=self.tree), 1),
            Section("history", history(record, self.recent_in_full,
                                       self.budget_tokens // HISTORY_REASON_SHARE), 3),
            Section("checklist", checklist(record), None),
            Section("feedback", "\n".join(feedback), None),
            Section("task", render("developer_task", task=task.strip(), branch=record.branch_name,
                                   report_format=DEVELOPER_REPORT.instruction(round=round_no)),
                    None),
        ]
        return self._fit([s for s in sections if s and s.text.strip()])

    def _fit_pasted(self, name: str, pasted: list[Section], **values: object) -> str:
        """Render template `name` with the `pasted` texts (agent reports, commit lists…)
        trimmed so the whole prompt fits the budget; the rest of the template is never cut."""
        fixed = estimate_tokens(render(name, **values, **{s.key: "" for s in pasted}))
        room = max(int(self.budget_tokens * self.scale) - fixed - _SLACK_TOKENS, 0)
        kept = fit_to_budget(pasted, room)
        return render(name, **values, **{s.key: quoted(s.text) if s.key in _QUOTED else s.text
                                         for s in kept})

    def acceptor_review(self, record: MilestoneRecord, *, report: str, feature: str | None,
                        commit: str, previous_head: str, commits: str,
                        checks: str = "") -> str:
        f = record.feature(feature)
        if f is None:
            label = "(the report names no known feature)"
            criteria = "Judge the change against the milestone as a whole and the soul." + \
                _requested(record)
        else:
            label = f"{f.id} — {f.title}"
            criteria = ("\n".join(f"- {c}" for c in f.criteria) if f.criteria
                        else "(this feature has no explicit criteria: judge it by its title, "
                             "the milestone's goal and the soul)")
        read_it = f"{transcript_hint(record.id)} Read the commit itself: `git show {commit}`."
        pasted = [Section("report", report.strip(), 1, read_it),
                  Section("commits", commits.strip() or "(none)", 2,
                          f"`git log --oneline {previous_head}..{commit}` shows them all."),
                  Section("criteria", criteria, 3, f"See {_md(record.id)}.")]
        return self._fit_pasted("acceptor_review", pasted, round=record.rounds + 1,
                                title=record.title, milestone_id=record.id,
                                branch=record.branch_name, soul=self.soul(),
                                feature_label=label, commit=commit,
                                previous_head=previous_head, base_commit=record.base_commit,
                                checks=checks, verdict_format=VERDICT.instruction(
                                    accepted_note="", reason="the specific reason, citing which "
                                    "criterion or standard is not met"))

    def acceptor_merge(self, record: MilestoneRecord, *, report: str, commit: str,
                       previous_head: str, commits: str, conflicts: list[str],
                       checks: str = "") -> str:
        """The review of a merge round: the resolution of main's conflicts, nothing else."""
        pasted = [Section("report", report.strip(), 1, f"Read the merge: `git show {commit}`."),
                  Section("commits", commits.strip() or "(none)", 2,
                          f"`git log --oneline {previous_head}..{commit}` shows them all.")]
        return self._fit_pasted("acceptor_merge", pasted, round=record.rounds + 1,
                                title=record.title, milestone_id=record.id,
                                branch=record.branch_name, main_branch=record.main_branch,
                                files=_files(conflicts), soul=self.soul(), commit=commit,
                                previous_head=previous_head, checks=checks,
                                verdict_format=VERDICT.instruction(
                                    accepted_note="", reason="what the resolution lost or "
                                    "broke, file by file"))

    def acceptor_final(self, record: MilestoneRecord, *, report: str, commits: str,
                       checks: str = "") -> str:
        criteria = ("\n".join(f"- [ ] {c}" for c in record.acceptance_criteria) or
                    "(the milestone lists no acceptance criteria: judge it by its goal and "
                    "features)") + _requested(record)
        read_it = (f"{transcript_hint(record.id)} Read the commits themselves: "
                   f"`git log -p {record.base_commit}..{record.branch_name}`.")
        pasted = [Section("report", report.strip(), 1, read_it),
                  Section("commits", commits.strip() or "(none)", 2,
                          f"`git log --oneline {record.base_commit}..{record.branch_name}` "
                          "shows them all."),
                  Section("criteria", criteria, 3, f"See {_md(record.id)}.")]
        return self._fit_pasted("acceptor_final", pasted, title=record.title,
                                milestone_id=record.id, branch=record.branch_name,
                                soul=self.soul(),
                                checklist=checklist(record).split("\n", 1)[1].strip(),
                                base_commit=record.base_commit, checks=checks,
                                verdict_format=VERDICT.instruction(
                                    accepted_note=" — every criterion is met",
                                    reason="each unmet criterion and why"))


def _requested(record: MilestoneRecord) -> str:
    """The changes the human asked for after reviewing the milestone, as criteria."""
    asked = record.requested_changes
    return ("\n\nThe human who reviewed the milestone asked for these changes; each must be "
            "made:\n" + "\n".join(f"- [ ] {a}" for a in asked)) if asked else ""


def _files(paths: list[str]) -> str:
    """The conflicting files, as a prompt names them."""
    return ", ".join(f"`{p}`" for p in paths[:20]) + (
        f" and {len(paths) - 20} more" if len(paths) > 20 else "") if paths else "(unknown files)"
