"""The `anima` console script: a subcommand goes to the CLI, a path (or nothing) opens the app.

The one module above both front ends, so `anima.cli` and `ui` never import each other; each
is imported only when chosen (the CLI starts without loading Qt).
"""

from __future__ import annotations

import sys

#: The CLI's subcommands (and help); anything else is a project path for the app.
COMMANDS = ("init", "add", "run", "status", "stop", "resume", "approve", "abort", "-h", "--help")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in COMMANDS:
        from anima.cli import main as cli_main

        return cli_main(argv)
    from ui.app import main as app_main  # noqa: TID251 - the app entry point lives in ui/

    return app_main(argv)


if __name__ == "__main__":
    raise SystemExit(main())
