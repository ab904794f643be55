"""Output to a reader that went away: `anima status | head -1` or `anima run --headless |
head` ends what is printed, not the command. A write to the closed pipe would raise
BrokenPipeError wherever it happened: in a headless run, in the thread that delivers the
agents' events, and at the end, where it would turn the run's exit code into 1."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO, cast


class _Guarded:
    """A stream (text, or its binary buffer) whose writes to a closed pipe are dropped."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        try:
            return int(self._stream.write(data))
        except BrokenPipeError:
            self._gone()
            return len(data)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    @property
    def buffer(self) -> _Guarded:
        return _Guarded(self._stream.buffer)

    def _gone(self) -> None:
        """What is still buffered, and every later write, goes to /dev/null (Python would
        otherwise fail flushing it at exit)."""
        with contextlib.suppress(OSError, ValueError):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def reader_may_go() -> Iterator[None]:
    """While the command runs, its stdout and stderr drop what a gone reader cannot take."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = cast(TextIO, _Guarded(out)), cast(TextIO, _Guarded(err))
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
