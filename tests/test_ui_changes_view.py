"""The Changes view: a milestone's diff, file by file, and comments on its lines."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import Qt

from anima.diffs import milestone_changes
from anima.git import GitRepo
from anima.store.models import MilestoneRecord, MilestoneStatus
from tests.conftest import FakeClaude, run_git
from tests.helpers import record
from tests.test_ui_app import Window, paused_by_rejections
from ui.changes_view import ChangesView

pytestmark = [pytest.mark.qt_log_level_fail("WARNING"),
              pytest.mark.qt_log_ignore("propagateSizeHints")]


def paused_milestone(git_repo: Path) -> MilestoneRecord:
    """A branch changing a Python file, a lock file and a file's indentation only."""
    (git_repo / "app.py").write_text("def f():\n    return 1\n")
    (git_repo / "notes.txt").write_text("a\nb\n")
    run_git(git_repo, "add", "-A")
    run_git(git_repo, "commit", "-q", "-m", "base")
    base = run_git(git_repo, "rev-parse", "HEAD").strip()
    run_git(git_repo, "switch", "-q", "-c", "milestone/m1")
    (git_repo / "app.py").write_text("def f():\n    return 10\n\n\ndef g():\n    return 2\n")
    (git_repo / "notes.txt").write_text("a  \n  b\n")
    (git_repo / "uv.lock").write_text("version = 1\n")
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
