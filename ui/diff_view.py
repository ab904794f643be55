"""One file's unified diff: numbered rows, +/- backgrounds, Pygments syntax colours, the
words that changed, and the reviewer's comments under the lines they are about.

`DiffView` shows the rows of one `anima.diffs.FileDiff` at a time (the Changes view renders
only the file the reviewer selected, so a 500-file change costs nothing up front). Each line is
`old new ± code`; the code part is coloured by a Pygments lexer chosen from the file name, the
whole line's background by its kind, and within a changed line paired with its old version
the words that differ get a stronger background. Comments are rows of their own under their
line, as a pull-request review shows them; the editor opens in a gap made under the clicked
line. A click on a code line (not a drag that selects text) emits `line_clicked`; where
comments can be left, the line under the mouse shows a "+". `SideBySideView` puts two of them
side by side, old and new, and keeps them row for row: a comment or the editor on one side
takes the same room on the other.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QEvent, QRect, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextCursor,
    QTextDocument,
)
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QWidget

from anima.diffs import ChangeSet, DiffRow, FileDiff

#: Rows above which a file is shown without token colours (lexing it would stall the window).
HIGHLIGHT_MAX_ROWS = 4000
NUMBER_WIDTH = 5
PREFIX = NUMBER_WIDTH * 2 + 4  # "  12    13 + "
# Row kinds beyond git's: a comment under a line (without text: the room a comment on the
# other side takes, side by side), a gap the comment editor sits in, and a side's padding
# where the other side has lines and this one none.
COMMENT, GAP, PAD = "#", "_", "="
ROW_BACKGROUNDS = {"+": QColor(46, 160, 67, 40), "-": QColor(248, 81, 73, 40),
                   "@": QColor(84, 174, 255, 36), COMMENT: QColor(212, 167, 44, 56),
                   GAP: QColor(140, 149, 159, 24),
                   PAD: QColor(140, 149, 159, 24)}  # drawn over the text: translucent
#: The words that changed within a line, over its +/- background.
WORD_BACKGROUNDS = {"+": QColor(46, 160, 67, 110), "-": QColor(248, 81, 73, 110)}
_STYLE = get_style_by_name("friendly")
_WORD = re.compile(r"\w+|\s+|[^\w\s]")
#: Below this similarity a changed line counts as rewritten: no word marks, they would be noise.
WORD_MIN_RATIO = 0.3

Span = tuple[int, int, _TokenType]  # start, length, token type (within the code part)
Range = tuple[int, int]  # start, length (within the code part)


def row_text(row: DiffRow) -> str:
    """The displayed line: old and new line numbers, the sign, the code."""
    if row.kind == COMMENT:
        return " " * PREFIX + "▍ " + row.text if row.text else ""
    if row.kind in "@~" or row.kind in (GAP, PAD):
        return row.text
    old = "" if row.old_line is None else str(row.old_line)
    new = "" if row.new_line is None else str(row.new_line)
    return f"{old:>{NUMBER_WIDTH}} {new:>{NUMBER_WIDTH}} {row.kind} {row.text}"


def _lexer_key(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    stem, dot, ext = name.rpartition(".")
    return f"file.{ext}" if dot and stem else name


@functools.cache
def _lexer(key: str) -> Lexer | None:
    try:
        return get_lexer_for_filename(key, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return None


def lexer_for(path: str) -> Lexer | None:
    """The Pygments lexer for a file name, looked up once per extension.

    The first lookup of all scans Pygments' plugins (over a second): `prepare_lexers` does
    that on a worker thread before the files are shown.
    """
    return _lexer(_lexer_key(path))


def warm_up_lexers() -> threading.Thread:
    """Start Pygments' one-off plugin scan in the background (the app calls it at start-up)."""
    thread = threading.Thread(target=lexer_for, args=("warm-up.py",), name="pygments-warm-up",
                              daemon=True)
    thread.start()
    return thread


def prepare_lexers(changes: ChangeSet) -> ChangeSet:
    """Worker thread: look up the lexers a change set needs, so showing a file never waits."""
    for key in {_lexer_key(f.path) for f in changes.files}:
        _lexer(key)
    return changes


def word_changes(old: str, new: str) -> tuple[list[Range], list[Range]]:
    """The character ranges that differ between an old line and its new version, word by
    word (as GitHub and VS Code mark them); nothing when the lines have little in common."""
    a, b = _WORD.findall(old), _WORD.findall(new)
    matcher = SequenceMatcher(None, a, b, autojunk=False)
    if matcher.ratio() < WORD_MIN_RATIO:
        return [], []

    def ranges(tokens: list[str], spans: list[tuple[int, int]]) -> list[Range]:
        starts = [0]
        for token in tokens:
            starts.append(starts[-1] + len(token))
        return [(starts[i], starts[j] - starts[i]) for i, j in spans if j > i]

    old_spans: list[tuple[int, int]] = []
    new_spans: list[tuple[int, int]] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            old_spans.append((i1, i2))
            new_spans.append((j1, j2))
    return ranges(a, old_spans), ranges(b, new_spans)


def word_spans(rows: Sequence[DiffRow]) -> list[list[Range]]:
    """For each row, the ranges of its code that changed: a run of removed lines is paired
    line by line with the run of added lines that follows it."""
    spans: list[list[Range]] = [[] for _ in rows]
    i = 0
    while i < len(rows):
        if rows[i].kind != "-":
            i += 1
            continue
        start = i
        while i < len(rows) and rows[i].kind == "-":
            i += 1
        added = i
        while i < len(rows) and rows[i].kind == "+":
            i += 1
        for old, new in zip(range(start, added), range(added, i), strict=False):
            spans[old], spans[new] = word_changes(rows[old].text, rows[new].text)
    return spans


Side = tuple[list[DiffRow], list[list[Range]]]


def line_row(rows: Sequence[DiffRow], line: int) -> int | None:
    """The row a comment on `line` is about: the new file's line, else a removed line's."""
    found = next((i for i, r in enumerate(rows) if r.kind in "+ " and r.new_line == line), None)
    if found is None:
        found = next((i for i, r in enumerate(rows) if r.kind == "-" and r.old_line == line),
                     None)
    return found


def comment_line(rows: Sequence[DiffRow], row: DiffRow) -> int | None:
    """The line a comment on `row` (of the file's `rows`) is kept under: a removed line's old
    number, else the new file's. A context line on the old side of a side-by-side view has its
    old number only: its new one is looked up."""
    if row.kind == "-":
        return row.old_line
    if row.new_line is not None:
        return row.new_line
    return next((r.new_line for r in rows if r.kind == " " and r.old_line == row.old_line), None)


def on_removed_line(rows: Sequence[DiffRow], line: int) -> bool:
    """Whether a comment on `line` is about a removed line (the old side), as `line_row`
    reads a line number: the new file's line first."""
    at = line_row(rows, line)
    return at is not None and rows[at].kind == "-"


def side_by_side(rows: Sequence[DiffRow]) -> tuple[Side, Side]:
    """The unified rows as two aligned columns, old on the left and new on the right: a run of
    removed lines faces the run of added lines after it, the shorter padded; each row with the
    words that changed in it."""
    words = word_spans(rows)
    left: list[DiffRow] = []
    right: list[DiffRow] = []
    left_words: list[list[Range]] = []
    right_words: list[list[Range]] = []
    i = 0
    while i < len(rows):
        row = rows[i]
        if row.kind not in "+-":
            left.append(DiffRow(row.kind, row.text, row.old_line, None))
            right.append(DiffRow(row.kind, row.text, None, row.new_line))
            left_words.append([])
            right_words.append([])
            i += 1
            continue
        removed = []
        while i < len(rows) and rows[i].kind == "-":
            removed.append(i)
            i += 1
        added = []
        while i < len(rows) and rows[i].kind == "+":
            added.append(i)
            i += 1
        for n in range(max(len(removed), len(added))):
            for side, words_of, run in ((left, left_words, removed), (right, right_words, added)):
                side.append(rows[run[n]] if n < len(run) else DiffRow(PAD, ""))
                words_of.append(words[run[n]] if n < len(run) else [])
    return (left, left_words), (right, right_words)


def token_spans(rows: list[DiffRow], lexer: Lexer) -> list[list[Span]]:
    """Pygments tokens of the code lines, cut per row (hunk and note rows get none).

    Old and new lines are lexed as one stream: a good approximation for hunks, and one pass.
    """
    code_rows = [i for i, r in enumerate(rows) if r.kind in "+- "]
    spans: list[list[Span]] = [[] for _ in rows]
    text = "\n".join(rows[i].text for i in code_rows)
    starts = [0]
    for i in code_rows[:-1]:
        starts.append(starts[-1] + len(rows[i].text) + 1)
    line = 0
    for index, ttype, value in lexer.get_tokens_unprocessed(text):
        while line + 1 < len(starts) and index >= starts[line + 1]:
            line += 1
        offset, cur = index - starts[line], line
        for n, piece in enumerate(value.split("\n")):
            if n:
                cur += 1
                offset = 0
            if piece and cur < len(code_rows):
                spans[code_rows[cur]].append((offset, len(piece), ttype))
            offset += len(piece)
    return spans


class DiffHighlighter(QSyntaxHighlighter):
    """Colours numbers and signs by row kind, code by precomputed Pygments spans."""

    def __init__(self, document: QTextDocument) -> None:
        super().__init__(document)
        self.rows: list[DiffRow] = []
        self.spans: list[list[Span]] = []
        self.words: list[list[Range]] = []
        self._formats: dict[_TokenType, QTextCharFormat] = {}
        self._gutter = QTextCharFormat()
        self._gutter.setForeground(QColor("#8c959f"))
        self._signs = {"+": QColor("#1a7f37"), "-": QColor("#cf222e")}
        self._hunk = QTextCharFormat()
        self._hunk.setForeground(QColor("#0550ae"))
        self._note = QTextCharFormat()
        self._note.setForeground(QColor("#6e7781"))
        self._note.setFontItalic(True)
        self._comment = QTextCharFormat()
        self._comment.setForeground(QColor("#57430a"))

    def set_rows(self, rows: list[DiffRow], spans: list[list[Span]],
                 words: list[list[Range]]) -> None:
        self.rows, self.spans, self.words = rows, spans, words

    def _format(self, ttype: _TokenType) -> QTextCharFormat:
        fmt = self._formats.get(ttype)
        if fmt is None:
            style = _STYLE.style_for_token(ttype)
            fmt = QTextCharFormat()
            if style["color"]:
                fmt.setForeground(QColor(f"#{style['color']}"))
            if style["bold"]:
                fmt.setFontWeight(QFont.Weight.Bold)
            if style["italic"]:
                fmt.setFontItalic(True)
            self._formats[ttype] = fmt
        return fmt

    def highlightBlock(self, text: str) -> None:
        n = self.currentBlock().blockNumber()
        if n >= len(self.rows):
            return
        row = self.rows[n]
        if row.kind == COMMENT:
            self.setFormat(0, len(text), self._comment)
            return
        if row.kind == "@":
            self.setFormat(0, len(text), self._hunk)
            return
        if row.kind == "~":
            self.setFormat(0, len(text), self._note)
            return
        self.setFormat(0, PREFIX - 2, self._gutter)
        if row.kind in self._signs:
            sign = QTextCharFormat()
            sign.setForeground(self._signs[row.kind])
            self.setFormat(PREFIX - 2, 1, sign)
        for start, length, ttype in self.spans[n] if n < len(self.spans) else ():
            self.setFormat(PREFIX + start, length, self._format(ttype))
        background = WORD_BACKGROUNDS.get(row.kind)
        if background is None or n >= len(self.words):
            return
        for start, length in self.words[n]:
            for at in range(PREFIX + start, PREFIX + start + length):  # keep each colour
                fmt = self.format(at)
                fmt.setBackground(background)
                self.setFormat(at, 1, fmt)


class DiffView(QPlainTextEdit):
    """A read-only, monospace view of one file's diff, its comments inline."""

    #: (file path, row) — the reviewer clicked a code line. GUI thread.
    line_clicked = Signal(str, object)
    #: (comment) — the reviewer clicked a comment shown under its line. GUI thread.
    comment_clicked = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("diffView")
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        self.viewport().setMouseTracking(True)
        self.highlighter = DiffHighlighter(self.document())
        self.file: FileDiff | None = None
        #: The rows on screen: the file's, with comment and gap rows among them.
        self.rows: list[DiffRow] = []
        #: Whether a click on a line may start a comment (the "+" on the hovered line).
        self.commentable = False
        #: The other side of a side-by-side view: its comments take room here too.
        self.facing: DiffView | None = None
        self.hovered: int | None = None
        self._base: list[DiffRow] = []
        self._base_spans: list[list[Span]] = []
        self._base_words: list[list[Range]] = []
        self._comments: list[Any] = []
        self._comment_of: dict[int, Any] = {}
        self._gap: tuple[int, int] | None = None  # (file row, rows) the editor sits under
        self._message = ""
        self._press: Any = None

    def show_file(self, diff: FileDiff | None, message: str = "",
                  comments: Sequence[Any] = (),
                  side: tuple[list[DiffRow], list[list[Range]]] | None = None) -> None:
        """Render `diff` (or just `message`) with `comments` (`path`, `line`, `text`, `id`)
        under their lines: rows first, then colours in one pass. `side`: one side of a
        side-by-side view instead of the unified rows (its rows and their word changes)."""
        self.draw(keep_scroll=self.load_file(diff, message, comments, side))

    def load_file(self, diff: FileDiff | None, message: str = "",
                  comments: Sequence[Any] = (),
                  side: tuple[list[DiffRow], list[list[Range]]] | None = None) -> bool:
        """What `show_file` shows, not drawn yet (a side-by-side view draws its sides once
        both are loaded); True when it is the file already shown."""
        same_file = diff is not None and self.file is not None and diff.path == self.file.path
        self.file = diff
        self._base = [] if diff is None else side[0] if side is not None else diff.rows
        if diff is not None and not self._base:
            message = message or ("Binary file changed" if diff.binary else "No textual change "
                                  "(mode or name only)")
        lexer = lexer_for(diff.path) if diff is not None and self._base else None
        small = len(self._base) <= HIGHLIGHT_MAX_ROWS
        self._base_spans = token_spans(self._base, lexer) if lexer and small else []
        self._base_words = (side[1] if side is not None else word_spans(self._base)) \
            if small else []
        self._comments = list(comments)
        if not same_file:
            self._gap = None
        self._message = message
        return same_file

    def show_comments(self, comments: Sequence[Any]) -> None:
        """The comments changed (saved, edited, removed): redraw in place."""
        if self.set_comments(comments):
            self.draw(keep_scroll=True)

    def set_comments(self, comments: Sequence[Any]) -> bool:
        """Take the comments to show, not drawn yet; False when they are the ones shown."""
        if [(c.id, c.line, c.text) for c in comments] == [
                (c.id, c.line, c.text) for c in self._comments]:
            return False
        self._comments = list(comments)
        return True

    def row_of(self, line: int) -> int | None:
        """The file's row (of this view's rows, before comments) a comment on `line` is under."""
        return line_row(self._base, line)

    def view_of(self, _line: int) -> DiffView:
        """The view a comment on a line shows in: this one (a side-by-side view picks a side)."""
        return self

    def draw(self, keep_scroll: bool) -> None:
        """Draw the loaded file: its rows, the comments under theirs, the editor's gap."""
        scroll = self.verticalScrollBar().value()
        rows: list[DiffRow] = []
        spans: list[list[Span]] = []
        words: list[list[Range]] = []
        self._comment_of = {}
        under: dict[int, list[Any]] = {}  # None: room for the facing side's comment
        for view in (v for v in (self, self.facing) if v is not None):
            for comment in view._comments:
                at = line_row(view._base, comment.line)
                if at is not None:
                    under.setdefault(at, []).append(comment if view is self else None)
        for i, row in enumerate(self._base):
            rows.append(row)
            spans.append(self._base_spans[i] if i < len(self._base_spans) else [])
            words.append(self._base_words[i] if i < len(self._base_words) else [])
            for comment in under.get(i, ()):
                if comment is not None:
                    self._comment_of[len(rows)] = comment
                rows.append(DiffRow(COMMENT, "" if comment is None
                                    else comment.text.replace("\n", " ")))
                spans.append([])
                words.append([])
            if self._gap is not None and self._gap[0] == i:
                for _ in range(self._gap[1]):
                    rows.append(DiffRow(GAP, ""))
                    spans.append([])
                    words.append([])
        self.rows = rows
        self.highlighter.set_rows(rows, spans, words)
        text = "\n".join(row_text(r) for r in rows) if rows else self._message
        self.setPlainText(text)
        if keep_scroll:
            self.verticalScrollBar().setValue(scroll)

    # --- the comment editor's gap -------------------------------------------------------
    def file_row(self, n: int) -> int | None:
        """The file's row shown at screen row `n` (None for a comment or a gap)."""
        row = self.rows[n] if 0 <= n < len(self.rows) else None
        if row is None or row.kind in (COMMENT, GAP):
            return None
        return sum(1 for r in self.rows[:n] if r.kind not in (COMMENT, GAP))

    def open_gap(self, file_row: int, height: int) -> QRect:
        """Make room for `height` pixels under the file's row `file_row` (after its
        comments); where the gap is drawn, in viewport coordinates."""
        line = max(self.fontMetrics().lineSpacing(), 1)
        self._gap = (file_row, -(-height // line))
        self.draw(keep_scroll=True)
        return self.gap_rect()

    def close_gap(self) -> None:
        if self._gap is not None:
            self._gap = None
            self.draw(keep_scroll=True)

    def gap_rect(self) -> QRect:
        gap = [n for n, r in enumerate(self.rows) if r.kind == GAP]
        if not gap:
            return QRect()
        top, bottom = self.block_rect(gap[0]), self.block_rect(gap[-1])
        return QRect(0, top.top(), self.viewport().width(), bottom.bottom() - top.top() + 1)

    # --- moving around ------------------------------------------------------------------
    def hunk_rows(self) -> list[int]:
        return [n for n, r in enumerate(self.rows) if r.kind == "@"]

    def go_to_hunk(self, step: int) -> bool:
        """Put the next (step 1) or previous (-1) hunk at the top; False when there is none."""
        here = self.firstVisibleBlock().blockNumber() if self.rows else 0
        hunks = self.hunk_rows()
        target = next((n for n in hunks if n > here), None) if step > 0 else \
            next((n for n in reversed(hunks) if n < here), None)
        if target is None:
            return False
        self.scroll_to_row(target)
        return True

    def scroll_to_row(self, n: int) -> None:
        cursor = QTextCursor(self.document().findBlockByNumber(n))
        self.setTextCursor(cursor)
        self.verticalScrollBar().setValue(n)  # a row per scroll step: the row at the top

    # --- the mouse ------------------------------------------------------------------------
    def mousePressEvent(self, event: QMouseEvent) -> None:
        self._press = event.position().toPoint()
        super().mousePressEvent(event)

    def mouseReleaseEvent(self, event: QMouseEvent) -> None:
        super().mouseReleaseEvent(event)
        press, self._press = self._press, None
        if press is None or self.file is None or self.textCursor().hasSelection():
            return
        if (event.position().toPoint() - press).manhattanLength() > 4:
            return
        n = self.cursorForPosition(event.position().toPoint()).blockNumber()
        if n in self._comment_of:
            self.comment_clicked.emit(self._comment_of[n])
        elif 0 <= n < len(self.rows) and self.rows[n].kind in "+- ":
            self.line_clicked.emit(self.file.path, self.rows[n])

    def mouseMoveEvent(self, event: QMouseEvent) -> None:
        super().mouseMoveEvent(event)
        n = self.cursorForPosition(event.position().toPoint()).blockNumber()
        hovered = n if self.commentable and 0 <= n < len(self.rows) \
            and self.rows[n].kind in "+- " else None
        if hovered != self.hovered:
            self.hovered = hovered
            self.viewport().update()

    def leaveEvent(self, event: QEvent) -> None:
        super().leaveEvent(event)
        if self.hovered is not None:
            self.hovered = None
            self.viewport().update()

    def block_rect(self, n: int) -> QRect:
        """Where row `n` is drawn in the viewport (for tests and the comment box)."""
        block = self.document().findBlockByNumber(n)
        return self.blockBoundingGeometry(block).translated(self.contentOffset()).toRect()

    def paintEvent(self, event: QPaintEvent) -> None:
        super().paintEvent(event)
        if not self.rows:
            return
        painter = QPainter(self.viewport())
        width = self.viewport().width()
        block = self.firstVisibleBlock()
        offset = self.contentOffset()
        bottom = event.rect().bottom()
        while block.isValid():
            geometry = self.blockBoundingGeometry(block).translated(offset)
            if geometry.top() > bottom:
                break
            n = block.blockNumber()
            color = ROW_BACKGROUNDS.get(self.rows[n].kind) if n < len(self.rows) else None
            if color is not None:
                painter.fillRect(QRect(0, int(geometry.top()), width,
                                       int(geometry.height())), color)
            if n == self.hovered:
                self._paint_plus(painter, geometry.toRect())
            block = block.next()
        painter.end()

    def _paint_plus(self, painter: QPainter, row: QRect) -> None:
        """The hover "+" in the gutter: this line takes a comment."""
        size = max(row.height() - 2, 8)
        badge = QRect(2, row.top() + (row.height() - size) // 2, size, size)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        painter.setBrush(QColor("#2f6feb"))
        painter.setPen(Qt.PenStyle.NoPen)
        painter.drawRoundedRect(badge, 3, 3)
        painter.setPen(QColor("#ffffff"))
        painter.drawText(badge, int(Qt.AlignmentFlag.AlignCenter), "+")


class SideBySideView(QWidget):
    """Old on the left, new on the right, scrolled together and row for row; a comment under
    its line on the side it is about (the left for a removed line's, as `line_row` reads
    it), the editor's gap on both. Clicks reach `line_clicked` / `comment_clicked` like the
    unified view's."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("sideBySideView")
        self.left = DiffView(self)
        self.right = DiffView(self)
        self.left.facing, self.right.facing = self.right, self.left
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(1)
        layout.addWidget(self.left, 1)
        layout.addWidget(self.right, 1)
        for a, b in ((self.left, self.right), (self.right, self.left)):
            a.verticalScrollBar().valueChanged.connect(b.verticalScrollBar().setValue)
            a.horizontalScrollBar().valueChanged.connect(b.horizontalScrollBar().setValue)

    @property
    def file(self) -> FileDiff | None:
        return self.right.file

    @property
    def sides(self) -> tuple[DiffView, DiffView]:
        return self.left, self.right

    def show_file(self, diff: FileDiff | None, message: str = "",
                  comments: Sequence[Any] = ()) -> None:
        old, new = side_by_side(diff.rows if diff is not None else [])
        same = [self.left.load_file(diff, message, side=old),
                self.right.load_file(diff, message, side=new)]
        self._set_comments(comments)
        for view, keep_scroll in zip(self.sides, same, strict=True):
            view.draw(keep_scroll)

    def show_comments(self, comments: Sequence[Any]) -> None:
        if self._set_comments(comments):
            for view in self.sides:  # each side makes room for the other's
                view.draw(keep_scroll=True)

    def _set_comments(self, comments: Sequence[Any]) -> bool:
        old = [c for c in comments if self.view_of(c.line) is self.left]
        new = [c for c in comments if self.view_of(c.line) is self.right]
        return any([self.left.set_comments(old), self.right.set_comments(new)])  # both set

    def view_of(self, line: int) -> DiffView:
        """The side a comment on `line` shows on."""
        rows = self.file.rows if self.file is not None else []
        return self.left if on_removed_line(rows, line) else self.right

    def open_gap(self, file_row: int, height: int) -> None:
        """The editor's gap under `file_row`, on both sides."""
        for view in self.sides:
            view.open_gap(file_row, height)

    def close_gap(self) -> None:
        for view in self.sides:
            view.close_gap()
