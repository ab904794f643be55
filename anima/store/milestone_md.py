"""Parse a human-written milestone (`.anima/milestones/<id>.md`) into a typed definition.

Milestones are parsed from markdown-it-py tokens, never with line regexes over the whole
file: a `## …` line inside a code fence (the M4 seed carries report templates like that) is
content, not structure. Section texts are sliced from the original source with the tokens'
line maps, so they keep their Markdown exactly as the human wrote it.

The parser is pure (no global mutable state, no I/O except in `load_milestone`) and cheap
enough to be re-run on every scan of the milestones folder.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from anima.atomic import read_regular
from anima.errors import MilestoneError
from anima.store.definitions import FeatureDef, FrontMatterValue, MilestoneDef
from anima.store.names import MILESTONE_ID_RE, validate_milestone_id

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from markdown_it.token import Token

__all__ = ["SECTION_ALIASES", "load_milestone", "parse_milestone"]

SectionKind = Literal["goal", "features", "acceptance", "constraints"]

# Normalised heading text (lower-case, no numbering, no trailing colon) -> section.
SECTION_ALIASES: MappingProxyType[str, SectionKind] = MappingProxyType({
    "goal": "goal", "goals": "goal", "objective": "goal", "objectives": "goal",
    "目标": "goal", "里程碑目标": "goal",
    "features": "features", "feature": "features", "feature list": "features",
    "features list": "features", "功能": "features", "功能列表": "features",
    "功能清单": "features", "特性": "features",
    "acceptance criteria": "acceptance", "acceptance criterion": "acceptance",
    "acceptance": "acceptance", "验收标准": "acceptance", "验收条件": "acceptance",
    "验收": "acceptance",
    "constraints": "constraints", "constraint": "constraints", "约束": "constraints",
    "约束条件": "constraints", "限制": "constraints", "限制条件": "constraints",
})


# ------------------------------------------------------------------ front matter

_FM_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_TRUE = frozenset({"true", "yes", "on"})
_FALSE = frozenset({"false", "no", "off"})
_NULL = frozenset({"", "null", "~"})


def _scalar(raw: str) -> FrontMatterValue:
    """A tiny YAML-ish scalar: bools, null, ints, floats, optionally quoted strings."""
    value = raw.strip()
    low = value.lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    if low in _NULL:
        return None
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        return value[1:-1]
    if re.fullmatch(r"[+-]?\d+", value):
        return int(value)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+)([eE][+-]?\d+)?", value):
        return float(value)
    return value


#: The keys Anima reads. Any other is the human's own (kept, not acted on), unless it reads
#: like a misspelling of one of these: `requires_human_reveiw: true` ignored would merge the
#: milestone without the review it asks for.
_KNOWN_KEYS = ("requires_human_review", "depends_on")
_NEAR_KNOWN = re.compile(r"review|depend|require", re.IGNORECASE)


def _check_key(key: str, line: int, path: Path) -> None:
    if key in _KNOWN_KEYS:
        return
    near = difflib.get_close_matches(key.lower().replace("-", "_"), _KNOWN_KEYS, n=1,
                                     cutoff=0.7)
    if near or _NEAR_KNOWN.search(key):
        meant = f"did you mean {near[0]!r}? " if near else ""
        raise MilestoneError(path, f"front matter line {line}: unknown key {key!r}; {meant}"
                                   f"Anima reads {' and '.join(_KNOWN_KEYS)} (a misspelt key "
                                   "would be ignored)")


def _split_front_matter(
    lines: list[str], path: Path
) -> tuple[dict[str, FrontMatterValue], int]:
    """Parse a leading `---` … `---` block (blank lines before it are allowed); return it
    and how many lines it spans, the blank ones included."""
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    if first == len(lines) or lines[first].strip() != "---":
        return {}, 0
    end = next((i for i in range(first + 1, len(lines))
                if lines[i].strip() in ("---", "...")), None)
    if end is None:
        raise MilestoneError(path, f"front matter opened with '---' on line {first + 1} is "
                                   "never closed (add a '---' line after the last 'key: value' "
                                   "line)")
    data: dict[str, FrontMatterValue] = {}
    for lineno in range(first + 1, end):
        line = lines[lineno]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not _FM_KEY_RE.fullmatch(key) or line[:1].isspace():
            raise MilestoneError(
                path, f"front matter line {lineno + 1}: expected a simple 'key: value' line, "
                      f"got {line.strip()!r}")
        if key in data:
            raise MilestoneError(path, f"front matter line {lineno + 1}: duplicate key {key!r}")
        _check_key(key, lineno + 1, path)
        data[key] = _scalar(value)
    review = data.get("requires_human_review")
    if review is not None and not isinstance(review, bool):
        raise MilestoneError(
            path, f"front matter: 'requires_human_review' must be true or false, got {review!r}")
    return data, end + 1


def _depends_on(value: FrontMatterValue, path: Path) -> tuple[str, ...]:
    """`depends_on: [a, b]` (or `a, b`, or one id): milestone ids, each a valid name. One
    naming its own milestone reads: it is a cycle of one, reported with the milestone listed
    (`anima.store.dependencies`), as a longer cycle is."""
    if value is None:
        return ()
    text = str(value).strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    ids = [part.strip().strip("'\"") for part in text.split(",")]
    ids = [i for i in ids if i]
    for milestone_id in ids:
        if not MILESTONE_ID_RE.fullmatch(milestone_id):
            raise MilestoneError(path, f"front matter: 'depends_on' names {milestone_id!r}, "
                                       "which is not a milestone id (a file name's stem such as "
                                       "'auth-api'); write depends_on: [id, …]")
    return tuple(dict.fromkeys(ids))


# ------------------------------------------------------------------ token helpers


def _new_parser() -> MarkdownIt:
    # A fresh instance per parse (~0.1 ms) keeps the module free of shared state. Imported
    # here: `anima status` reads records, not definitions, and markdown-it costs 16 ms to load.
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable("table")


def _plain(inline: Token) -> str:
    """Text of an inline token without Markdown markup (for matching heading names)."""
    parts: list[str] = []
    for child in inline.children or ():
        if child.type in ("text", "code_inline"):
            parts.append(child.content)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
        elif child.type == "image":
            parts.append(_plain(child))
    return "".join(parts)


def _section_kind(heading: str) -> SectionKind | None:
    """Map a `##` heading to a section, tolerating case, numbering and bilingual headings."""
    norm = re.sub(r"^\s*\d+(?:\.\d+)*[.)、]?\s*", "", heading)
    norm = re.sub(r"\s+", " ", norm).strip().rstrip(":：").strip().lower()
    kind = SECTION_ALIASES.get(norm)
    if kind:
        return kind
    for part in re.split(r"[/|()（）]", norm):  # "Goal / 目标", "Features（功能）"
        kind = SECTION_ALIASES.get(part.strip().rstrip(":：").strip())
        if kind:
            return kind
    return None


def _strip_wrapping_emphasis(text: str) -> str:
    text = text.strip()
    m = re.fullmatch(r"(\*\*|__|\*|_)(.+)\1", text)
    return m.group(2).strip() if m else text


def _close_index(tokens: Sequence[Token], open_idx: int) -> int:
    """Index of the token closing the block opened at `open_idx`."""
    opener = tokens[open_idx]
    close_type = opener.type.replace("_open", "_close")
    for j in range(open_idx + 1, len(tokens)):
        if tokens[j].type == close_type and tokens[j].level == opener.level:
            return j
    return len(tokens) - 1


def _line(tok: Token) -> int:
    """First source line (0-based) of a block token."""
    assert tok.map is not None
    return tok.map[0]


def _first_inline(tokens: Sequence[Token], item_idx: int) -> Token | None:
    """The inline content of a list item's first paragraph, if it starts with one."""
    if (item_idx + 2 < len(tokens) and tokens[item_idx + 1].type == "paragraph_open"
            and tokens[item_idx + 2].type == "inline"):
        return tokens[item_idx + 2]
    return None


def _collapse(text: str) -> str:
    """Soft-wrapped paragraph text on one line."""
    return re.sub(r"[ \t]*\n[ \t]*", " ", text).strip()


_LIST_MARKER_RE = re.compile(r"[ \t]*(?:[-+*]|\d{1,9}[.)])(?:[ \t]+|$)")


def _item_source(lines: list[str], item: Token) -> str:
    """A list item's Markdown with its marker removed and continuation lines dedented."""
    assert item.map is not None
    chunk = [ln.expandtabs(4) for ln in lines[item.map[0]:item.map[1]]]
    m = _LIST_MARKER_RE.match(chunk[0])
    width = m.end() if m else 0
    out = [chunk[0][width:]]
    for ln in chunk[1:]:
        indent = len(ln) - len(ln.lstrip(" "))
        out.append(ln[min(indent, width):])
    return "\n".join(out).strip("\n").rstrip()


# ------------------------------------------------------------ per-feature criteria

_CODE_SPAN_RE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
# A label such as `验收：`, `**验收**：`, `**Acceptance:**`, `Acceptance criteria:`; it must
# stand where a label stands (start of text, after whitespace or punctuation), so that
# `整体验收：` in prose or `验收：` inside a code span is not one.
_MARKER_RE = re.compile(
    r"(?<![^\s.;:,!?。；，：！？、)）\]】>])"
    r"(?P<open>\*\*|__|\*|_)?"
    r"(?:验收(?:标准|条件)?|(?i:acceptance(?:[ \t]+criteria)?)(?![A-Za-z]))"
    r"(?P<close>\*\*|__|\*|_)?[ \t]*[:：]"
)


def _mask_code(text: str) -> str:
    """Same-length text with code spans blanked, so markers and `;` in code don't count."""
    return _CODE_SPAN_RE.sub(lambda m: "\0" * len(m.group(0)), text)


def _find_marker(text: str) -> tuple[int, int] | None:
    """(start, end) of the first acceptance marker outside code spans, else None."""
    masked = _mask_code(text)
    m = _MARKER_RE.search(masked)
    if not m:
        return None
    end = m.end()
    opener = m.group("open")
    if opener and not m.group("close"):  # `**验收：**` — eat the closing emphasis too
        rest = masked[end:]
        stripped = rest.lstrip(" \t")
        if stripped.startswith(opener):
            end += len(rest) - len(stripped) + len(opener)
    return m.start(), end


def _split_items(text: str) -> list[str]:
    """Split `a；b; c` into items, ignoring semicolons inside code spans."""
    masked = _mask_code(text)
    items: list[str] = []
    start = 0
    for m in re.finditer(r"[;；]", masked):
        items.append(text[start:m.start()])
        start = m.end()
    items.append(text[start:])
    return [s for s in (_collapse(i).strip() for i in items) if s]


def _list_items_text(tokens: Sequence[Token], list_idx: int, lines: list[str]) -> list[str]:
    """The direct items of the list opened at `list_idx`, each as one line of text."""
    end = _close_index(tokens, list_idx)
    level = tokens[list_idx].level + 1
    out: list[str] = []
    for j in range(list_idx + 1, end):
        tok = tokens[j]
        if tok.type != "list_item_open" or tok.level != level:
            continue
        inline = _first_inline(tokens, j)
        text = _collapse(inline.content) if inline is not None else _item_source(lines, tok)
        text = _CHECKBOX_RE.sub("", text, count=1).strip()
        if text:
            out.append(text)
    return out


def _feature_criteria(
    tokens: Sequence[Token], start: int, end: int, lines: list[str]
) -> list[str]:
    """Criteria after inline `验收：` / `Acceptance:` markers in tokens[start:end]."""
    criteria: list[str] = []
    for i in range(start, end):
        tok = tokens[i]
        if tok.type != "inline" or tokens[i - 1].type != "paragraph_open":
            continue
        found = _find_marker(tok.content)
        if found is None:
            continue
        rest = tok.content[found[1]:].strip()
        nxt = i + 2  # inline, paragraph_close, then maybe the list that holds the items
        has_list = nxt < end and tokens[nxt].type in ("bullet_list_open", "ordered_list_open")
        if has_list and (not rest or rest.endswith((":", "："))):  # "验收：" / "…all of:"
            criteria.extend(_list_items_text(tokens, nxt, lines))
        elif rest:
            criteria.extend(_split_items(rest))
    return criteria


# --------------------------------------------------------------------- features

_CHECKBOX_RE = re.compile(r"^\[[ xX]\](?:[ \t]+|$)")
_BOLD_LEAD_RE = re.compile(r"(\*\*|__)(.+?)\1[ \t]*(?:[:：]|[—–-]+[ \t]|$)")


def _item_title(first_line: str) -> str:
    """Title of a list-item feature: its first line, or the bold lead-in (`**X**: …`)."""
    m = _BOLD_LEAD_RE.match(first_line.strip())
    if m:
        return m.group(2).strip().rstrip(":：").strip()
    found = _find_marker(first_line)
    if found is not None and found[0] > 0:
        first_line = first_line[:found[0]]
    return _strip_wrapping_emphasis(first_line.strip().rstrip(" \t—–-:：,，"))


def _features_from_headings(
    tokens: Sequence[Token], heads: list[int], end: int, end_line: int, lines: list[str],
    path: Path,
) -> list[FeatureDef]:
    features: list[FeatureDef] = []
    for n, h in enumerate(heads):
        stop, stop_line = end, end_line
        if n + 1 < len(heads):
            stop = heads[n + 1]
            stop_line = _line(tokens[stop])
        head = tokens[h]
        assert head.map is not None
        title = _strip_wrapping_emphasis(tokens[h + 1].content)
        if not title:
            raise MilestoneError(path, f"line {head.map[0] + 1}: a feature heading is empty")
        body = "\n".join(lines[head.map[1]:stop_line]).strip("\n").rstrip()
        features.append(FeatureDef(
            id=f"F{n + 1}", title=title, body=body,
            criteria=_feature_criteria(tokens, h + 3, stop, lines),
        ))
    return features


def _features_from_items(
    tokens: Sequence[Token], start: int, end: int, lines: list[str], path: Path
) -> list[FeatureDef]:
    features: list[FeatureDef] = []
    for i in range(start, end):
        tok = tokens[i]
        if tok.type != "list_item_open" or tok.level != 1:
            continue
        assert tok.map is not None
        body = _item_source(lines, tok)
        inline = _first_inline(tokens, i)
        first = inline.content.split("\n", 1)[0] if inline is not None else body.split("\n", 1)[0]
        title = _item_title(first)
        if not title:
            raise MilestoneError(path, f"line {tok.map[0] + 1}: a feature list item is empty")
        features.append(FeatureDef(
            id=f"F{len(features) + 1}", title=title, body=body,
            criteria=_feature_criteria(tokens, i + 1, _close_index(tokens, i), lines),
        ))
    return features


def _acceptance_criteria(tokens: Sequence[Token], start: int, end: int) -> list[str]:
    """Checkbox items (any depth); plain top-level items if the section has no checkbox."""
    checked: list[str] = []
    plain: list[str] = []
    for i in range(start, end):
        tok = tokens[i]
        if tok.type != "list_item_open":
            continue
        inline = _first_inline(tokens, i)
        if inline is None:
            continue
        m = _CHECKBOX_RE.match(inline.content)
        if m:
            text = _collapse(inline.content[m.end():])
            if text:
                checked.append(text)
        elif tok.level == 1 and inline.content.strip():
            plain.append(_collapse(inline.content))
    return checked or plain


# ------------------------------------------------------------------------ parse


#: Sections of which a second would be dropped unread: its features never built, its
#: criteria never checked.
_ONE_ONLY: dict[SectionKind | None, str] = {"features": "Features",
                                            "acceptance": "Acceptance Criteria"}


class _Section:
    __slots__ = ("end", "end_line", "kind", "start", "start_line")

    def __init__(self, kind: SectionKind | None, start: int, start_line: int) -> None:
        self.kind = kind
        self.start = start  # first token after the heading
        self.start_line = start_line  # first source line after the heading
        self.end = start
        self.end_line = start_line


def parse_milestone(text: str, path: Path) -> MilestoneDef:
    """Parse milestone Markdown; `path` only names the file in errors."""
    if not text.strip():
        raise MilestoneError(path, "the file is empty (a milestone needs '# Title' and "
                                   "'## Features')")
    normal = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = normal.split("\n")
    front_matter, skip = _split_front_matter(lines, path)
    # Blank out the front matter instead of cutting it, so token line maps index `lines`.
    body = "\n" * skip + "\n".join(lines[skip:])
    tokens = _new_parser().parse(body)

    title: str | None = None
    sections: list[_Section] = []
    current: _Section | None = None
    for i, tok in enumerate(tokens):
        if tok.type != "heading_open" or tok.level != 0 or tok.tag not in ("h1", "h2"):
            continue
        assert tok.map is not None
        if current is not None:
            current.end, current.end_line = i, tok.map[0]
            current = None
        if tok.tag == "h1":
            if not title:  # the first non-empty h1 names the milestone
                title = _strip_wrapping_emphasis(tokens[i + 1].content)
            continue
        current = _Section(_section_kind(_plain(tokens[i + 1])), i + 3, tok.map[1])
        sections.append(current)
    if current is not None:
        current.end, current.end_line = len(tokens), len(lines)

    if not title:
        raise MilestoneError(path, "no title: the milestone must have a '# Title' heading")

    found: dict[SectionKind, _Section] = {}
    for sec in sections:
        if sec.kind in _ONE_ONLY and sec.kind in found:  # its features would be dropped
            raise MilestoneError(path, f"line {sec.start_line}: a second "
                                       f"'{_ONE_ONLY[sec.kind]}' section; Anima reads one: "
                                       "move what it lists into the first")
        if sec.kind is not None and sec.kind not in found:  # the first one of a kind wins
            found[sec.kind] = sec

    def section_text(kind: SectionKind) -> str:
        sec = found.get(kind)
        if sec is None:
            return ""
        return "\n".join(lines[sec.start_line:sec.end_line]).strip("\n").rstrip()

    feats = found.get("features")
    if feats is None:
        raise MilestoneError(path, "no '## Features' section (also accepted: 'Feature list', "
                                   "'功能', '功能列表')")
    heads = [i for i in range(feats.start, feats.end)
             if tokens[i].type == "heading_open" and tokens[i].level == 0
             and tokens[i].tag == "h3"]
    if heads:
        features = _features_from_headings(tokens, heads, feats.end, feats.end_line, lines, path)
    else:
        features = _features_from_items(tokens, feats.start, feats.end, lines, path)
    if not features:
        raise MilestoneError(path, "the Features section lists no features: give each one a "
                                   "'### Title' heading, or write them as top-level list items")

    acc = found.get("acceptance")
    review = front_matter.get("requires_human_review")
    return MilestoneDef(
        title=title,
        goal=section_text("goal"),
        features=features,
        acceptance_criteria=_acceptance_criteria(tokens, acc.start, acc.end) if acc else [],
        constraints=section_text("constraints"),
        front_matter=front_matter,
        requires_human_review=review if isinstance(review, bool) else None,
        depends_on=_depends_on(front_matter.get("depends_on"), path),
        source=text,
    )


def load_milestone(path: Path) -> MilestoneDef:
    """Validate the id (file stem), read the file as UTF-8 and parse it."""
    validate_milestone_id(path.stem, path)
    try:
        raw = read_regular(path)
    except OSError as e:
        raise MilestoneError(path, f"cannot read: {e.strerror or e}") from e
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MilestoneError(
            path, f"not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                  "save the file as UTF-8") from e
    return parse_milestone(text, path)
