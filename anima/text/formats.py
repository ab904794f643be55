"""The formats the agents reply in: the Developer's report and the Acceptor's verdict.

Each format is one object (`DEVELOPER_REPORT`, `VERDICT`) that owns the three things that must
agree: the instruction the prompt gives the agent (a template in `resources/prompts/format_*.md`),
the parser the loop reads the reply with, and the matcher the agent pane highlights lines with.
A new format is a new object here and a new template; nothing else restates it.

Real models wrap the formats in Markdown, bold, code fences and chatter, so parsing looks
for the fields, not for an exact layout. `None` means "could not read it": the scheduler
then asks the agent once to restate.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from string import Template
from typing import Generic, TypeVar

from anima.paths import resource

_DECORATION = re.compile(r"\*+|(?<!\w)__|__(?!\w)|[`>#]+")
_FEATURE_ID = re.compile(r"\bF(\d+)\b")
_HEX = re.compile(r"\b([0-9a-f]{7,40})\b")
# Possessive runs (`*+`) throughout: the agents write these lines, and optional runs side by
# side (`\s*[-*]?\s*\**\s*`) split a line of spaces every way before they fail, which takes
# cubic time (seconds for a thousand spaces, days for a megabyte).
_FIELD = re.compile(r"^[\s*-]*+(feature|commit|tests|lint|round)[\s*]*+[:：][\s*]*+(.*)$",
                    re.IGNORECASE)
_REPORT_HEADING = re.compile(r"implementation\s+report(?:\s*[—–-]\s*round\s*(\d+))?",
                             re.IGNORECASE)
#: Section names, as the prompt asks for them and as a Chinese-speaking agent may write them.
_CHANGES = ("change", "变更", "改动", "修改")
_NOTES = ("note", "summary", "说明", "备注", "总结")
_SECTION = re.compile(r"^\s*+#{2,4}(.+)$")  # the name is the rest, stripped
_BULLET = re.compile(r"^\s*+[-*]\s++(.*)$")
_NO_FAILURES = re.compile(r"\b(?:0|no|zero)\s+(?:tests?\s+)?(?:failed|failures?|failing|errors?)\b")
_BAD_NEWS = re.compile(r"fail|error|not\b|n't|skip|broken|red\b|unable|could ?not|todo")
_GOOD_NEWS = re.compile(r"\b(?:pass(?:ed|es|ing)?|green|ok|succe(?:eded|ss(?:ful)?))\b")
# A verdict line: decoration, a bullet, a check mark or cross (which must agree with the
# word), an optional "Verdict:", the word, then nothing or a separator and a reason. Other
# leading marks ("- [ ] ACCEPTED", "¬ACCEPTED") make it no verdict, and so do a question
# mark or a cross after the word ("ACCEPTED?", "ACCEPTED ❌").
_VERDICT = re.compile(
    r"^[\s*_#`>•-]*+(?P<mark>✅|✔️?|☑️?|❌|✖️?|⛔|🚫)?[\s*_`]*+"
    r"(?:(?:final\s++)?verdict\s*+[:：][\s*_`]*+)?(?P<word>ACCEPTED|REJECTED)\b[^\w?？❌✖⛔🚫]*?"
    r"(?:[:：\-—–]\s*(?P<rest>.*))?$",
    re.IGNORECASE,
)
_ACCEPT_MARKS = ("✅", "✔", "☑")
# An ACCEPTED that takes itself back: "ACCEPTED: no — …", "ACCEPTED -> REJECTED", "not yet".
_TAKEN_BACK = re.compile(r"^\W*+(?:not\b|no\b(?!\s+\w)|.*\breject)", re.IGNORECASE)
# The completion signal: the line itself, not words in a sentence ("not all features
# complete yet" is an implementation report's note).
_COMPLETION_LINE = re.compile(
    r"^[\s#>*_`-]*+(ALL_FEATURES_COMPLETE\b|all[_ ]features[_ ]complete[\s.!*_`]*+$)",
    re.IGNORECASE)


class ReportKind(StrEnum):
    IMPLEMENTATION = "implementation"
    ALL_COMPLETE = "all_complete"


@dataclass(frozen=True)
class DeveloperReport:
    kind: ReportKind
    text: str
    round: int | None = None
    feature: str | None = None
    feature_text: str = ""
    commit: str | None = None
    tests: str = ""
    lint: str = ""
    changes: list[str] = field(default_factory=list)
    notes: str = ""
    commits: list[str] = field(default_factory=list)
    summary: str = ""

    def claimed_tests_passed(self) -> str | None:
        """The report's claim that the tests passed (its words), or None when it made none.

        The `Tests:` field of an implementation report; a completion report's lines that
        mention tests. "12 passed, 0 failed" claims; "3 failed", "not run" do not."""
        if self.kind is ReportKind.IMPLEMENTATION:
            candidates = [self.tests]
        else:
            candidates = [_clean(line).lstrip("-+ ") for line in self.text.splitlines()
                          if "test" in line.lower()]
        for claim in candidates:
            low = _NO_FAILURES.sub("", claim.lower())
            if _GOOD_NEWS.search(low) and not _BAD_NEWS.search(low):
                return claim.strip()
        return None


@dataclass(frozen=True)
class ReviewVerdict:
    accepted: bool
    reason: str = ""


def _clean(line: str) -> str:
    return _DECORATION.sub("", line).strip()


def _sections(lines: list[str]) -> dict[str, list[str]]:
    """Lines grouped under their `##`/`###` heading (lower-cased, decoration removed)."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in lines:
        m = _SECTION.match(line)
        if m:
            current = _clean(m.group(1).strip()).lower()
            out.setdefault(current, [])
        elif current:
            out[current].append(line)
    return out


def _bullets(lines: list[str]) -> list[str]:
    return [_clean(m.group(1)) for line in lines if (m := _BULLET.match(line))]


def _strip_fences(text: str) -> list[str]:
    """The report's own lines. A report wrapped in a fence (chatter around it or not) is
    still a report: the fence lines go, the content stays. But when the report is outside
    the fences, a fenced block is content, whose `## …` lines are not sections."""
    outside: list[str] = []
    every: list[str] = []
    fenced = False
    for line in text.splitlines():
        if line.strip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        every.append(line)
        if not fenced:
            outside.append(line)
    structured = any(_FIELD.match(line) or _SECTION.match(line) for line in outside)
    return outside if structured else every


def read_developer_report(text: str) -> DeveloperReport:
    """Whatever the reply holds of a report, leniently (fields may be missing): what the
    summarizer makes a round's summary from, whether or not the reply followed the format."""
    lines = _strip_fences(text)
    sections = _sections(lines)
    if any(_COMPLETION_LINE.match(line) for line in text.splitlines()):
        commit_lines = next((v for k, v in sections.items() if k.startswith("commit")), [])
        commits = [m.group(1) for b in _bullets(commit_lines) if (m := _HEX.search(b))]
        summary_lines = next((v for k, v in sections.items() if k.startswith("summary")), [])
        return DeveloperReport(kind=ReportKind.ALL_COMPLETE, text=text, commits=commits,
                               summary="\n".join(summary_lines).strip())
    fields: dict[str, str] = {}
    for line in lines:
        m = _FIELD.match(line)
        if m and m.group(1).lower() not in fields:
            fields[m.group(1).lower()] = _clean(m.group(2))
    heading = _REPORT_HEADING.search(text)
    commit_match = _HEX.search(fields.get("commit", "").lower())
    round_no = heading.group(1) if heading and heading.group(1) else fields.get("round")
    feature_text = fields.get("feature", "")
    feature = _FEATURE_ID.search(feature_text)
    changes = next((v for k, v in sections.items() if k.startswith(_CHANGES)), [])
    notes = next((v for k, v in sections.items() if k.startswith(_NOTES)), [])
    return DeveloperReport(
        kind=ReportKind.IMPLEMENTATION,
        text=text,
        round=int(round_no) if round_no and str(round_no).isdigit() else None,
        feature=f"F{feature.group(1)}" if feature else None,
        feature_text=feature_text,
        commit=commit_match.group(1) if commit_match else None,
        tests=fields.get("tests", ""),
        lint=fields.get("lint", ""),
        changes=_bullets(changes),
        notes="\n".join(notes).strip(),
    )


def parse_developer_report(text: str) -> DeveloperReport | None:
    """The report, or None when the reply is not one: an implementation report needs its
    heading or a `Commit:` field, and a feature or a commit."""
    report = read_developer_report(text)
    if report.kind is ReportKind.ALL_COMPLETE:
        return report
    has_commit_field = _has_field(text, "commit")
    if not _REPORT_HEADING.search(text) and not has_commit_field:
        return None
    if not _has_field(text, "feature") and not has_commit_field:
        return None
    return report


def _has_field(text: str, name: str) -> bool:
    return any((m := _FIELD.match(line)) and m.group(1).lower() == name
               for line in _strip_fences(text))


def match_verdict(line: str) -> tuple[bool, str] | None:
    """`(accepted, rest of the line)` if `line` is a verdict line, else None.

    The one matcher for verdict lines: the scheduler reads verdicts with it and the agent
    pane highlights them with it, so both always agree on what counts as a verdict.
    """
    m = _VERDICT.match(line.strip().replace("**", ""))
    if not m:
        return None
    accepted = m["word"].upper() == "ACCEPTED"
    if m["mark"] and m["mark"].startswith(_ACCEPT_MARKS) != accepted:
        return None  # "❌ ACCEPTED" says both
    return accepted, (m["rest"] or "").strip()


def parse_verdict(text: str) -> ReviewVerdict | None:
    """The Acceptor's own verdict line decides; chatter around it is fine.

    Lines quoted with `>` and fenced blocks (where a reviewer quotes the Developer's report,
    which may carry a forged verdict) do not count, unless the whole verdict is fenced: a
    block that ends the reply and opens with the verdict line (a quoted report that ends
    the reply opens with its heading, and one with chatter after it is a quote). A
    reply that gives both verdicts, or an ACCEPTED that takes itself back ("ACCEPTED: no"),
    is unreadable (None: the Acceptor is asked to restate), never an acceptance. A
    rejection's reason is the rest of its line and every line after it (Acceptors write
    "REJECTED: two problems" followed by bullets): the Developer needs all of it.
    """
    lines = text.splitlines()
    fenced = _fenced_lines(lines)
    found = [(i, m) for i, line in enumerate(lines)
             if i not in fenced and not line.lstrip().startswith(">")
             and (m := match_verdict(line))]
    if not found:
        opening = _fenced_verdict_line(lines, fenced)
        if opening is None or (m := match_verdict(lines[opening])) is None:
            return None
        found = [(opening, m)]
    if len({accepted for _, (accepted, _) in found}) > 1:
        return None
    i, (accepted, first) = found[-1]
    if accepted:
        taken_back = any(_TAKEN_BACK.match(rest) for _, (_, rest) in found if rest)
        return None if taken_back else ReviewVerdict(accepted=True)
    after = [x.rstrip() for x in lines[i + 1:]]
    if i in fenced:  # the verdict was fenced: its closing fence is not the reason's
        after = [x for x in after if not x.strip().startswith(("```", "~~~"))]
    reason = "\n".join([first, *after]).strip()
    return ReviewVerdict(accepted=False, reason=reason or "(no reason given)")


def _fenced_lines(lines: list[str]) -> set[int]:
    """Indexes of the lines inside fenced blocks and of the fence lines themselves."""
    inside: set[int] = set()
    fenced = False
    for i, line in enumerate(lines):
        if line.strip().startswith(("```", "~~~")):
            fenced = not fenced
            inside.add(i)
        elif fenced:
            inside.add(i)
    return inside


def _fenced_verdict_line(lines: list[str], fenced: set[int]) -> int | None:
    """The first content line of the fenced block that ends the reply, or None when the
    reply does not end in one."""
    end = len(lines)
    while end and not lines[end - 1].strip():
        end -= 1
    if not end or end - 1 not in fenced:
        return None
    start = end - 1
    while start - 1 in fenced and not lines[start - 1].strip().startswith(("```", "~~~")):
        start -= 1
    return next((i for i in range(start, end)
                 if lines[i].strip() and not lines[i].strip().startswith(("```", "~~~"))), None)


def match_completion(line: str) -> str | None:
    """The completion signal line (`## ALL_FEATURES_COMPLETE`) without its decoration, or None."""
    if not _COMPLETION_LINE.match(line):
        return None
    return line.strip().strip("*_`# ")


@cache
def _template(name: str) -> Template:
    return Template(resource("prompts", f"format_{name}.md").read_text(encoding="utf-8"))


P = TypeVar("P")
M = TypeVar("M")


@dataclass(frozen=True)
class ReplyFormat(Generic[P, M]):
    """One reply format: what the agent is told, how the reply is read, how a line is shown."""

    name: str
    parse: Callable[[str], P | None]
    match: Callable[[str], M | None]

    def instruction(self, **values: object) -> str:
        """The format's instruction for a prompt, from `resources/prompts/format_<name>.md`."""
        return _template(self.name).substitute({k: str(v) for k, v in values.items()}).strip()


DEVELOPER_REPORT: ReplyFormat[DeveloperReport, str] = ReplyFormat(
    "developer_report", parse_developer_report, match_completion)
VERDICT: ReplyFormat[ReviewVerdict, tuple[bool, str]] = ReplyFormat(
    "verdict", parse_verdict, match_verdict)
