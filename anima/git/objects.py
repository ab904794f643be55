"""The confined Developer's new git objects, taken into the repository once checked.

Its git writes them to a store of its own (`anima.sandbox.git_writable`): the repository's
`objects/` holds main's whole history, and git trusts an object's file to hold what its name
says. Before Anima reads what a Developer turn committed, every loose object in that store
whose content hashes to its name is copied in (an existing object is never replaced), and
every pack goes through `git unpack-objects`, which names each object by its content. An
object that fails is dropped: what refers to it reads as missing, as if it had never been
written. The store is emptied of what was taken, so each turn's are read once.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import threading
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from anima.atomic import open_regular
from anima.git_options import NO_AGENT_CODE, git_environment

log = logging.getLogger(__name__)

_TYPES = (b"blob", b"tree", b"commit", b"tag")
_CHUNK = 1 << 20
#: zlib's best ratio is about 1032:1: a larger declared size is a lie.
_MAX_RATIO = 1032
_TAKING = threading.Lock()
_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: What a take that did not report refused, per store, for the next one that does.
_PENDING: dict[Path, list[str]] = {}


def take_objects(store: Path, common_dir: Path, *, report: bool = True) -> list[str]:
    """Take the objects in `store` into the repository whose git dir is `common_dir`.
    Returns what was refused since the last report, for the round's notes; `report=False`
    keeps it for the next one (a take during the turn, or for the Changes view). Thread-safe:
    the loop takes them during and after a turn, the Changes view before it shows the
    branch."""
    with _TAKING:
        problems = _PENDING.pop(store, []) + _take(store, common_dir)
        if not report:
            if problems:
                _PENDING[store] = problems
            return []
        return problems


@contextlib.contextmanager
def taking_objects(store: Path, common_dir: Path, every: float = 2.0) -> Iterator[None]:
    """Take the store's objects in every `every` seconds while the block runs (a Developer
    turn): the branch ref the agent moves is shared, and your own `git log --all` would
    otherwise fail on its newest commit ("bad object") until the turn ends."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(every):
            try:
                take_objects(store, common_dir, report=False)
            except Exception:  # the turn's own take, at its end, says what went wrong
                log.debug("taking %s's objects in failed", store, exc_info=True)

    taker = threading.Thread(target=run, name="take-objects", daemon=True)
    taker.start()
    try:
        yield
    finally:
        done.set()
        taker.join()


def _take(store: Path, common_dir: Path) -> list[str]:
    # Its packs and loose-object folders; `info/` (its alternates) stays, links are skipped.
    # Each folder is opened once, without following a link, and read and emptied through
    # that descriptor: the agent writes the store while Anima takes from it, and a folder
    # swapped for a link to the repository's own after it was listed would have Anima
    # delete the repository's objects.
    folders = _open_folders(store)
    if not folders:
        return []
    try:
        return _take_folders(store, folders, common_dir)
    finally:
        for fd in folders.values():
            os.close(fd)


def _open_folders(store: Path) -> dict[str, int]:
    """The store's `pack/` and loose-object folders, each opened without following a link."""
    try:
        names = sorted(os.listdir(store))
    except OSError:
        return {}
    folders = {}
    for name in names:
        if name == "pack" or (len(name) == 2 and _is_hex(name)):
            with contextlib.suppress(OSError):  # a link, a file, gone
                folders[name] = os.open(store / name, _FOLDER_FLAGS)
    return folders


def _take_folders(store: Path, folders: dict[str, int], common_dir: Path) -> list[str]:
    algorithm = _object_format(common_dir)
    id_length = hashlib.new(algorithm).digest_size * 2
    refused: list[str] = []
    problems: list[str] = []
    written: set[Path] = set()
    for folder, fd in folders.items():
        if folder == "pack":
            problems += _take_packs(fd, common_dir)
        else:
            for entry in sorted(os.listdir(fd)):
                name = folder + entry
                if len(name) != id_length or not _is_hex(name):
                    continue  # a temporary file of a git still running: the next turn's
                if not _take_loose(fd, entry, name, algorithm, common_dir / "objects", written):
                    refused.append(name)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry, dir_fd=fd)
        with contextlib.suppress(OSError):  # empty now, unless its git wrote more meanwhile
            os.rmdir(store / folder)
    for directory in {p.parent for p in written}:
        _fsync_dir(directory)
    if refused:
        problems.append(
            f"the Developer's git wrote {len(refused)} object(s) whose content is not what "
            f"their name says, or that git cannot read ({', '.join(n[:12] for n in refused[:5])}"
            "); not taken, so what refers to them is missing")
    return problems


@functools.cache
def _object_format(common_dir: Path) -> str:
    """The repository's hash function: "sha1", or "sha256" (named so by git and hashlib);
    fixed when the repository is made, so asked once (a take runs every few seconds)."""
    done = subprocess.run(["git", *NO_AGENT_CODE, f"--git-dir={common_dir}", "rev-parse",
                           "--show-object-format"], capture_output=True, text=True,
                          env=git_environment(), check=False, start_new_session=True)
    return "sha256" if done.stdout.strip() == "sha256" else "sha1"


def _is_hex(text: str) -> bool:
    return all(c in "0123456789abcdef" for c in text)


def _take_loose(folder: int, entry: str, name: str, algorithm: str, into: Path,
                written: set[Path]) -> bool:
    """Copy one loose object file (`entry` in the open `folder`) in, if it holds exactly the
    object `name`. False: refused (not one gone: the agent's git removed it since the folder
    was listed)."""
    try:
        source = open_regular(entry, folder, follow=False)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    with source:
        if not _holds(source, name, algorithm):
            return False
        target = into / name[:2] / name[2:]
        if target.exists():
            return True
        target.parent.mkdir(exist_ok=True)
        temporary = target.parent / f"tmp_obj_anima_{os.getpid()}_{name[2:]}"
        out = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444)
        try:
            with os.fdopen(out, "wb") as copy:
                source.seek(0)
                shutil.copyfileobj(source, copy, _CHUNK)
                copy.flush()
                os.fsync(copy.fileno())
            with contextlib.suppress(FileExistsError):  # git wrote the same object meanwhile
                os.link(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
    written.add(target)
    return True


def _holds(source: BinaryIO, name: str, algorithm: str) -> bool:
    """Whether the compressed stream holds a well-formed object whose id is `name`. Inflated
    a piece at a time: the agent wrote the file, and a few megabytes of zeros inflate to
    gigabytes (a size no stream of this length can hold is refused first)."""
    limit = os.fstat(source.fileno()).st_size * _MAX_RATIO + 64
    inflater, digest = zlib.decompressobj(), hashlib.new(algorithm)
    head, size, seen = b"", -1, 0
    try:
        for out in _inflated(source, inflater):
            digest.update(out)
            if size < 0:
                head += out
                if b"\0" not in head:
                    if len(head) > 64:
                        return False
                    continue
                header, _, out = head.partition(b"\0")
                kind, _, number = header.partition(b" ")
                if kind not in _TYPES or not number.isdigit() or int(number) > limit:
                    return False
                size = int(number)
            seen += len(out)
            if seen > size:
                return False
    except zlib.error:
        return False
    return inflater.eof and not inflater.unused_data and seen == size \
        and digest.hexdigest() == name


def _inflated(source: BinaryIO, inflater: zlib._Decompress) -> Iterator[bytes]:
    """The inflated stream, in pieces of at most `_CHUNK` bytes."""
    while piece := source.read(_CHUNK):
        while True:
            out = inflater.decompress(piece, _CHUNK)
            piece = inflater.unconsumed_tail
            if out:
                yield out
            elif not piece:
                break


def _take_packs(folder: int, common_dir: Path) -> list[str]:
    """Packs (the agent ran a `git gc` or `repack`) in the open `folder`: read through git,
    which checks them."""
    refused = []
    for name in sorted(n for n in os.listdir(folder) if n.endswith(".pack")):
        try:
            stream = open_regular(name, folder, follow=False)
        except OSError:  # gone, a link, a FIFO
            continue
        with stream:
            done = subprocess.run(
                ["git", *NO_AGENT_CODE, f"--git-dir={common_dir}", "unpack-objects", "-q"],
                stdin=stream, capture_output=True, env=git_environment(), check=False,
                start_new_session=True)
        if done.returncode != 0:
            detail = done.stderr.decode(errors="replace").strip().splitlines()
            refused.append(f"the pack {name} the Developer's git wrote could not be "
                           f"read ({detail[-1] if detail else done.returncode}); not taken")
    for leftover in os.listdir(folder):
        with contextlib.suppress(OSError):  # a folder, or gone
            if not stat.S_ISDIR(os.stat(leftover, dir_fd=folder, follow_symlinks=False).st_mode):
                os.unlink(leftover, dir_fd=folder)
    return refused


def _fsync_dir(directory: Path) -> None:
    """A power cut after the store was emptied must not lose what was taken."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
