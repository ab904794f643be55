"""The validated JSON behind `anima status --json`, kept between runs.

Scripts poll `anima status --json`, and between two polls most records have not changed; yet
each poll would load pydantic, validate every record and serialise it again (three quarters of
the command's time with a hundred long records). An entry here holds one record's (or the
state's) validated JSON under a digest of exactly the bytes it was validated from, the file's
name and the code that validated it, so it can only ever stand for those bytes: an edited or
broken record, a new Anima or a new pydantic simply misses and takes the full path. A pending
milestone whose `.md` or config changed after its record was written is listed as they read
now (the full scan's `Store._as_defined_now`): its entry is keyed by those files' bytes too;
so is what an ended one's `.md` changed since says (`Store.not_run_again`).

Kept in the user's cache folder ($XDG_CACHE_HOME/anima, else ~/.cache/anima), one folder per
project and never inside the project (a command that only reads must not change its tree).
Nothing here imports pydantic: a poll that finds every entry never loads it. A folder that
cannot be written only makes the command slower.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from anima.atomic import read_regular
from anima.paths import ProjectPaths
from anima.store.names import MILESTONE_ID_RE, is_milestone_name

#: The code whose output an entry holds: a change to any of these files is a new cache.
_CODE = ("store/models.py", "store/migrations.py", "store/store.py", "store/status_cache.py",
         "store/freshness.py", "store/milestone_md.py", "store/definitions.py", "config.py",
         "cli/status.py")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Snapshot:
    """state.json and the records, each read once (None: there is no state.json yet), and
    the records whose `.md` is gone."""

    state: bytes | None
    records: dict[str, bytes]
    undefined: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Entry:
    """What a report needs of one validated file: where it sorts, its JSON, whether it is
    a pending milestone's (which is listed as its `.md` and the config read now), what
    of it `depends_on` reads (what the report's dependencies are keyed by: a record changes
    at every turn, its status and merge seldom), and when it ended (microseconds; 0: it is
    not completed nor cancelled), after which its `.md` changing is a problem."""

    order: int
    json: bytes
    pending: bool = False
    facts: bytes = b""
    ended: int = 0


def read_snapshot(paths: ProjectPaths) -> Snapshot | None:
    """The files a report is made of, if the records say everything: None when a definition
    still waits for its record or has a bad name (the full scan words that) or a file cannot
    be read (the full path reports why)."""
    try:
        names = sorted(os.listdir(paths.milestones)) if paths.milestones.is_dir() else []
        ids = [n[:-5] for n in names if n.endswith(".json") and MILESTONE_ID_RE.fullmatch(n[:-5])]
        known = set(ids)
        defined = {n[:-3] for n in names if is_milestone_name(n)}
        if defined - known:
            return None
        try:
            state: bytes | None = read_regular(paths.state)
        except FileNotFoundError:
            state = None
        return Snapshot(state, {i: read_regular(paths.milestone_record(i)) for i in ids},
                        frozenset(known - defined))
    except OSError:
        return None


def read_if_any(path: Path) -> bytes | None:
    """A file's bytes for a key; None when it cannot be read (validating it says why)."""
    try:
        return read_regular(path)
    except OSError:
        return None


def microseconds(created_at: datetime) -> int:
    """A record's place in the report, exactly as its `created_at` sorts (Anima writes them
    in UTC; a time without a zone is read as UTC, as its neighbours are)."""
    if created_at.tzinfo is None:
        created_at = created_at.replace(tzinfo=UTC)
    return (created_at - _EPOCH) // timedelta(microseconds=1)


class StatusCache:
    """The entries of one project; `get` and `put` by file name and bytes."""

    def __init__(self, project: Path, base: Path | None = None) -> None:
        base = base or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "anima"
        digest = hashlib.blake2b(str(project).encode(), digest_size=8).hexdigest()
        self.folder = base / "status" / f"{project.name[:40]}-{digest}"
        self._code = _code_fingerprint()
        self._used: set[str] = set()

    def key(self, name: str, *files: bytes | None) -> str:
        """The key of what was validated from `files`, the bytes of each (None: absent)."""
        h = hashlib.blake2b(self._code, digest_size=20)
        h.update(name.encode() + b"\0")
        for data in files:
            h.update(b"-" if data is None else b"+%d\0" % len(data) + data)
        return h.hexdigest()

    def get(self, key: str) -> Entry | None:
        self._used.add(key)
        try:
            raw = (self.folder / key).read_bytes()
            header, payload = raw.split(b"\n", 1)
            order, length, pending, facts, ended = (int(x) for x in header.split())
        except (OSError, ValueError):
            return None
        # Written without fsync (it is a cache): a file a crash left short is a miss.
        if len(payload) != length + facts:
            return None
        return Entry(order, payload[:length], bool(pending), payload[length:], ended)

    def put(self, key: str, entry: Entry) -> None:
        self._used.add(key)
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".", suffix=".tmp", dir=self.folder)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(b"%d %d %d %d %d\n" % (entry.order, len(entry.json), entry.pending,
                                                    len(entry.facts), entry.ended)
                            + entry.json + entry.facts)
                os.replace(tmp, self.folder / key)
            except OSError:
                os.unlink(tmp)
                raise

    def prune(self) -> None:
        """Drop the entries this report did not use: one per milestone stays."""
        with contextlib.suppress(OSError):
            for name in os.listdir(self.folder):
                if name not in self._used and not name.startswith("."):
                    with contextlib.suppress(OSError):
                        (self.folder / name).unlink()


def _code_fingerprint() -> bytes:
    """The bytes of the code that validates and serialises, and pydantic's version file
    (which pins pydantic-core): found, not imported."""
    here = Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=20)
    files = [here / name for name in _CODE]
    spec = importlib.util.find_spec("pydantic")
    if spec is not None and spec.submodule_search_locations:
        files.append(Path(next(iter(spec.submodule_search_locations))) / "version.py")
    for path in files:
        with contextlib.suppress(OSError):
            h.update(path.read_bytes())
    return h.digest()
