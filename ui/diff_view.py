"""One file's unified diff: numbered rows, +/- backgrounds, Pygments syntax colours.

`DiffView` shows the rows of one `anima.diffs.FileDiff` at a time (the Changes view renders
only the file the reviewer selected, so a 500-file change costs nothing up front). Each line is
`old new ± code`; the code part is coloured by a Pygments lexer chosen from the file name, the
whole line's background by its kind. A click on a code line (not a drag that selects text)
emits `line_clicked` with the row, for the comment box.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from pygments.lexer import Lexer
from pygments.lexers import get_lexer_for_filename
from pygments.styles import get_style_by_name
from pygments.token import _TokenType
from pygments.util import ClassNotFound
from PySide6.QtCore import QRect, Qt, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QMouseEvent,
    QPainter,
    QPaintEvent,
    QSyntaxHighlighter,
    QTextCharFormat,
    QTextDocument,
)
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from anima.diffs import ChangeSet, DiffRow, FileDiff

#: Rows above which a file is shown without token colours (lexing it would stall the window).
HIGHLIGHT_MAX_ROWS = 4000
NUMBER_WIDTH = 5
PREFIX = NUMBER_WIDTH * 2 + 4  # "  12    13 + "
ROW_BACKGROUNDS = {"+": QColor(46, 160, 67, 40), "-": QColor(248, 81, 73, 40),
                   "@": QColor(84, 174, 255, 36)}
_STYLE = get_style_by_name("friendly")

Span = tuple[int, int, _TokenType]  # start, length, token type (within the code part)


def row_text(row: DiffRow) -> str:
    """The displayed line: old and new line numbers, the sign, the code."""
    if row.kind in "@~":
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
        self._formats: dict[_TokenType, QTextCharFormat] = {}
        self._gutter = QTextCharFormat()
        self._gutter.setForeground(QColor("#8c959f"))
        self._signs = {"+": QColor("#1a7f37"), "-": QColor("#cf222e")}
        self._hunk = QTextCharFormat()
        self._hunk.setForeground(QColor("#0550ae"))
        self._note = QTextCharFormat()
        self._note.setForeground(QColor("#6e7781"))
        self._note.setFontItalic(True)

    def set_rows(self, rows: list[DiffRow], spans: list[list[Span]]) -> None:
        self.rows, self.spans = rows, spans

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


class DiffView(QPlainTextEdit):
    """A read-only, monospace view of one file's diff."""

    #: (file path, row) — the reviewer clicked a code line. GUI thread.
    line_clicked = Signal(str, object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("diffView")
        self.setReadOnly(True)
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                     | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.viewport().setCursor(Qt.CursorShape.PointingHandCursor)
        self.highlighter = DiffHighlighter(self.document())
        self.file: FileDiff | None = None
        self.rows: list[DiffRow] = []
        self._press: Any = None

    def show_file(self, diff: FileDiff | None, message: str = "") -> None:
        """Render `diff` (or just `message`): rows first, then colours in one pass."""
        self.file = diff
        self.rows = [] if diff is None else diff.rows
        if diff is not None and not self.rows:
            message = message or ("Binary file changed" if diff.binary else "No textual change "
                                  "(mode or name only)")
        lexer = lexer_for(diff.path) if diff is not None and self.rows else None
        spans = token_spans(self.rows, lexer) if lexer and len(self.rows) <= HIGHLIGHT_MAX_ROWS \
            else []
        self.highlighter.set_rows(self.rows, spans)
        text = "\n".join(row_text(r) for r in self.rows) if self.rows else message
        self.setPlainText(text)

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
        if 0 <= n < len(self.rows) and self.rows[n].kind in "+- ":
            self.line_clicked.emit(self.file.path, self.rows[n])

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
            block = block.next()
        painter.end()
