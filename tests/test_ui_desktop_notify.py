"""Notices reach the desktop's notification service when the window has no tray icon: a real
private session bus (dbus-daemon) and a strict notification service on it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import FakeClaude
from tests.helpers import make_project
from ui.desktop_notify import DesktopNotifier

SERVER = Path(__file__).parent / "fakes" / "notification_server.py"

pytestmark = pytest.mark.skipif(shutil.which("dbus-daemon") is None,
                                reason="needs dbus-daemon (Debian: dbus-daemon)")


@pytest.fixture
def session_bus(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    daemon = subprocess.Popen(["dbus-daemon", "--session", "--nofork", "--print-address=1"],
                              stdout=subprocess.PIPE, text=True)
    assert daemon.stdout is not None
    address = daemon.stdout.readline().strip()
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
    yield address
    daemon.terminate()
    daemon.wait(10)


@pytest.fixture
def notifications(session_bus: str, tmp_path: Path) -> Iterator[Path]:
    """The file the service appends each Notify call to."""
    calls = tmp_path / "notifications.jsonl"
    env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": session_bus}
    server = subprocess.Popen([sys.executable, str(SERVER), str(calls)], stdout=subprocess.PIPE,
                              text=True, env=env)
    assert server.stdout is not None and server.stdout.readline().strip() == "ready"
    yield calls
    server.terminate()
    server.wait(10)


def received(calls: Path, count: int, timeout: float = 10.0,
             pause: Callable[[float], object] = time.sleep) -> list[dict[str, object]]:
    """The calls logged so far, once there are `count`; `pause` lets a window test keep the
    Qt event loop turning while it waits (the notice reaches the window as a queued signal)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = calls.read_text(encoding="utf-8").splitlines() if calls.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        pause(0.05)
    got = calls.read_text(encoding="utf-8") if calls.exists() else "none"
    raise AssertionError(f"{count} notification(s) expected, got {got}")


def test_a_notice_reaches_the_service_with_the_signature_it_requires(notifications: Path) -> None:
    notifier = DesktopNotifier()
    notifier.notify("Paused", "Greeter: three rejections in a row")
    notifier.wait()
    assert received(notifications, 1) == [{"app": "Anima", "summary": "Paused",
                                           "body": "Greeter: three rejections in a row",
                                           "expire": 10000}]
    notifier.close()


def test_without_a_bus_or_a_service_a_notice_is_dropped_quietly(
        session_bus: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ui.desktop_notify")
    notifier = DesktopNotifier()
    notifier.notify("Paused", "no service on this bus")
    notifier.notify("Paused", "still none")
    notifier.wait()
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent/bus")
    notifier.notify("Paused", "no bus at all")
    notifier.wait()
    notifier.close()
    unavailable = [r for r in caplog.records
                   if "desktop notifications are unavailable" in r.getMessage()]
    assert len(unavailable) == 1  # said once, not once per notice


def test_a_window_without_a_tray_notifies_the_desktop_when_a_milestone_pauses(
        qtbot, git_repo: Path, fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch,
        notifications: Path, tmp_path: Path) -> None:
    from tests.test_ui_app import TWO, Window

    fake_claude.use_env(monkeypatch)
    make_project(git_repo, {"m1": TWO})
    no = {"text": "REJECTED: still wrong"}
    fake_claude.write_script({"acceptor": [no, no, no]})
    w = Window(qtbot, tmp_path)
    try:
        assert w.window.tray is None and w.window.desktop_notifier is not None
        w.window.open_project(git_repo)
        w.wait_status("m1", "paused")
        [call] = received(notifications, 1, pause=lambda s: qtbot.wait(int(s * 1000)))
        assert call["summary"] == "Anima paused" and str(call["body"]).startswith("Greeter: ")
    finally:
        w.close()
