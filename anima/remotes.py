"""Did an agent push? A cheap look, before and after each turn, at the refs a push moves.

Each backend denies `git push` itself (claude's tool rules, git's own refusal under codex: see
the README's agent section); this is the second line, for a push that got past it
(`sh -c 'git push'` under claude's rules, a script, `git -C . push`).
`git ls-remote` would ask every remote over the network — slow, offline it fails, and it may
prompt for credentials — so Anima looks at what a push leaves behind on this machine:

- for remotes whose URL is a local path (`/srv/app.git`, `file://…`, a sibling repository),
  the remote repository's own branches and tags: exact, whatever refspec or URL was used;
- `refs/remotes/*` of the project: a `git push <remote>` moves the matching remote-tracking
  ref. A fetch moves them too, so a moved tracking ref counts as a push only when it now
  points at a commit one of the project's own branches contains (fetched work is not ours).

A push by bare URL to a network remote leaves no trace here and goes unseen.
Each snapshot costs one `git for-each-ref` per local remote plus one in the project, none
when the project has no remote at all (a push to a URL moves no tracking ref); the loop takes
the snapshot after one turn as the one before the next.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from urllib.parse import unquote, urlparse

from anima.errors import GitError
from anima.git_options import NO_AGENT_CODE, git_environment, human_config

RefMap = dict[str, str]  # "<remote>:<ref>" or "<tracking ref>" -> object id


def _git(cwd: Path, *args: str) -> str:
    try:
        overrides = human_config(cwd).overrides
        out = subprocess.run(["git", *NO_AGENT_CODE, *overrides, *args], cwd=cwd,
                             capture_output=True, text=True, timeout=30,
                             stdin=subprocess.DEVNULL, env=git_environment(),
                             start_new_session=True)
    except (OSError, subprocess.TimeoutExpired, GitError):
        return ""
    return out.stdout if out.returncode == 0 else ""


def _refs(cwd: Path, *patterns: str) -> RefMap:
    lines = _git(cwd, "for-each-ref", "--format=%(refname) %(objectname)", *patterns)
    return dict(line.split(" ", 1) for line in lines.splitlines() if " " in line)


def _local_path(url: str, root: Path) -> Path | None:
    """The folder of a remote URL that is a path on this machine, else None."""
    if url.startswith("file://"):
        path = Path(unquote(urlparse(url).path))
    elif "://" in url or (":" in url.split("/", 1)[0] and not url.startswith("/")):
        return None  # https://, ssh://, or scp-like host:path
    else:
        path = (root / url).resolve()
    return path if path.is_dir() else None


def _local_remotes(root: Path) -> dict[str, Path]:
    """The remotes that are folders on this machine (from the cached read of the config:
    the push guard asks before and after every turn)."""
    found: dict[str, Path] = {}
    try:
        remotes = human_config(root).remotes
    except GitError:
        return found
    for key, url in remotes:
        name = key[len("remote."):key.rfind(".")]
        if (path := _local_path(url.strip(), root)) is not None:
            found[name] = path  # a pushurl comes after the url: it wins
    return found


def remote_refs(root: Path) -> RefMap:
    """Every ref a push could move, as seen now."""
    try:
        if not human_config(root).remotes:
            return {}
    except GitError:
        pass
    refs = _refs(root, "refs/remotes")
    for label, path in _local_remotes(root).items():
        refs.update({f"{label}:{ref}": sha
                     for ref, sha in _refs(path, "refs/heads", "refs/tags").items()})
    return refs


def pushed(root: Path, before: RefMap) -> tuple[list[str], RefMap]:
    """What moved since `before` in a way only a push explains (one line per ref), and the
    refs as they are now."""
    after = remote_refs(root)
    lines = []
    for ref in sorted(before.keys() | after.keys()):
        old, new = before.get(ref), after.get(ref)
        if old == new:
            continue
        if ref.startswith("refs/remotes/") and (
                new is None or not _git(root, "for-each-ref", "--contains", new,
                                        "--count=1", "refs/heads")):
            continue  # a fetch or a prune, not a push
        lines.append(f"{ref}: {(old or 'none')[:7]} → {(new or 'deleted')[:7]}")
    return lines, after
