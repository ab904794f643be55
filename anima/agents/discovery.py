"""Find a working agent CLI: config, then its environment variable, then PATH (any backend)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from anima.agents.dialect import AgentBinary
from anima.errors import AgentNotFound

VERSION_TIMEOUT_SECONDS = 10.0


def _probe(command: str, source: str) -> tuple[AgentBinary | None, str]:
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
            start_new_session=True,  # a Ctrl+C is for Anima (see GitRepo._run)
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
    return AgentBinary(argv=argv, version=version), ""


def role_keys(roles: tuple[str, ...], setting: str) -> str:
    """`developer.command / acceptor.command`: the settings of the roles that run a CLI."""
    return " / ".join(f"{role}.{setting}" for role in roles)


def find_binary(name: str, configured: str | None, *, config_key: str, env_var: str,
                install_hint: str, roles: tuple[str, ...] = ()) -> AgentBinary:
    """The first configured source wins; a configured-but-broken command is an error, not skipped.

    Falling through to PATH after a broken explicit setting would silently run a different
    binary than the user asked for. `roles`: those that run it, named in the error (which
    `agent` chose it).
    """
    tried: list[str] = []
    env_command = os.environ.get(env_var)
    if configured:
        candidate = (configured, f"config {config_key}")
    elif env_command:
        candidate = (env_command, f"${env_var}")
    else:
        candidate = (name, "PATH")
    if not configured:
        tried.append(f"config {config_key}: not set")
    if not configured and not env_command:
        tried.append(f"${env_var}: not set")
    binary, why = _probe(*candidate)
    if binary is not None:
        return binary
    tried.append(why)
    chosen = f' for {role_keys(roles, "agent")} "{name}"' if roles else ""
    raise AgentNotFound(
        f"No working `{name}` CLI found{chosen}. Tried:\n  - " + "\n  - ".join(tried)
        + f"\nInstall it with: {install_hint} (or set {config_key} in .anima/config.json)"
    )
