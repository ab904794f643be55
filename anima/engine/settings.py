"""config.json as the engine runs with it: read at start, read again before each milestone
when it was saved since (the window's error banner says to edit it: that must be enough), and
announced with `EngineReady`, so the window shows the limits really in force."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from anima.config import Config
from anima.engine.project import open_config
from anima.errors import ConfigError
from anima.events import EngineError, EngineReady, EventBus
from anima.notify import NotifyCommand
from anima.paths import ProjectPaths


def file_stamp(path: Path) -> tuple[int, int] | None:
    """(mtime in ns, size) of a file, None when it is missing: enough to notice a save."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class LiveConfig:
    """The settings in force, and the `notify_command` listener that goes with them."""

    def __init__(self, paths: ProjectPaths, bus: EventBus, overrides: dict[str, Any] | None,
                 parallel: Callable[[Config], int]) -> None:
        """`parallel`: how many milestones run at once under a config."""
        self.paths = paths
        self._bus = bus
        self._parallel = parallel
        self._overrides = overrides
        self.config = Config()
        self._stamp: tuple[int, int] | None = None
        self._notify: NotifyCommand | None = None

    def stamp(self) -> tuple[int, int] | None:
        return file_stamp(self.paths.config)

    def load(self) -> Config:
        """Read config.json (ConfigError when it is invalid)."""
        stamp = self.stamp()  # before reading: an edit meanwhile is seen
        self._use(open_config(self.paths, self._overrides))
        self._stamp = stamp
        return self.config

    def reloaded(self) -> Config | None:
        """The new settings when config.json was saved with a change since it was read; an
        invalid one is reported once and the settings read before are kept."""
        stamp = self.stamp()
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            config = open_config(self.paths, self._overrides)
        except ConfigError as e:
            self._bus.publish(EngineError(f"{e}; the settings read before stay in use"))
            return None
        if config == self.config:  # saved unchanged (or put back by a branch switch)
            return None
        self._use(config)
        return config

    def _use(self, config: Config) -> None:
        self.config = config
        command = config.notify_command
        if self._notify is not None and self._notify.command != command:
            self._notify.close()
            self._notify = None
        if command and self._notify is None:
            self._notify = NotifyCommand(self._bus, command, str(self.paths.root))
        self._bus.publish(EngineReady(config.model_copy(deep=True), self._parallel(config)))

    def close(self) -> None:
        if self._notify is not None:
            self._notify.close()
            self._notify = None
