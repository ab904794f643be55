"""The credentials in Anima's environment, kept out of what its agents and checks inherit.

The sandbox hides your keys on disk (`~/.ssh`, `~/.aws`, `~/.config/gh`…), but the network is
open: a Developer, or the code it writes that the checks run, that found `GH_TOKEN` or
`AWS_SECRET_ACCESS_KEY` in its environment could push, publish or deploy as you. So a child
inherits Anima's environment without the variables whose names say credential, or whose
value is a URL with a password in it (`is_credential`), sandboxed or not (this is no mount):
each agent's CLI keeps its own login (`Backend.credentials`), and the names in config
`pass_env` reach them all. Values are never shown; only names are said, once.
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Iterable, Mapping

#: A name holding one of these (in any case) names a credential: `GH_TOKEN`, `NPM_TOKEN`,
#: `AWS_SECRET_ACCESS_KEY`, `PGPASSWORD`, `GOOGLE_APPLICATION_CREDENTIALS`,
#: `npm_config__authToken`. A harmless one that matches too (`TOKENIZERS_PARALLELISM`) is kept
#: out all the same: one rule you can predict, and `pass_env` for the exceptions.
WORDS = ("KEY", "SECRET", "TOKEN", "PASSWORD", "PASSWD", "CREDENTIAL", "ASKPASS")
#: Credentials whose names hold none of the words: your SSH agent (it signs with the keys
#: `~/.ssh` holds), MySQL's password, a Docker registry login, and your editor's line to
#: the git logins it keeps (VS Code's terminal: `git push` over HTTPS asks it, through
#: `GIT_ASKPASS`, and it answers).
NAMES = frozenset({"SSH_AUTH_SOCK", "MYSQL_PWD", "DOCKER_AUTH_CONFIG", "VSCODE_GIT_IPC_HANDLE"})
#: git's own config given by the environment: `GIT_CONFIG_KEY_<n>` holds a setting's name, and
#: without it git refuses to run at all ("missing config key").
_GIT_CONFIG_KEY = re.compile(r"GIT_CONFIG_KEY_\d+")
_WORDS = re.compile("|".join(WORDS), re.IGNORECASE)
#: A URL that carries a password is a credential whatever its variable's name
#: (`DATABASE_URL=postgres://app:…@db/prod`, `REDIS_URL`, `AMQP_URL`). A proxy's is not
#: (`HTTPS_PROXY=http://you:…@proxy:3128`): the agents' CLIs reach their API through it.
_URL_WITH_PASSWORD = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s:]*:[^/?#@\s]+@")
_PROXY = re.compile(r".*_PROXY", re.IGNORECASE)
_OFF = frozenset({"", "0", "false", "no", "off"})


def is_credential(name: str, value: str = "") -> bool:
    """Whether the variable `name` (set to `value`) is kept out of the agents' and checks'
    environment."""
    if _GIT_CONFIG_KEY.fullmatch(name):
        return False
    if name.upper() in NAMES or _WORDS.search(name) is not None:
        return True
    return _PROXY.fullmatch(name) is None and _URL_WITH_PASSWORD.search(value) is not None


def credential_names(environ: Mapping[str, str]) -> list[str]:
    """The credential variables of `environ`, sorted."""
    return sorted(name for name, value in environ.items() if is_credential(name, value))


def inherited(keep: Collection[str] = ()) -> dict[str, str]:
    """Anima's environment as every child of its gets it (an agent, a check, the setup
    command): without its credentials but those in `keep`, and without `CLAUDECODE` (the
    claude CLI refuses to start inside another Claude Code session)."""
    return {name: value for name, value in os.environ.items()
            if name != "CLAUDECODE" and (name in keep or not is_credential(name, value))}


def with_prefix(environ: Mapping[str, str], prefixes: Iterable[str]) -> set[str]:
    """The credential variables of `environ` that start with one of `prefixes` (a CLI's own
    namespace, such as `ANTHROPIC_`)."""
    starts = tuple(prefixes)
    return {name for name in credential_names(environ) if name.startswith(starts)}


def is_on(environ: Mapping[str, str], name: str) -> bool:
    """Whether a switch variable is set to something other than off (`1`, `true`)."""
    return environ.get(name, "").strip().lower() not in _OFF


def describe_kept(environ: Mapping[str, str], pass_env: Collection[str],
                  own: Mapping[str, Collection[str]]) -> str | None:
    """What the log says once: the names kept out of every child, and those only their own
    CLI gets (`own`: per agent CLI, its credentials); None when there are none."""
    hidden = [name for name in credential_names(environ) if name not in pass_env]
    if not hidden:
        return None
    theirs = {cli: sorted(set(names) & set(hidden)) for cli, names in sorted(own.items())}
    everywhere = [name for name in hidden if not any(name in names for names in theirs.values())]
    parts = [f"kept out of the agents' and checks' environment: {', '.join(everywhere)}"
             ] if everywhere else []
    parts += [f"{', '.join(names)} reach{'es' if len(names) == 1 else ''} only the {cli} CLI, "
              "not the checks" for cli, names in theirs.items() if names]
    return "; ".join(parts) + " (pass_env in .anima/config.json lets one through)"
