"""Anima's own log: `.anima/logs/anima.log`, rotating, with tracebacks.

The milestone logs (`<id>.log`) say what happened to a milestone; this one says what happened
to Anima: every `[anima]` line (project-wide ones included), warnings, and the traceback of
any unexpected error, so a failure in the field can be understood afterwards. Redacted like
everything else Anima writes.
"""

from __future__ import annotations

import logging
import logging.handlers
import sys
import threading
from pathlib import Path

from anima.paths import ProjectPaths

LOG_NAME = "anima.log"
_MAX_BYTES = 2_000_000
_BACKUPS = 3
_lock = threading.Lock()
_handler: logging.handlers.RotatingFileHandler | None = None


class _LogFile(logging.handlers.RotatingFileHandler):
    """The log file, which may fail to write (a full disk): that is said once on stderr, not
    as a traceback per line logged, and the run goes on."""

    _failed = False

    def handleError(self, record: logging.LogRecord) -> None:
        if not self._failed:
            self._failed = True
            print(f"[anima] cannot write {self.baseFilename}; its lines are lost until it "
                  "can be written again", file=sys.stderr)


class _RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        # Imported on the first line logged: `anima status`, which scripts poll, configures
        # the log but rarely writes to it, and the patterns cost a tenth of its start-up.
        from anima.text.redact import redact

        return redact(super().format(record))


def log_path(paths: ProjectPaths) -> Path:
    return paths.logs / LOG_NAME


def configure_logging(paths: ProjectPaths) -> Path:
    """Send Python logging (INFO and up) to the project's anima.log; idempotent. One project
    per process: configuring another one moves the log there."""
    global _handler
    path = log_path(paths)
    with _lock:
        if _handler is not None and Path(_handler.baseFilename) == path.absolute():
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = _LogFile(path, maxBytes=_MAX_BYTES, backupCount=_BACKUPS, encoding="utf-8")
        handler.setLevel(logging.INFO)
        handler.setFormatter(_RedactingFormatter(
            "%(asctime)s %(levelname)s %(name)s [%(process)d %(threadName)s] %(message)s"))
        root = logging.getLogger()
        if _handler is not None:
            root.removeHandler(_handler)
            _handler.close()
        root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
        _handler = handler
    return path
