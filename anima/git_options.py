"""How Anima runs git: no program named in git's configuration runs in Anima's name.

An agent has a shell: it can write `~/.gitconfig`, a file the repository's config includes, a
hook or a `core.fsmonitor` command. Whatever git command Anima runs (status, switch, commit,
merge, diff) must not run any of them: no hook, clean/smudge/process filter, diff or merge
driver, textconv, external diff, fsmonitor, pager, editor, signing program, credential helper,
askpass, ssh or upload-pack command, from the repository's, the global or the system config.

- The global and system config are not read at all (`ANIMA_GIT_ENV`); what in them shapes the
  tree as the human's own git sees it (ignore and attributes files, line endings,
  `safe.directory`) is carried over as plain values, and the human's identity is read for
  Anima's commits (`HumanConfig`). Neither can name a program.
- The repository's config (the human's, which may include other files) is read, and every
  filter, textconv, external diff and merge driver defined there is switched off on the
  command line: files pass unfiltered, and a file with a custom merge driver conflicts
  (`human_config`, cached until one of the files it was read from or includes changes).
- The rest is fixed options (`NO_AGENT_CODE`) and environment (`ANIMA_GIT_ENV`).

A submodule's own config (a repository the Developer nests in its worktree) is not neutralised:
git would run git inside it, with its filters, to see whether its files changed, to check it
out or to show its diff. None of Anima's commands looks inside a submodule (its status ignores
their files, its switches are quiet, and `NO_AGENT_CODE` turns off the human's settings that
recurse), so none runs. The human's own git commands are untouched; so is the agents' git
(`AGENT_GIT_ENV`), but for the reviewer's fsmonitor (`REVIEWER_GIT_CONFIG`).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from anima.errors import GitError

#: Options for every git command Anima runs. Hooks (`core.hooksPath`) and an fsmonitor command
#: never run: the Developer could plant one (a `post-checkout` hook that moves main when Anima
#: checks it out, a `core.fsmonitor` command run by every `git status`). Replacement objects
#: (`git replace`) are ignored: with one, a Developer could make an accepted commit read as
#: other content in every review, check and merge. No pager, editor (`:` is git's "none"),
#: signing or signature check, credential helper or askpass; and no transport at all: a
#: partial clone's lazy fetch would run the repository's `remote.*.uploadpack`, ssh command
#: or proxy (`protocol.<name>.allow` in the repository's config outranks `protocol.allow`,
#: hence `GIT_ALLOW_PROTOCOL` in `ANIMA_GIT_ENV` too).
#: No `.mailmap`: `git log` and `git show` would open the work tree's, which the Developer
#: writes, and a FIFO there would hang them for good.
#: Never into a submodule: your `submodule.recurse` makes a switch, reset or checkout update
#: each active one, and your `diff.submodule=diff` makes a diff show each one's own diff,
#: both by running git inside it, which reads that repository's config (a Developer's
#: nested repository, with filters and diff drivers of its own).
NO_AGENT_CODE = (
    "--no-replace-objects", "--no-pager",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "submodule.recurse=false",
    "-c", "diff.submodule=short",
    "-c", "core.pager=cat",
    "-c", "core.editor=:",
    "-c", "sequence.editor=:",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "merge.verifySignatures=false",
    "-c", "log.showSignature=false",
    "-c", "log.mailmap=false",
    "-c", "credential.helper=",
    "-c", "core.askPass=",
    "-c", "protocol.allow=never",
)

# The values the per-repository overrides take (`--config-env=<key>=<variable>`: a driver's
# name may hold "=", which `-c key=value` would split at).
_NOTHING = "ANIMA_GIT_NOTHING"  # an empty command: git runs nothing (or fails, never runs it)
_FALSE = "ANIMA_GIT_FALSE"
#: A custom merge driver is not run; its files conflict instead (an empty driver is a fatal
#: "failure to merge"): `sh -c 'exit 1'`, nothing of the config's.
_CONFLICT = "ANIMA_GIT_CONFLICT"

#: The environment of Anima's git (over its own): no global nor system config, no prompt, no
#: pager, no editor, no transport; and the values `HumanConfig.overrides` refer to.
ANIMA_GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_PAGER": "cat",
    "GIT_EDITOR": ":",
    "GIT_SEQUENCE_EDITOR": ":",
    "GIT_ALLOW_PROTOCOL": "",
    _NOTHING: "",
    _FALSE: "false",
    _CONFLICT: "exit 1",
}

#: What an agent's git writes in a ref's reflog (commit, merge, reset, rebase, cherry-pick):
#: a commit on main from another worktree leaves no trace in the project tree's HEAD reflog,
#: but main's own reflog names the agent.
AGENT_REFLOG_MARK = "anima-agent"

#: The agents' own git sees the real objects as well (the Acceptor reviews what is merged),
#: and marks the ref moves it makes.
AGENT_GIT_ENV = {"GIT_NO_REPLACE_OBJECTS": "1", "GIT_REFLOG_ACTION": AGENT_REFLOG_MARK}

#: Settings the reviewer's git takes from its environment (`GIT_CONFIG_PARAMETERS`, which
#: outranks a repository's own config and which git hands on to the git it runs in a
#: submodule): its plain `git status` looks into each repository the Developer nests in the
#: tree it reviews, whose own `core.fsmonitor` command would run there.
REVIEWER_GIT_CONFIG = ("core.fsmonitor=false",)
_PARAMETERS = "GIT_CONFIG_PARAMETERS"


def reviewer_git_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`REVIEWER_GIT_CONFIG` after the settings `environ` passes to git already (the human's
    `git -c`, when Anima runs under git): later ones win."""
    ours = " ".join(f"'{setting}'" for setting in REVIEWER_GIT_CONFIG)
    inherited = environ.get(_PARAMETERS, "").strip()
    return {_PARAMETERS: f"{inherited} {ours}" if inherited else ours}

#: Settings of the global and system config that shape what git reads as the tree or may
#: touch, carried over to Anima's git as plain values (none names a program). Without the
#: human's `core.excludesFile`, a globally ignored `.idea/` would be "uncommitted changes".
_CARRIED = frozenset({
    "core.excludesfile", "core.attributesfile", "core.autocrlf", "core.eol", "core.safecrlf",
    "core.checkroundtripencoding", "core.ignorecase", "core.precomposeunicode",
    "core.protecthfs", "core.protectntfs",
})
#: Every value counts (a list), and only where git honours it: the system and global config.
_SAFE_DIRECTORY = "safe.directory"
_IDENTITY = ("user.name", "user.email", "author.name", "author.email", "committer.name",
             "committer.email")
_PROTECTED_SCOPES = ("system", "global")
_FILTER_KEYS = ("clean", "smudge", "process")
# Environment that decides which config files git reads (a change re-reads them).
_CONFIG_ENV = ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM",
               "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_PARAMETERS", "GIT_CONFIG_COUNT", "GIT_DIR",
               "GIT_COMMON_DIR")
# A file changed this close to the read may have changed again after it, unseen, within the
# same tick of its file time: file systems that keep sub-second times tick in jiffies (a few
# ms), the others in seconds (two for FAT).
_RACY_NS = 2_000_000_000
_RACY_FINE_NS = 50_000_000


def git_environment() -> dict[str, str]:
    """The whole environment for a `subprocess` running Anima's git."""
    return {**os.environ, **ANIMA_GIT_ENV}


@dataclass(frozen=True)
class HumanConfig:
    """What Anima's git takes from the config the human's git reads in one repository."""

    #: Options to pass after `NO_AGENT_CODE`: the repository's drivers switched off, the
    #: human's global settings carried over.
    overrides: tuple[str, ...]
    #: (key, value) of the identity settings the human's git would use (any scope).
    identity: tuple[tuple[str, str], ...]
    #: (key, url) of every `remote.<name>.url` / `.pushurl`, in the order git reads them
    remotes: tuple[tuple[str, str], ...] = ()


def _neutralised(key: str) -> list[tuple[str, str]]:
    """(key, variable) overrides that switch off the driver `key` belongs to, if any."""
    section, _, rest = key.partition(".")
    sub, dot, name = rest.rpartition(".")
    if section == "diff" and rest == "external":
        return [(key, _NOTHING)]
    if not dot:
        return []
    if section == "filter":
        return [*((f"filter.{sub}.{k}", _NOTHING) for k in _FILTER_KEYS),
                (f"filter.{sub}.required", _FALSE)]
    if section == "diff" and name in ("textconv", "command"):
        return [(key, _NOTHING)]  # only what is set: a textconv makes the files binary
    if section == "merge" and name == "driver":
        return [(key, _CONFLICT)]
    return []


def _include_target(value: str, origin: Path | None) -> Path | None:
    path = Path(os.path.expanduser(value))
    if path.is_absolute():
        return path
    return origin.parent / path if origin is not None else None


def parse_config_listing(listing: bytes, cwd: Path) -> tuple[HumanConfig, list[Path], bool]:
    """Read `git config --list --show-scope --show-origin -z`: the overrides and identity,
    the files the config came from (included ones too, even if absent now), and whether an
    include depends on the checked-out branch."""
    fields = [os.fsdecode(f) for f in listing.split(b"\0")]
    neutral: dict[str, str] = {}
    carried: dict[str, tuple[str, str | None]] = {}
    safe_dirs: list[str] = []
    identity: dict[str, str] = {}
    remotes: list[tuple[str, str]] = []
    files: list[Path] = []
    on_branch = False
    for scope, origin, entry in zip(fields[0::3], fields[1::3], fields[2::3], strict=False):
        key, newline, raw = entry.partition("\n")
        value = raw if newline else None
        source = cwd / origin[len("file:"):] if origin.startswith("file:") else None
        if source is not None and source not in files:
            files.append(source)
        if scope not in _PROTECTED_SCOPES:  # not read by Anima's git: nothing to switch off
            neutral.update(_neutralised(key))
        if key in _CARRIED:
            carried[key] = (scope, value)
        elif key == _SAFE_DIRECTORY and scope in _PROTECTED_SCOPES:
            safe_dirs.append(value or "")
        elif key in _IDENTITY and value is not None:
            identity[key] = value
        elif key.startswith("remote.") and key.endswith((".url", ".pushurl")) and value:
            remotes.append((key, value))
        elif value and (key == "include.path"
                        or (key.startswith("includeif.") and key.endswith(".path"))):
            on_branch |= key.startswith("includeif.onbranch:")
            if (target := _include_target(value, source)) is not None:
                files.append(target)
    overrides = [f"--config-env={key}={variable}" for key, variable in neutral.items()]
    for key, (scope, value) in carried.items():
        if scope in _PROTECTED_SCOPES:
            overrides += ["-c", key if value is None else f"{key}={value}"]
    for directory in safe_dirs:
        overrides += ["-c", f"{_SAFE_DIRECTORY}={directory}"]
    return HumanConfig(tuple(overrides), tuple(identity.items()), tuple(remotes)), files, \
        on_branch


def _default_config_files() -> list[Path]:
    """Where git looks for the global and system config, whether or not they exist yet."""
    env = os.environ
    home = Path(env.get("HOME") or os.path.expanduser("~"))
    xdg = Path(env.get("XDG_CONFIG_HOME") or home / ".config")
    files = [Path(env["GIT_CONFIG_GLOBAL"])] if env.get("GIT_CONFIG_GLOBAL") else [
        home / ".gitconfig", xdg / "git" / "config"]
    if not env.get("GIT_CONFIG_NOSYSTEM"):
        files.append(Path(env.get("GIT_CONFIG_SYSTEM") or "/etc/gitconfig"))
    return files


def _stamps(files: Iterable[Path]) -> tuple[tuple[int, int, int, int] | None, ...]:
    """What tells a file changed: its times, size and inode (None: absent)."""
    stamps: list[tuple[int, int, int, int] | None] = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append(None)
        else:
            stamps.append((st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino))
    return tuple(stamps)


def _settled(stamp: tuple[int, int, int, int] | None, read_at: int) -> bool:
    """Whether a file last changed far enough before `read_at` that a later change shows in
    its stamp (a fresh repository's config is cached after 50 ms, not two seconds)."""
    if stamp is None:
        return True
    changed = max(stamp[0], stamp[1])
    return changed < read_at - (_RACY_FINE_NS if changed % 1_000_000_000 else _RACY_NS)


@dataclass(frozen=True)
class _Cached:
    env: tuple[str | None, ...]
    files: tuple[Path, ...]
    stamps: tuple[tuple[int, int, int, int] | None, ...]
    config: HumanConfig


_CACHE: dict[Path, _Cached] = {}


def human_config(cwd: Path, git_dir: Path | None = None,
                 common_dir: Path | None = None) -> HumanConfig:
    """The overrides and identity for Anima's git in the repository at `cwd`.

    Read with one `git config --list` (the human's view: global and system config included)
    the first time, then again only when a config file it came from (or includes, or git
    would read) changes: each call costs a few `stat`s. `git_dir` is the repository read (not
    the one a worktree's `.git` file names); with `common_dir`, it adds the repository's own
    config files even before they exist (`config.worktree`) and, for an
    `includeIf "onbranch:…"`, HEAD. Raises GitError when git cannot read the config.
    """
    env = tuple(os.environ.get(name) for name in _CONFIG_ENV)
    cached = _CACHE.get(cwd)
    if cached is not None and cached.env == env and _stamps(cached.files) == cached.stamps:
        return cached.config
    started = time.time_ns()
    try:
        # `safe.directory=*` for this read only: a config that git would not honour still
        # names the drivers to switch off (the commands themselves get the human's values).
        named = [f"--git-dir={git_dir}"] if git_dir is not None else []
        done = subprocess.run(["git", *NO_AGENT_CODE, *named, "-c", f"{_SAFE_DIRECTORY}=*",
                               "config", "--list", "--show-scope", "--show-origin", "-z"],
                              cwd=cwd, capture_output=True, stdin=subprocess.DEVNULL,
                              timeout=60, check=False, start_new_session=True)
    except FileNotFoundError as exc:
        raise GitError(f"git is not installed or not on PATH: {exc}") from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GitError(f"Cannot read the git configuration in {cwd}: {exc}") from None
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise GitError(f"Cannot read the git configuration in {cwd}: {detail}")
    config, files, on_branch = parse_config_listing(done.stdout, cwd)
    files += _default_config_files()
    if common_dir is not None:
        files.append(common_dir / "config")
    if git_dir is not None:
        files.append(git_dir / "config.worktree")
        if on_branch:
            files.append(git_dir / "HEAD")
    watched = tuple(dict.fromkeys(files))
    stamps = _stamps(watched)
    if all(_settled(stamp, started) for stamp in stamps):
        _CACHE[cwd] = _Cached(env, watched, stamps, config)
    else:  # changed while (or just before) it was read: read it again next time
        _CACHE.pop(cwd, None)
    return config
