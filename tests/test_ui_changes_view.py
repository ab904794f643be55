"""The Changes view: a milestone's diff, file by file, and comments on its lines."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QSettings, Qt
from PySide6.QtWidgets import QApplication, QStyle, QStyledItemDelegate, QStyleOptionViewItem

from anima.diffs import milestone_changes
from anima.git import GitRepo
from anima.paths import ProjectPaths
from anima.store.models import Iteration, MilestoneRecord, MilestoneStatus, ReviewComment
from tests.conftest import FakeClaude, run_git
from tests.helpers import record
from tests.test_ui_app import Window, paused_by_rejections
from ui.changes_view import ANIMA_SECTION, ChangesView
from ui.diff_view import PAD, PREFIX, DiffView, row_text
from ui.viewed_marks import KEEP, ViewedMarks

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def paused_milestone(git_repo: Path) -> MilestoneRecord:
    """A branch changing a Python file, a lock file and a file's indentation only."""
    return branch_changing(git_repo, {"app.py": "def f():\n    return 1\n", "notes.txt": "a\nb\n"},
                           {"app.py": "def f():\n    return 10\n\n\ndef g():\n    return 2\n",
                            "notes.txt": "a  \n  b\n", "uv.lock": "version = 1\n"})


def branch_changing(git_repo: Path, before: dict[str, str],
                    after: dict[str, str]) -> MilestoneRecord:
    """A paused milestone whose branch turns the files `before` into `after` (path → text)."""
    for path, text in before.items():
        (git_repo / path).write_text(text)
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "base")
    base = run_git(git_repo, "rev-parse", "HEAD").strip()
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    for path, text in after.items():
        (git_repo / path).write_text(text)
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "feat")
    return MilestoneRecord(id="m1", title="M1", created_at=datetime.now(UTC),
                           status=MilestoneStatus.PAUSED, base_commit=base,
                           branch_name="milestone/m1", main_branch="main")


def test_files_counts_highlighting_folding_and_a_comment_box(qtbot, git_repo: Path) -> None:
    rec = paused_milestone(git_repo)
    repo = GitRepo.open(git_repo)
    view = ChangesView()
    qtbot.addWidget(view)
    view.resize(1100, 700)
    view.show()
    view.load_requested.connect(lambda mid, rnd: view.show_changes(
        mid, rnd, milestone_changes(repo, rec, rnd)))
    view.show_record(rec)

    model = view.files
    rows = {model.index(r, 0).data(): (model.index(r, 1).data(), model.index(r, 2).data())
            for r in range(model.rowCount())}
    assert rows == {"app.py": ("+5", "−1"), "notes.txt": ("+2", "−2"), "uv.lock": ("+1", "−0")}
    assert "3 files, +8 −3" in view.summary.text() and "2 folded" in view.summary.text()
    # The first file a reviewer reads is opened: app.py, coloured by Pygments.
    assert view.current_file is not None and view.current_file.path == "app.py"
    text = view.diff.toPlainText().splitlines()
    def_line = next(n for n, line in enumerate(text) if line.endswith("+ def g():"))
    block = view.diff.document().findBlockByNumber(def_line)
    colours = {f.format.foreground().color().name() for f in block.layout().formats()}
    assert len(colours) >= 3  # numbers, the sign, keyword / name colours

    # Generated and whitespace-only files are folded until asked.
    lock_row = next(r for r in range(model.rowCount()) if model.index(r, 0).data() == "uv.lock")
    view.file_table.selectRow(lock_row)
    assert view.fold_bar.isVisible() and "generated" in view.fold_label.text()
    assert "version = 1" not in view.diff.toPlainText()
    qtbot.mouseClick(view.expand_button, Qt.MouseButton.LeftButton)
    assert not view.fold_bar.isVisible() and "version = 1" in view.diff.toPlainText()

    # A click on a line opens the comment box for that file and line.
    view.file_table.selectRow(0)
    added: list[tuple[str, str, int, str]] = []
    view.comment_added.connect(lambda *a: added.append(a))
    center = view.diff.block_rect(def_line).center()
    qtbot.mouseClick(view.diff.viewport(), Qt.MouseButton.LeftButton, pos=center)
    assert view.comment_box.isVisible() and "app.py:5" in view.comment_box.caption.text()
    qtbot.keyClicks(view.comment_box.text, "g needs a docstring")
    qtbot.mouseClick(view.comment_box.save_button, Qt.MouseButton.LeftButton)
    assert added == [("m1", "app.py", 5, "g needs a docstring")]
    assert not view.comment_box.isVisible()


def test_comments_survive_a_restart_and_resume_sends_them(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    with paused_by_rejections(qtbot, git_repo, fake, tmp_path) as w:
        page = w.page()
        changes = page.changes
        page.tabs.setCurrentWidget(changes)
        qtbot.waitUntil(lambda: changes.current_file is not None, timeout=10000)
        assert changes.current_file.path == "features/F1.txt"
        line = next(n for n, r in enumerate(changes.diff.rows) if r.kind == "+")
        for text in ("say hello, not hi", "drop this line"):
            qtbot.mouseClick(changes.diff.viewport(), Qt.MouseButton.LeftButton,
                             pos=changes.diff.block_rect(line).center())
            qtbot.keyClicks(changes.comment_box.text, text)
            qtbot.mouseClick(changes.comment_box.save_button, Qt.MouseButton.LeftButton)
            qtbot.waitUntil(lambda t=text: any(t in c for c in changes.comment_lines),
                            timeout=5000)
        assert [c.text for c in record(git_repo, "m1").comments] == ["say hello, not hi",
                                                                     "drop this line"]
    w2 = Window(qtbot, tmp_path)
    try:
        w2.window.open_project(git_repo)
        page = w2.page()
        changes = page.changes
        page.tabs.setCurrentWidget(changes)
        qtbot.waitUntil(lambda: len(changes.comment_lines) == 2, timeout=10000)
        qtbot.waitUntil(lambda: changes.current_file is not None, timeout=10000)
        # Both are shown inline, under the line they are about.
        inline = [r.text for r in changes.diff.rows if r.kind == "#"]
        assert inline == ["say hello, not hi", "drop this line"]
        # Edit the first, remove the second.
        changes.comment_list.setCurrentRow(0)
        qtbot.mouseClick(changes.edit_button, Qt.MouseButton.LeftButton)
        changes.comment_box.text.setPlainText("say hello, world")
        qtbot.mouseClick(changes.comment_box.save_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: "features/F1.txt:1 — say hello, world" in changes.comment_lines,
                        timeout=5000)
        changes.comment_list.setCurrentRow(1)
        qtbot.mouseClick(changes.remove_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: len(changes.comment_lines) == 1, timeout=5000)
        review = page.review
        qtbot.keyClicks(review.note, "Mind the greeting")
        review.resume_button.click()
        w2.wait_status("m1", "completed", timeout=30000)
    finally:
        w2.close()
    resumed = next(p for p in fake.prompts("developer") if "Mind the greeting" in p)
    assert "- features/F1.txt:1 — say hello, world" in resumed
    assert "drop this line" not in resumed
    assert record(git_repo, "m1").comments == []


def review_view(qtbot, git_repo: Path, status: str = "paused") -> tuple[ChangesView, Any]:
    """The Changes view on `paused_milestone`, whose branch also touched Anima's config."""
    rec = paused_milestone(git_repo)
    (git_repo / ".anima").mkdir(exist_ok=True)
    (git_repo / ".anima" / "config.json").write_text('{"auto_start": false}\n')
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "chore: config")
    rec.status = MilestoneStatus(status)
    return open_view(qtbot, git_repo, rec), rec


def open_view(qtbot, git_repo: Path, rec: MilestoneRecord) -> ChangesView:
    """A Changes view on `rec`, its changes read from the repository as the window does."""
    repo = GitRepo.open(git_repo)
    view = ChangesView()
    qtbot.addWidget(view)
    view.resize(1100, 700)
    view.show()
    view.load_requested.connect(lambda mid, rnd: view.show_changes(
        mid, rnd, milestone_changes(repo, view.record, rnd)))
    view.show_record(rec)
    return view


def shown(view: ChangesView) -> str | None:
    """The path of the file selected in the table (a folded one included)."""
    current = view.current_row_file()
    return None if current is None else current.path


def row_of(view: ChangesView, text: str) -> int:
    return next(n for n, r in enumerate(view.diff.rows) if row_text(r).endswith(text))


def test_a_file_name_that_is_not_utf8_is_listed_with_its_odd_byte(qtbot, git_repo: Path) -> None:
    """Qt drops a lone surrogate (`os.fsdecode`'s form of the byte): `bad\\377.txt` read
    `bad.txt` in the list."""
    rec = branch_changing(git_repo, {"a.txt": "a\n"}, {os.fsdecode(b"bad\xff.txt"): "x\n"})
    view = open_view(qtbot, git_repo, rec)
    assert view.files.index(0, 0).data() == "bad\\xff.txt"


def test_a_comment_on_a_file_whose_name_is_not_utf8_stays_under_its_line(
        qtbot, git_repo: Path) -> None:
    """A click on its line opened no editor (Qt dropped the name's odd byte on the way), and
    the record keeps such a name as `caf\\xe9.txt`, which no file of the diff matched."""
    from anima import comments
    from anima.store.store import Store

    name = os.fsdecode(b"caf\xe9.txt")
    rec = branch_changing(git_repo, {"a.txt": "a\n"}, {name: "one\ntwo\n"})
    store = Store(ProjectPaths(git_repo))
    store.paths.milestones.mkdir(parents=True)
    store.save_record(rec)
    view = open_view(qtbot, git_repo, rec)
    view.file_table.selectRow(next(r for r, f in enumerate(view.files.files)
                                   if f is not None and f.path.startswith("caf")))
    diff = view.diff
    n = row_of(view, "+ two")
    added: list[tuple[Any, ...]] = []
    view.comment_added.connect(lambda *a: added.append(a))
    qtbot.mouseMove(diff.viewport(), diff.block_rect(n).center())
    qtbot.mouseClick(diff.viewport(), Qt.MouseButton.LeftButton, pos=diff.block_rect(n).center())
    qtbot.keyClicks(view.comment_box.text, "why two?")
    qtbot.keyClick(view.comment_box.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    (_, path, line, text), = added
    comments.add_comment(store, "m1", path, line, text)  # as the window's engine saves it
    view.show_record(store.load_record("m1"))  # back with the record, as after a restart
    n = row_of(view, "+ two")
    assert (diff.rows[n + 1].kind, diff.rows[n + 1].text) == ("#", "why two?")


def test_anima_files_are_listed_apart_never_folded_and_not_counted(qtbot, git_repo) -> None:
    view, _ = review_view(qtbot, git_repo)
    model = view.files
    listed = [model.index(r, 0).data() for r in range(model.rowCount())]
    assert listed == ["app.py", "notes.txt", "uv.lock", ANIMA_SECTION, ".anima/config.json"]
    assert "3 files, +8 −3" in view.summary.text()  # the config's line is not counted
    assert "1 of Anima's files, not counted" in view.summary.text()
    view.file_table.selectRow(4)
    assert not view.fold_bar.isVisible() and "auto_start" in view.diff.toPlainText()
    # Paths are cut in the middle, never from the left; the whole path on hover.
    assert view.file_table.textElideMode() == Qt.TextElideMode.ElideMiddle
    assert model.index(4, 0).data(Qt.ItemDataRole.ToolTipRole) == ".anima/config.json"


def test_a_comment_opens_under_its_line_saves_with_ctrl_enter_and_stays_inline(
        qtbot, git_repo: Path) -> None:
    view, rec = review_view(qtbot, git_repo)
    diff = view.diff
    n = row_of(view, "+     return 10")
    qtbot.mouseMove(diff.viewport(), diff.block_rect(n).center())
    assert diff.hovered == n  # the "+" on the line under the mouse
    qtbot.mouseClick(diff.viewport(), Qt.MouseButton.LeftButton, pos=diff.block_rect(n).center())
    box = view.comment_box
    assert box.isVisible() and box.caption.text() == "Comment on app.py:2"
    # Under the clicked line, in a gap that pushed the next lines down.
    assert diff.rows[n + 1].kind == "_"
    assert diff.block_rect(n).bottom() <= box.y() <= diff.block_rect(n + 1).bottom()
    added: list[tuple[str, ...]] = []
    view.comment_added.connect(lambda *a: added.append(a))
    qtbot.keyClicks(box.text, "10 or 1?")
    qtbot.keyClick(box.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    assert added == [("m1", "app.py", 2, "10 or 1?")]
    assert not box.isVisible() and all(r.kind != "_" for r in diff.rows)
    # The saved comment comes back with the record: shown inline, under its line.
    rec.comments = [ReviewComment(id="c1", path="app.py", line=2, text="10 or 1?",
                                  at=datetime.now(UTC))]
    view.show_record(rec)
    n = row_of(view, "+     return 10")
    assert (diff.rows[n + 1].kind, diff.rows[n + 1].text) == ("#", "10 or 1?")
    # Esc closes an editor without saving.
    qtbot.mouseClick(diff.viewport(), Qt.MouseButton.LeftButton,
                     pos=diff.block_rect(row_of(view, "+ def g():")).center())
    assert box.isVisible()
    qtbot.keyClick(box.text, Qt.Key.Key_Escape)
    assert not box.isVisible() and len(added) == 1


def test_no_plus_where_comments_cannot_be_left(qtbot, git_repo: Path) -> None:
    view, _ = review_view(qtbot, git_repo, status="in_progress")
    n = row_of(view, "+     return 10")
    qtbot.mouseMove(view.diff.viewport(), view.diff.block_rect(n).center())
    assert view.diff.hovered is None


def test_keys_for_hunks_and_files_find_in_the_diff_and_words_that_changed(
        qtbot, git_repo: Path) -> None:
    view, _ = review_view(qtbot, git_repo)
    view.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is view, timeout=5000)
    view.diff.setFocus()
    assert view.current_file is not None and view.current_file.path == "app.py"
    hunks = view.diff.hunk_rows()
    assert len(hunks) == 1
    qtbot.keyClick(view.diff, Qt.Key.Key_F7)  # no other hunk here: on to the next file
    assert shown(view) == "notes.txt"
    qtbot.keyClick(view.diff, Qt.Key.Key_Up, Qt.KeyboardModifier.AltModifier)
    assert shown(view) == "app.py"
    qtbot.keyClick(view.diff, Qt.Key.Key_Down, Qt.KeyboardModifier.AltModifier)
    assert shown(view) == "notes.txt"
    qtbot.keyClick(view.diff, Qt.Key.Key_F7, Qt.KeyboardModifier.ShiftModifier)
    assert shown(view) == "app.py"
    # Find in the diff, not in a transcript.
    view.search.open_bar()
    qtbot.keyClicks(view.search.edit, "return 10")
    assert view.diff.textCursor().selectedText() == "return 10"
    # "return 1" → "return 10": only the number is marked, on both lines.
    old, new = row_of(view, "-     return 1"), row_of(view, "+     return 10")
    assert view.diff.highlighter.words[old] == [(11, 1)]
    assert view.diff.highlighter.words[new] == [(11, 2)]
    marked = [f for f in view.diff.document().findBlockByNumber(new).layout().formats()
              if f.format.background().color().alpha() == 110]
    assert marked and marked[0].start == PREFIX + 11


def test_side_by_side_faces_old_and_new_lines(qtbot, git_repo: Path) -> None:
    view, rec = review_view(qtbot, git_repo)
    view.side_by_side.setChecked(True)
    assert view.diff_stack.currentWidget() is view.sides
    left, right = view.sides.left.rows, view.sides.right.rows
    assert len(left) == len(right)
    n = next(i for i, r in enumerate(left) if r.kind == "-")
    assert (left[n].text, right[n].text) == ("    return 1", "    return 10")
    assert view.sides.right.highlighter.words[n] == [(11, 2)]
    # Added lines with nothing facing them: padding on the left.
    assert any(r.kind == PAD for r in left) and not any(r.kind == PAD for r in right)
    # A comment saved meanwhile shows on the right, under its new line.
    rec.comments = [ReviewComment(id="c1", path="app.py", line=2, text="why 10?",
                                  at=datetime.now(UTC))]
    view.show_record(rec)
    right = view.sides.right.rows
    at = next(i for i, r in enumerate(right) if r.kind == "+" and r.new_line == 2)
    assert (right[at + 1].kind, right[at + 1].text) == ("#", "why 10?")


def test_comments_are_written_and_shown_side_by_side(qtbot, git_repo: Path) -> None:
    rec = branch_changing(git_repo, {"list.txt": "one\ntwo\nthree\nfour\n"},
                          {"list.txt": "one\nTWO\n"})
    view = open_view(qtbot, git_repo, rec)
    qtbot.mouseClick(view.side_by_side, Qt.MouseButton.LeftButton)
    left, right, box = view.sides.left, view.sides.right, view.comment_box
    added: list[tuple[str, ...]] = []
    view.comment_added.connect(lambda *a: added.append(a))

    def row(view: DiffView, text: str) -> int:
        return next(n for n, r in enumerate(view.rows) if row_text(r).endswith(text))

    def click(view: DiffView, n: int) -> None:
        qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton,
                         pos=view.block_rect(n).center())

    def write(text: str) -> None:
        qtbot.keyClicks(box.text, text)
        qtbot.keyClick(box.text, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)

    def aligned() -> bool:  # row for row, on screen
        return len(left.rows) == len(right.rows) and all(
            left.block_rect(n).top() == right.block_rect(n).top() for n in range(len(left.rows)))

    # A new line (right): the editor opens under it, in side by side; the left makes room.
    n = row(right, "+ TWO")
    qtbot.mouseMove(right.viewport())  # the pointer comes into the right side…
    qtbot.mouseMove(right.viewport(), right.block_rect(n).center())  # …onto the line
    assert right.hovered == n
    click(right, n)
    assert view.diff_stack.currentWidget() is view.sides
    assert box.isVisible() and box.caption.text() == "Comment on list.txt:2"
    assert box.parentWidget() is right.viewport()
    assert right.block_rect(n).bottom() <= box.y() <= right.block_rect(n + 1).bottom()
    assert (left.rows[n + 1].kind, right.rows[n + 1].kind) == ("_", "_") and aligned()
    write("why upper case?")
    assert added == [("m1", "list.txt", 2, "why upper case?")]
    assert not box.isVisible() and aligned()
    # A removed line the new file has no line for (left): there.
    m = row(left, "- four")
    click(left, m)
    assert box.parentWidget() is left.viewport() and box.caption.text() == "Comment on list.txt:4"
    assert left.block_rect(m).bottom() <= box.y() <= left.block_rect(m + 1).bottom()
    write("keep four")
    assert added[-1] == ("m1", "list.txt", 4, "keep four")

    # Saved, they come back with the record: inline, each on its side, the sides row for row.
    rec.comments = [ReviewComment(id="c1", path="list.txt", line=2, text="why upper case?",
                                  at=datetime.now(UTC)),
                    ReviewComment(id="c2", path="list.txt", line=4, text="keep four",
                                  at=datetime.now(UTC))]
    view.show_record(rec)
    n, m = row(right, "+ TWO"), row(left, "- four")
    assert (right.rows[n + 1].kind, right.rows[n + 1].text) == ("#", "why upper case?")
    assert (left.rows[m + 1].kind, left.rows[m + 1].text) == ("#", "keep four")
    assert "why upper case?" in right.toPlainText() and "keep four" in left.toPlainText()
    assert "why" not in left.toPlainText() and "keep" not in right.toPlainText()
    assert aligned()
    # Both stay when the views switch, in the unified view too.
    qtbot.mouseClick(view.side_by_side, Qt.MouseButton.LeftButton)
    assert [r.text for r in view.diff.rows if r.kind == "#"] == ["keep four", "why upper case?"]
    qtbot.mouseClick(view.side_by_side, Qt.MouseButton.LeftButton)
    assert "why upper case?" in right.toPlainText() and "keep four" in left.toPlainText()
    # A click on a saved comment edits it, where it is.
    click(left, row(left, "keep four"))
    assert box.parentWidget() is left.viewport()
    assert box.caption.text() == "Edit the comment on list.txt:4"
    qtbot.keyClick(box.text, Qt.Key.Key_Escape)
    # A line both sides show, or a removed line whose number the new file has too: on the
    # new side (a comment has a line number, the new file's first; the toggle says so).
    for side, text in ((left, "  one"), (left, "- two")):
        click(side, row(side, text))
        assert box.parentWidget() is right.viewport()
        qtbot.keyClick(box.text, Qt.Key.Key_Escape)
    assert box.caption.text() == "Comment on list.txt:2" and aligned()
    assert "removed line" in view.side_by_side.toolTip()


def test_viewed_marks_count_and_reset_when_the_file_changes_again(
        qtbot, git_repo: Path) -> None:
    view, rec = review_view(qtbot, git_repo)
    model = view.files
    model.setData(model.index(0, model.VIEWED), Qt.CheckState.Checked.value,
                  Qt.ItemDataRole.CheckStateRole)
    assert "1/3 viewed" in view.summary.text()
    current = view.current_row_file()
    assert current is not None and current.path == "notes.txt"  # on to the next one
    # The Developer changes app.py again: the mark goes, notes.txt's did not exist.
    (git_repo / "app.py").write_text("def f():\n    return 11\n")
    run_git(git_repo, "commit", "-qam", "fix")
    rec.iterations = [Iteration(round=1, kind="fix", verdict="accepted", commit="x",
                                started_at=datetime.now(UTC), ended_at=datetime.now(UTC))]
    view.show_record(rec)
    assert model.index(0, 0).data() == "app.py"
    assert model.index(0, model.VIEWED).data(Qt.ItemDataRole.CheckStateRole) \
        == Qt.CheckState.Unchecked
    assert "viewed" not in view.summary.text()


def click_viewed(qtbot, view: ChangesView, path: str) -> None:
    """Tick a file's ✓ as the reviewer does: a click on the check box in its row."""
    table, model = view.file_table, view.files
    row = next(r for r in model.file_rows() if model.index(r, 0).data() == path)
    index = model.index(row, model.VIEWED)
    option = QStyleOptionViewItem()
    option.rect = table.visualRect(index)
    option.widget = table
    delegate = table.itemDelegateForIndex(index)
    assert isinstance(delegate, QStyledItemDelegate)
    delegate.initStyleOption(option, index)
    box = table.style().subElementRect(QStyle.SubElement.SE_ItemViewItemCheckIndicator, option,
                                       table)
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=box.center())


def viewed(view: ChangesView) -> set[str]:
    """The files the table shows ticked."""
    model = view.files
    return {model.index(r, 0).data() for r in model.file_rows()
            if model.index(r, model.VIEWED).data(Qt.ItemDataRole.CheckStateRole)
            == Qt.CheckState.Checked}


def test_viewed_marks_outlive_the_window_until_the_file_changes_again(
        qtbot, git_repo: Path, fake: FakeClaude, tmp_path: Path) -> None:
    def changes_of(w: Window) -> ChangesView:
        page = w.page()
        page.tabs.setCurrentWidget(page.changes)
        qtbot.waitUntil(lambda: page.changes.files.file_rows() != [], timeout=10000)
        return page.changes

    worktree = ProjectPaths(git_repo).worktree("m1")
    with paused_by_rejections(qtbot, git_repo, fake, tmp_path) as w:
        (worktree / "NOTES.md").write_text("notes\n")  # a second file to review
        run_git(worktree, "add", "NOTES.md")
        run_git(worktree, "commit", "-qm", "notes")
        changes = changes_of(w)
        for path in ("NOTES.md", "features/F1.txt"):
            click_viewed(qtbot, changes, path)
        assert viewed(changes) == {"NOTES.md", "features/F1.txt"}
        # The tab closed and opened again: still there.
        w.window.close_page("m1")
        assert viewed(changes_of(w)) == {"NOTES.md", "features/F1.txt"}
    # The window is gone; the Developer changes one file again meanwhile.
    with (worktree / "NOTES.md").open("a") as notes:
        notes.write("one more line\n")
    run_git(worktree, "commit", "-qam", "more")
    w2 = Window(qtbot, tmp_path)  # the same settings file: a restart
    try:
        w2.window.open_project(git_repo)
        changes = changes_of(w2)
        # The other file's mark is back; the changed file's went with its old version.
        assert viewed(changes) == {"features/F1.txt"}
        assert "1/2 viewed" in changes.summary.text()
    finally:
        w2.close()
    # Kept in the window's settings (the project's .anima/ is the engine's).
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    assert "features/F1.txt" in str(settings.value("review/viewed"))


def test_viewed_marks_keep_the_milestones_marked_last(tmp_path: Path) -> None:
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    old = {f"m{i}": {"at": 1000 + i, "files": {"a.py": "f"}} for i in range(KEEP)}
    settings.setValue("review/viewed", json.dumps({"/elsewhere": old}))
    marks = ViewedMarks(settings)
    marks.save(tmp_path, "new", {"b.py": "g"})
    assert marks.load(tmp_path, "new") == {"b.py": "g"}
    assert marks.load(Path("/elsewhere"), "m0") == {}  # the one marked longest ago
    assert marks.load(Path("/elsewhere"), "m1") == {"a.py": "f"}
    marks.save(tmp_path, "new", {})  # all unticked: nothing kept for it
    assert str(tmp_path) not in json.loads(str(settings.value("review/viewed")))
    settings.setValue("review/viewed", "not json")  # edited by hand: no marks, no crash
    assert marks.load(tmp_path, "new") == {}
