"""Why Qt could not open a window, said in one line before Qt aborts with a core dump.

Qt's xcb plugin (X11, and Wayland sessions without the wayland plugin) needs a few libraries a
fresh Debian/Ubuntu install lacks; without them, or without a display at all, QApplication
calls qFatal and the process dumps core. `platform_problem` checks first.
"""

from __future__ import annotations

import ctypes.util
import sys
from collections.abc import Callable, Mapping

#: (library name for find_library, the Debian/Ubuntu package that ships it)
XCB_LIBRARIES = (("xcb-cursor", "libxcb-cursor0"), ("xcb-icccm", "libxcb-icccm4"),
                 ("xcb-keysyms", "libxcb-keysyms1"))


def platform_problem(env: Mapping[str, str],
                     find_library: Callable[[str], str | None] = ctypes.util.find_library,
                     platform: str = sys.platform) -> str | None:
    """A one-line hint when Qt's xcb plugin will not start here, else None."""
    requested = env.get("QT_QPA_PLATFORM", "")
    if not platform.startswith("linux") or (requested and not requested.startswith("xcb")):
        return None
    if not requested and env.get("WAYLAND_DISPLAY"):
        return None  # Qt picks its wayland plugin
    if not env.get("DISPLAY"):
        return ("there is no display to open a window on (DISPLAY is not set): run "
                "`anima run PROJECT --headless`, or set QT_QPA_PLATFORM=offscreen")
    missing = [package for library, package in XCB_LIBRARIES if find_library(library) is None]
    if missing:
        return (f"Qt's xcb platform plugin needs {', '.join(missing)}; install "
                f"{'it' if len(missing) == 1 else 'them'}: sudo apt install {' '.join(missing)}")
    return None
