"""The prompt budget: estimate tokens, trim the least important sections, cache source files.

Prompts are built every round from the soul, vision, milestone, memory, checklist, history and
the task. They must stay inside `context_budget_tokens` without ever losing what matters
(the soul, the task instructions, the checklist), and building them must cost a few
milliseconds, so the estimate is local and character-based and files are re-read only when
they change (seed 001: "cache code_law.md, re-read only when its mtime changes").
"""

from __future__ import annotations

import os
import re
import stat
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from anima.atomic import read_regular

__all__ = [
    "ApiTokenCounter",
    "FileCache",
    "Section",
    "clip",
    "estimate_tokens",
    "fit_to_budget",
    "trim_marker",
]

# CJK ideographs, kana, hangul, CJK punctuation and full-width forms: about one token each.
_CJK = re.compile(
    "[\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31ff"
    "\u3200-\u9fff\ua960-\ua97f\uac00-\ud7ff\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef"
    "\U00020000-\U0003ffff]"
)
# A trimmed section keeps at least its first line, capped so a one-line section can shrink.
_MAX_HEADING_CHARS = 200
# When trimming, end at a line break if one lies this close before the cut point.
_SNAP_TO_LINE_CHARS = 400
# More of a prompt file than any budget keeps (a few hundred thousand tokens at most).
_MAX_READ = 4 * 2**20


def estimate_tokens(text: str) -> int:
    """A cheap token estimate: ~4 characters a token, ~1 token per CJK character.

    Close enough for budgeting (real tokenizers land within ~20% on English prose and code);
    it is local and O(n) in C, so prompts can be measured every round without a request.
    """
    if not text:
        return 0
    n = len(text)
    if text.isascii():
        return (n + 3) // 4
    cjk = len(_CJK.findall(text))
    return cjk + (n - cjk + 3) // 4


@dataclass(frozen=True)
class Section:
    """One titled block of a prompt; `cut_order=None` means it is never trimmed.

    `where` completes the trim marker: where the agent finds the whole text.
    """

    key: str
    text: str
    cut_order: int | None
    where: str = ""


def trim_marker(omitted_chars: int, where: str = "") -> str:
    """The visible line that replaces trimmed text, so both agents know something is missing
    (and, with `where`, where the whole of it is)."""
    return (f"[… trimmed to fit the context budget: {omitted_chars} characters omitted …]"
            + (f" {where}" if where else ""))


def _heading_len(text: str) -> int:
    newline = text.find("\n", 0, _MAX_HEADING_CHARS)
    return newline + 1 if newline != -1 else min(len(text), _MAX_HEADING_CHARS)


def _trimmed(text: str, keep: int, where: str = "") -> str:
    kept = text[:keep]
    sep = "" if kept.endswith("\n") or not kept else "\n"
    end = "\n" if text.endswith("\n") else ""
    return f"{kept}{sep}{trim_marker(len(text) - keep, where)}{end}"


def _trim_to(text: str, allowed_tokens: int, where: str = "") -> str:
    """The longest head of `text` (at least its heading) plus marker within `allowed_tokens`."""
    head = _heading_len(text)
    lo, hi = head, len(text) - 1  # keeping everything is not a trim
    if hi < lo or estimate_tokens(_trimmed(text, lo, where)) > allowed_tokens:
        return _trimmed(text, min(head, len(text)), where)
    while lo < hi:  # largest keep with estimate <= allowed (estimate grows with keep)
        mid = (lo + hi + 1) // 2
        if estimate_tokens(_trimmed(text, mid, where)) <= allowed_tokens:
            lo = mid
        else:
            hi = mid - 1
    keep = lo
    newline = text.rfind("\n", head, keep)
    if newline != -1 and keep - newline <= _SNAP_TO_LINE_CHARS:
        keep = newline + 1
    return _trimmed(text, keep, where)


def clip(text: str, max_tokens: int, where: str = "") -> str:
    """`text` itself if it fits `max_tokens`, else its head and a marker line naming `where`
    the whole text is: for one pasted piece (a report, a reason) that must not crowd out the
    rest of a prompt."""
    if estimate_tokens(text) <= max_tokens:
        return text
    return _trim_to(text, max_tokens, where)


def fit_to_budget(sections: Sequence[Section], budget_tokens: int) -> list[Section]:
    """Return the sections, in order, trimmed so their estimated total fits `budget_tokens`.

    The cuttable section with the lowest `cut_order` (ties: the earlier one) is trimmed first,
    from its end, keeping its heading and beginning and adding a marker line; only if that
    section is down to heading + marker does the next one get trimmed. Sections with
    `cut_order=None` are never touched, so the result may still exceed the budget when they
    alone do (the caller can check with `estimate_tokens`). Tokens of the separators the caller
    joins sections with are not counted; keep some slack in the budget for them.
    """
    result = list(sections)
    sizes = [estimate_tokens(s.text) for s in result]
    total = sum(sizes)
    if total <= budget_tokens:
        return result
    order = sorted((s.cut_order, i) for i, s in enumerate(result) if s.cut_order is not None)
    for _, i in order:
        if total <= budget_tokens:
            break
        section = result[i]
        if not section.text:
            continue
        allowed = sizes[i] - (total - budget_tokens)
        text = _trim_to(section.text, allowed, section.where)
        new_size = estimate_tokens(text)
        if new_size >= sizes[i]:
            continue  # too short to gain anything by trimming
        result[i] = replace(section, text=text)
        total += new_size - sizes[i]
        sizes[i] = new_size
    return result


def _really_within(path: Path, folder: Path) -> bool:
    """Whether `path` resolves to itself under `folder` (no link on the way from there)."""
    try:
        rel = path.relative_to(folder)
    except ValueError:
        return False
    return os.path.realpath(path) == os.path.join(os.path.realpath(folder), rel)


class FileCache:
    """Reads text files, re-reading one only when its (mtime_ns, size) changed.

    Prompts are rebuilt every round from the same few files; most rounds change none of them.
    Thread-safe. A file rewritten within the same mtime tick and with the same size is not
    noticed; on file systems with nanosecond timestamps that does not happen in practice.
    """

    def __init__(self) -> None:
        self._entries: dict[Path, tuple[int, int, str]] = {}
        self._lock = threading.Lock()
        self.reads = 0  # how many times a file was actually read (for tests and stats)

    def read(self, path: Path, within: Path | None = None) -> str | None:
        """The file's text (UTF-8, undecodable bytes replaced, the first `_MAX_READ` bytes), or
        None if it is not a regular file: the Developer writes these files, and a FIFO or a
        link to /dev/zero in their place would hang Anima or fill its memory.

        `within`: a folder the file must really be in, reached through no symbolic link
        from there. Anima reads outside the sandbox: a link the Developer left in its
        worktree (to `~/.ssh/id_rsa`) would put a file it cannot read into its prompt."""
        path = Path(path)
        if within is not None and not _really_within(path, within):
            return None
        try:
            st = os.stat(path)
        except OSError:
            st = None
        if st is None or not stat.S_ISREG(st.st_mode):
            with self._lock:
                self._entries.pop(path, None)
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            entry = self._entries.get(path)
            if entry is not None and entry[:2] == stamp:
                return entry[2]
        try:
            data = read_regular(path, _MAX_READ)
        except OSError:
            return None
        if within is not None and not _really_within(path, within):  # swapped meanwhile
            return None
        text = data.decode("utf-8", errors="replace")
        with self._lock:
            self.reads += 1
            self._entries[path] = (*stamp, text)
        return text


class ApiTokenCounter:
    """Exact token counts from the Messages API (`count_tokens`), for when a key is available.

    Optional and never on the hot path: prompt building uses `estimate_tokens`. Useful to
    report the real size of a built prompt or to check the estimate. Returns None whenever the
    count is unavailable (no key, network error, timeout), so callers fall back to the estimate.
    """

    def __init__(self, model: str, env: Mapping[str, str] | None = None,
                 timeout_seconds: float = 5.0) -> None:
        env = os.environ if env is None else env
        self._model = model
        self._api_key = env.get("ANTHROPIC_API_KEY") or None
        self._base_url = env.get("ANTHROPIC_BASE_URL") or None
        self._timeout = timeout_seconds
        self._client: Any = None  # anthropic.Anthropic, imported lazily (it is slow to import)

    @property
    def available(self) -> bool:
        return self._api_key is not None

    def count(self, text: str) -> int | None:
        if self._api_key is None:
            return None
        try:
            import anthropic

            if self._client is None:
                self._client = anthropic.Anthropic(api_key=self._api_key,
                                                   base_url=self._base_url,
                                                   timeout=self._timeout, max_retries=0)
            result = self._client.messages.count_tokens(
                model=self._model, messages=[{"role": "user", "content": text}])
            return int(result.input_tokens)
        except Exception:  # any failure means "unknown"; the estimate is used instead
            return None

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
