"""`notify_command`: run the user's command for each notice, the event as JSON on stdin.

So a paused milestone, one awaiting review or a completed one reaches a phone or a chat while
nobody watches the window (`curl` to a webhook, `notify-send`, a mail script…). The command
runs through the shell, off the engine's thread, at most `NOTIFY_TIMEOUT_SECONDS` each, in a
session of its own: one that runs longer is killed with every process of that session (a child
it left in the background would otherwise run for ever; one that starts a session of its own is
out of reach). A failure is logged on the milestone's log, never raised into the loop.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
from datetime import UTC, datetime

from anima.events import Event, EventBus, LogLine, Notice

NOTIFY_TIMEOUT_SECONDS = 30.0


def notice_json(notice: Notice, project: str) -> str:
    return json.dumps({"event": notice.kind, "milestone": notice.milestone_id,
                       "message": notice.message, "project": project,
                       "at": datetime.now(UTC).isoformat(timespec="seconds")})


class NotifyCommand:
    """Subscribes to a bus; each `Notice` runs `command` with its JSON on stdin."""

    def __init__(self, bus: EventBus, command: str, project: str) -> None:
        self.bus, self.command, self.project = bus, command, project
        self._threads: list[threading.Thread] = []
        self._unsubscribe = bus.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, Notice):
            thread = threading.Thread(target=self._run, args=(event,), name="notify-command",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _run(self, notice: Notice) -> None:
        try:
            with subprocess.Popen(self.command, shell=True, stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True) as proc:
                try:
                    _, err = proc.communicate(notice_json(notice, self.project),
                                              timeout=NOTIFY_TIMEOUT_SECONDS)
                    problem = f"exited {proc.returncode}: {err.strip()[-300:]}" \
                        if proc.returncode else ""
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):  # all gone meanwhile
                        os.killpg(proc.pid, signal.SIGKILL)  # its session's group: pgid = pid
                    problem = (f"did not finish within {NOTIFY_TIMEOUT_SECONDS:g}s; Anima "
                               "killed it and every process it started")
        except OSError as e:
            problem = str(e)
        if problem:
            self.bus.publish(LogLine(notice.milestone_id, f"notify_command failed: {problem}"))

    def close(self, timeout: float = 5.0) -> None:
        """Stop listening; wait a little for commands still running."""
        self._unsubscribe()
        for thread in self._threads:
            thread.join(timeout)
