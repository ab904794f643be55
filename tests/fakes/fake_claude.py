#!/usr/bin/env python3
"""The fake `claude` (scripted_claude.py), started as `python -I -S fake_claude.py`.

A launcher only: the suite starts the fake thousands of times on CI's two cores, and a main
script is compiled at every start where an imported module's bytecode is cached (compiled
once by tests/conftest.py); `-I -S` skips site-packages, which the fake never uses. Anima
asks each CLI's `--version` at every start: answered here, before the fake's imports.
"""

import os
import sys

VERSION = "9.9.9 (Fake Claude)"

if __name__ == "__main__":
    if sys.argv[1:] == ["--version"]:
        print(VERSION)
        sys.exit(0)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from scripted_claude import run

    run()
