"""The transcript text view and the Markdown-ish rendering of what an agent says.

Lines are tuples of (format key, text) runs, built off the document and laid out in bulk by
`TranscriptView`, which keeps a scrollback cap by trimming its oldest lines in blocks (see its
docstring).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from PySide6.QtCore import Qt, QTimer, QTimerEvent, Signal, Slot
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QKeyEvent,
    QMouseEvent,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
    QWheelEvent,
)
from PySide6.QtWidgets import (
    QFrame,
    QPlainTextEdit,
    QWidget,
)

from anima.text.formats import DEVELOPER_REPORT, VERDICT

DEFAULT_MAX_LINES = 20_000
MAX_LINE_CHARS = 2_000

# Colours of the transcript (the style sheet cannot reach character formats).
COLORS = {
    "text": "#1f2328",
    "muted": "#6e7781",
    "tool": "#0b5cad",
    "code_bg": "#f3f4f6",
    "accepted": "#1a7f37",
    "accepted_bg": "#e6f4ea",
    "rejected": "#c5221f",
    "rejected_bg": "#fce8e6",
    "raw": "#9a6700",
    "raw_bg": "#fff8e1",
    "error": "#c5221f",
    "milestone": "#8250df",
}

_HEADING = re.compile(r"^(#{1,6})\s++(.*)$")  # its closing `#`s are stripped after
_LIST_ITEM = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_INLINE = re.compile(r"(\*\*[^*\n]+\*\*|__[^_\n]+__|`[^`\n]+`)")

Run = tuple[str, str]  # (format key, text without a newline)
Line = tuple[Run, ...]  # tuples, not lists: the GC stops tracking them


def clip(line: str, limit: int = MAX_LINE_CHARS) -> str:
    if len(line) <= limit:
        return line
    return f"{line[:limit]} … (+{len(line) - limit} chars)"


def summarize_result(content: str, max_lines: int) -> list[str]:
    """The first lines of a tool result and how many were left out."""
    lines = content.rstrip("\n").split("\n") if content.strip() else []
    if not lines:
        return ["(no output)"]
    shown = [clip(line, 240) for line in lines[:max_lines]]
    if len(lines) > max_lines:
        shown.append(f"… ({len(lines) - max_lines} more lines)")
    return shown


def _inline_runs(line: str, base: str) -> Line:
    """Split `**bold**` and `code` spans out of one line."""
    if "`" not in line and "**" not in line and "__" not in line:
        return ((base, line),)
    runs: list[Run] = []
    for part in _INLINE.split(line):
        if not part:
            continue
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            runs.append(("code", part[1:-1]))
        elif part[:2] in ("**", "__") and len(part) > 4:
            runs.append(("bold", part[2:-2]))
        else:
            runs.append((base, part))
    return tuple(runs)


def render_markdown(text: str) -> list[Line]:
    """Light Markdown: headings, bold, inline and fenced code, bullets, verdict lines.

    Returns one list of runs per displayed line. Fast enough to run on every event; anything
    fancier (tables, links) is shown as written, which stays readable.
    """
    lines: list[Line] = []
    append = lines.append
    in_fence = False
    for raw in text.split("\n"):
        line = raw.rstrip()
        if not line and not in_fence:
            append((("text", ""),))
            continue
        if len(line) > MAX_LINE_CHARS:
            line = clip(line)
        first = line.lstrip()[:1]
        if first and first in "`~" and line.lstrip()[:3] in ("```", "~~~"):
            in_fence = not in_fence
            continue
        if in_fence:
            append((("code", "  " + line),))
            continue
        # Cheap tests first: most lines are plain prose and skip every regex.
        upper = line.upper()
        if ("CCEPTED" in upper or "EJECTED" in upper) and (verdict := VERDICT.match(line)):
            accepted, rest = verdict
            word, key = ("ACCEPTED", "accepted") if accepted else ("REJECTED", "rejected")
            append(((key, f"{word}: {rest}" if rest else word),))
            continue
        if first == "#" and (heading := _HEADING.match(line)):
            append((("h", heading.group(2).rstrip().rstrip("#").rstrip().replace("**", "")),))
            continue
        if first in "-*+" and (item := _LIST_ITEM.match(line)):
            append((("text", item.group(1) + "  • "), *_inline_runs(item.group(2), "text")))
            continue
        if signal := DEVELOPER_REPORT.match(line):
            append((("milestone", signal),))
            continue
        append(_inline_runs(line, "text"))
    return lines


def _formats(base: QFont, mono: QFont) -> dict[str, QTextCharFormat]:
    def fmt(color: str = COLORS["text"], *, font: QFont | None = None, bold: bool = False,
            italic: bool = False, bg: str | None = None, scale: float = 1.0) -> QTextCharFormat:
        f = QTextCharFormat()
        chosen = QFont(font or base)
        if scale != 1.0 and chosen.pointSizeF() > 0:
            chosen.setPointSizeF(chosen.pointSizeF() * scale)
        chosen.setBold(bold)
        chosen.setItalic(italic)
        f.setFont(chosen)
        f.setForeground(QColor(color))
        if bg:
            f.setBackground(QColor(bg))
        return f

    return {
        "text": fmt(),
        "bold": fmt(bold=True),
        "h": fmt(bold=True, scale=1.12),
        "code": fmt(font=mono, bg=COLORS["code_bg"]),
        "tool": fmt(COLORS["tool"], font=mono),
        "result": fmt(COLORS["muted"], font=mono),
        "result_error": fmt(COLORS["error"], font=mono),
        "thinking": fmt(COLORS["muted"], italic=True),
        "meta": fmt(COLORS["muted"], scale=0.9),
        "separator": fmt(COLORS["muted"], bold=True, scale=0.9),
        "accepted": fmt(COLORS["accepted"], bold=True, bg=COLORS["accepted_bg"]),
        "rejected": fmt(COLORS["rejected"], bold=True, bg=COLORS["rejected_bg"]),
        "milestone": fmt(COLORS["milestone"], bold=True),
        "raw": fmt(COLORS["raw"], font=mono, bg=COLORS["raw_bg"]),
        "error": fmt(COLORS["error"], bold=True),
    }


class TranscriptView(QPlainTextEdit):
    """A read-only, selectable, capped text view that takes formatted lines in bulk.

    The cap is kept by trimming the oldest lines, a block of them (a twentieth of the cap) at a
    time, in one removal whose end is found by block number: ~0.6 µs a line. Stepping a cursor
    over the lines instead (as Qt's own `maximumBlockCount` does) costs ~12 µs a line, and
    showing a second document in the shown one's place re-lays out every line of it: 25-30 ms
    of the GUI thread per pane at once (bench/monitor.py). The view never holds more than
    `max_lines` lines, and once full at least `max_lines` less a block.
    """

    #: The user scrolled away from the bottom (False) or back to it (True). GUI thread.
    following_changed = Signal(bool)

    def __init__(self, max_lines: int = DEFAULT_MAX_LINES, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setUndoRedoEnabled(False)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.WidgetWidth)
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.setFrameShape(QFrame.Shape.NoFrame)
        mono = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        mono.setPointSizeF(max(8.0, self.font().pointSizeF() * 0.92))
        self.formats = _formats(self.font(), mono)
        self.max_lines = max(2, max_lines)
        self._trim_block = max(1, self.max_lines // 20)
        self._lines = 0
        self._trimming = False
        self._following = True
        # > 0 while the user's own input (keys, mouse, a search) is being handled: only then
        # does a move away from the bottom stop following. Laying out, resizing, a page
        # opening move the value too (before the range grows), and are no reason to.
        self._by_user = 0
        self.verticalScrollBar().valueChanged.connect(self._on_scrolled)
        # The scroll bar's own actions: a click on it, a drag, the wheel.
        self.verticalScrollBar().actionTriggered.connect(self._on_scroll_action)
        # QPlainTextEdit lays new text out lazily: the range grows after an append returns.
        # Following means staying at the bottom whenever it moves, not only at append time.
        self.verticalScrollBar().rangeChanged.connect(self._on_range_changed)

    @property
    def line_count(self) -> int:
        """Lines in the shown document (at most `max_lines`)."""
        return self._lines

    @property
    def following(self) -> bool:
        """Whether new output scrolls into view (the user is at the bottom)."""
        return self._following

    def _at_bottom(self) -> bool:
        bar = self.verticalScrollBar()
        return bar.value() >= bar.maximum()

    def _set_following(self, following: bool) -> None:
        if following != self._following:
            self._following = following
            self.following_changed.emit(following)

    @Slot(int)
    def _on_scroll_action(self, _action: int) -> None:
        # The scroll bar moves its value right after saying so: that move is the user's
        # (decided in `_on_scrolled`, once the value has moved).
        self._by_user += 1
        QTimer.singleShot(0, self._end_scroll_action)

    @Slot()
    def _end_scroll_action(self) -> None:
        self._by_user -= 1

    @Slot(int)
    def _on_scrolled(self, _value: int) -> None:
        if self._trimming:
            return
        if self._at_bottom():
            self._set_following(True)
        elif self._by_user:
            self._set_following(False)
        elif self._following:
            # Not the user's doing (a resize, a relayout): a following view stays at the end.
            self.scroll_to_end()

    @contextmanager
    def _user_input(self) -> Iterator[None]:
        self._by_user += 1
        try:
            yield
        finally:
            self._by_user -= 1

    def keyPressEvent(self, event: QKeyEvent) -> None:
        with self._user_input():
            super().keyPressEvent(event)

    def wheelEvent(self, event: QWheelEvent) -> None:
        with self._user_input():
            super().wheelEvent(event)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        with self._user_input():
            super().mousePressEvent(event)

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        with self._user_input():
            super().mouseMoveEvent(event)

    def timerEvent(self, event: QTimerEvent) -> None:
        with self._user_input():  # the edit's timers: scrolling while selecting with the mouse
            super().timerEvent(event)

    def find(self, *args: Any) -> bool:  # type: ignore[override]
        """Find (the search bar): showing the match is the user's move."""
        with self._user_input():
            return bool(super().find(*args))

    def setTextCursor(self, cursor: QTextCursor) -> None:
        with self._user_input():
            super().setTextCursor(cursor)

    @Slot(int, int)
    def _on_range_changed(self, _minimum: int, maximum: int) -> None:
        if self._following and not self._trimming:
            self.verticalScrollBar().setValue(maximum)

    def scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    def append_lines(self, lines: list[Line]) -> None:
        """Append whole lines, first trimming the oldest ones that would go over the cap."""
        if not lines:
            return
        lines = lines[-self.max_lines:]
        excess = self._lines + len(lines) - self.max_lines
        if excess > 0:
            self._trim(min(self._lines, excess + self._trim_block - 1))
        _insert(self.document(), lines, self._lines == 0, self.formats)
        self._lines += len(lines)
        if self._following:
            self.scroll_to_end()

    def _trim(self, count: int) -> None:
        """Drop the oldest `count` lines, keeping the reader's place if they scrolled up."""
        document = self.document()
        bar = self.verticalScrollBar()
        # The place as a block and the wrapped line within it: the lines above it may be laid
        # out anew when the removal lands (a first block wraps), so a count of lines would drift.
        place = self.firstVisibleBlock()
        number, within = place.blockNumber() - count, bar.value() - place.firstLineNumber()
        end = document.findBlockByNumber(count).position() if count < self._lines \
            else document.characterCount() - 1
        cursor = QTextCursor(document)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        self._trimming = True
        try:
            cursor.removeSelectedText()
            if not self._following:
                kept = document.findBlockByNumber(number)
                bar.setValue(kept.firstLineNumber() + within if number >= 0 else 0)
        finally:
            self._trimming = False
        self._lines -= count


def _insert(document: QTextDocument, lines: list[Line], empty: bool,
            formats: dict[str, QTextCharFormat]) -> None:
    """Append lines in one edit block, merging neighbouring runs of one format."""
    cursor = QTextCursor(document)
    cursor.movePosition(QTextCursor.MoveOperation.End)
    cursor.beginEditBlock()
    key: str | None = None
    parts: list[str] = []
    first = empty
    for runs in lines:
        for index, (run_key, text) in enumerate(runs):
            if index == 0 and not first:
                text = "\n" + text
            first = False
            if run_key != key:
                if parts and key is not None:
                    cursor.insertText("".join(parts), formats[key])
                parts = []
                key = run_key
            parts.append(text)
    if parts and key is not None:
        cursor.insertText("".join(parts), formats[key])
    cursor.endEditBlock()
