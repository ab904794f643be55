"""Find a working `claude` binary: config, then $ANIMA_CLAUDE_COMMAND, then PATH."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from anima.errors import AgentNotFound

INSTALL_HINT = "npm install -g @anthropic-ai/claude-code"
ENV_VAR = "ANIMA_CLAUDE_COMMAND"
VERSION_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class ClaudeBinary:
    """A command that ran `--version` successfully; argv may be several words (`python3 x.py`)."""

    argv: list[str]
    version: str

    def install_paths(self) -> tuple[Path, ...]:
        """What a sandbox must keep visible to run it: the folders of the files its command
        names, and their real locations (npm links `.bin/claude` into its package)."""
        found: list[Path] = []
        for word in self.argv:
            if os.path.isabs(word) and os.path.exists(word):
                found += [Path(word).parent, Path(os.path.realpath(word)).parent]
        return tuple(dict.fromkeys(found))


def _probe(command: str, source: str) -> tuple[ClaudeBinary | None, str]:
    """Try one candidate; return it, or None and a line saying why it did not work."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        return None, f"{source} {command!r}: cannot parse ({e})"
    if not argv:
        return None, f"{source}: empty command"
    exe = argv[0]
    resolved = shutil.which(exe)
    if resolved is None:
        return None, f"{source} {command!r}: {exe!r} not found"
    argv[0] = resolved
    env = {k: v for k, v in os.environ.items() if k != "CLAUDECODE"}
    try:
        proc = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, env=env,
            stdin=subprocess.DEVNULL, timeout=VERSION_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return None, f"{source} {command!r}: --version timed out after {VERSION_TIMEOUT_SECONDS:g}s"
    except OSError as e:
        return None, f"{source} {command!r}: cannot run ({e.strerror or e})"
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        why = f"{source} {command!r}: --version exited {proc.returncode} {detail[0]}"
        return None, why.rstrip()
    version = proc.stdout.strip().splitlines()[0] if proc.stdout.strip() else "unknown"
    return ClaudeBinary(argv=argv, version=version), ""


def find_claude(configured: str | None) -> ClaudeBinary:
    """The first configured source wins; a configured-but-broken command is an error, not skipped.

    Falling through to PATH after a broken explicit setting would silently run a different
    binary than the user asked for.
    """
    tried: list[str] = []
    env_command = os.environ.get(ENV_VAR)
    if configured:
        candidate = (configured, "config claude_command")
    elif env_command:
        candidate = (env_command, f"${ENV_VAR}")
    else:
        candidate = ("claude", "PATH")
    if not configured:
        tried.append("config claude_command: not set")
    if not configured and not env_command:
        tried.append(f"${ENV_VAR}: not set")
    binary, why = _probe(*candidate)
    if binary is not None:
        return binary
    tried.append(why)
    raise AgentNotFound(
        "No working `claude` CLI found. Tried:\n  - " + "\n  - ".join(tried)
        + f"\nInstall it with: {INSTALL_HINT} (or set claude_command in .anima/config.json)"
    )
