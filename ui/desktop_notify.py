"""Desktop notifications where there is no tray icon to show them: the freedesktop
notification service (GNOME, KDE, dunst, mako…) on the session D-Bus.

Through jeepney, a small pure-Python D-Bus library: PySide6's QtDBus cannot send the `u` and
`as` arguments the service's `Notify` signature requires, and the services check it. Each
notice is sent on a short-lived thread, so a hung bus never freezes the window; a desktop
without the service (or without a session bus) is logged once and otherwise left alone.
"""

from __future__ import annotations

import logging
import threading

from jeepney import DBusAddress, new_method_call
from jeepney.io.blocking import DBusConnection, open_dbus_connection
from jeepney.wrappers import unwrap_msg

log = logging.getLogger(__name__)

SERVICE = DBusAddress("/org/freedesktop/Notifications", bus_name="org.freedesktop.Notifications",
                      interface="org.freedesktop.Notifications")
#: How long a notification stays up, in ms (the service may choose otherwise).
EXPIRE_MS = 10_000
_REPLY_TIMEOUT_S = 5.0


class DesktopNotifier:
    """Sends `Notify` calls; `notify` returns at once."""

    def __init__(self, app_name: str = "Anima") -> None:
        self.app_name = app_name
        self._lock = threading.Lock()
        self._connection: DBusConnection | None = None
        self._reported = False
        self._threads: list[threading.Thread] = []

    def notify(self, summary: str, body: str) -> None:
        thread = threading.Thread(target=self._send, args=(summary, body), daemon=True,
                                  name="anima-desktop-notify")
        self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def wait(self, timeout: float = _REPLY_TIMEOUT_S) -> None:
        """Let the notices already sent arrive (closing the window, tests)."""
        for thread in list(self._threads):
            thread.join(timeout)

    def close(self) -> None:
        """Drop the connection; a send stuck on a hung bus is left to its daemon thread."""
        if self._lock.acquire(timeout=1.0):
            try:
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
            finally:
                self._lock.release()

    def _send(self, summary: str, body: str) -> None:
        message = new_method_call(SERVICE, "Notify", "susssasa{sv}i",
                                  (self.app_name, 0, "", summary, body, [], {}, EXPIRE_MS))
        with self._lock:
            try:
                if self._connection is None:
                    self._connection = open_dbus_connection(bus="SESSION")
                unwrap_msg(self._connection.send_and_get_reply(message,
                                                               timeout=_REPLY_TIMEOUT_S))
            except Exception as e:  # no bus, no service, a refusal: notices are a courtesy
                if self._connection is not None:
                    self._connection.close()
                    self._connection = None
                if not self._reported:
                    self._reported = True
                    log.info("desktop notifications are unavailable (%s: %s); Anima shows its "
                             "notices in the window only", type(e).__name__, e)
