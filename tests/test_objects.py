"""anima.git.objects: what the confined Developer's git wrote to its own object store comes
into the repository only as what it is. Real repositories; the store is filled by real git
(`GIT_OBJECT_DIRECTORY`, as the sandbox's mount makes it) or by hand, as a hostile agent
would."""

from __future__ import annotations

import hashlib
import os
import subprocess
import time
import tracemalloc
import zlib
from pathlib import Path

from anima.git.objects import take_objects, taking_objects
from tests.conftest import init_repo, run_git


def agent_git(repo: Path, store: Path, *args: str, stdin: bytes | None = None) -> str:
    """git as the Developer runs it in the sandbox: new objects to `store`, the
    repository's read as an alternate."""
    env = {**os.environ, "GIT_OBJECT_DIRECTORY": str(store),
           "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(repo / ".git" / "objects")}
    done = subprocess.run(["git", *args], cwd=repo, env=env, input=stdin, capture_output=True,
                          check=True)
    return done.stdout.decode().strip()


def committed_in_a_store(tmp_path: Path) -> tuple[Path, Path]:
    """A repository whose HEAD is a commit (of `b.txt`) the agent's git wrote to the store."""
    repo = init_repo(tmp_path / "repo", {"a.txt": "a\n"})
    store = tmp_path / "store"
    store.mkdir()
    (repo / "b.txt").write_text("b\n")
    agent_git(repo, store, "add", "b.txt")
    agent_git(repo, store, "commit", "-q", "-m", "feat: b")
    return repo, store


def loose(store: Path, name: str, compressed: bytes) -> Path:
    path = store / name[:2] / name[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(compressed)
    return path


def object_id(kind: str, body: bytes) -> str:
    return hashlib.sha1(f"{kind} {len(body)}\0".encode() + body).hexdigest()


def test_a_commit_made_in_the_store_reaches_the_repository(tmp_path: Path) -> None:
    repo, store = committed_in_a_store(tmp_path)
    head = run_git(repo, "rev-parse", "HEAD")
    assert subprocess.run(["git", "cat-file", "-e", head], cwd=repo).returncode != 0
    assert take_objects(store, repo / ".git") == []
    assert run_git(repo, "show", "HEAD:b.txt") == "b"
    assert run_git(repo, "fsck", "--strict", "--no-dangling") == ""
    assert not any(store.iterdir())  # taken once


def test_a_forged_object_stays_out_and_the_repositorys_own_stays(tmp_path: Path) -> None:
    repo = init_repo(tmp_path / "repo", {"a.txt": "a\n"})
    store = tmp_path / "store"
    real = run_git(repo, "rev-parse", "HEAD:a.txt")
    new = object_id("blob", b"forged\n")  # a new id, whose file holds other content
    loose(store, real, zlib.compress(b"blob 5\0evil\n"))
    loose(store, new, zlib.compress(b"blob 5\0evil\n"))
    loose(store, object_id("blob", b"x"), b"not zlib at all")
    notes = take_objects(store, repo / ".git")
    assert len(notes) == 1 and "3 object(s)" in notes[0] and real[:12] in notes[0]
    assert run_git(repo, "show", "HEAD:a.txt") == "a"
    assert subprocess.run(["git", "cat-file", "-e", new], cwd=repo).returncode != 0
    assert run_git(repo, "fsck", "--strict", "--no-dangling") == ""


def test_an_inflation_bomb_is_read_in_pieces(tmp_path: Path) -> None:
    """400 MB of zeros compress to 400 KB: inflated at once, an agent could take Anima's
    memory. One object declares its size honestly, one lies; a big honest one still comes in."""
    repo = init_repo(tmp_path / "repo", {"a.txt": "a\n"})
    store = tmp_path / "store"
    zeros = bytes(400 << 20)
    honest = zlib.compress(f"blob {len(zeros)}\0".encode() + zeros, 1)
    lying = zlib.compress(b"blob 5\0" + zeros, 1)
    big = b"abc" * (3 << 20)  # inflates to more than one piece from its last input bytes
    loose(store, "ab" + "0" * 38, honest)
    loose(store, "cd" + "0" * 38, lying)
    loose(store, object_id("blob", big), zlib.compress(f"blob {len(big)}\0".encode() + big))
    del zeros
    tracemalloc.start()
    try:
        notes = take_objects(store, repo / ".git")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak
    assert len(notes) == 1 and "2 object(s)" in notes[0]
    assert run_git(repo, "cat-file", "-s", object_id("blob", big)) == str(len(big))


def test_a_pack_the_agents_git_made_is_read_by_git(tmp_path: Path) -> None:
    repo, store = committed_in_a_store(tmp_path)
    agent_git(repo, store, "repack", "-q", "-d", "-l")
    assert list((store / "pack").glob("*.pack"))
    (store / "pack" / "junk.pack").write_bytes(b"PACK garbage")
    notes = take_objects(store, repo / ".git")
    assert len(notes) == 1 and "junk.pack" in notes[0]
    assert run_git(repo, "show", "HEAD:b.txt") == "b"
    assert not (store / "pack").exists()


def test_a_link_in_the_store_is_never_followed(tmp_path: Path) -> None:
    """A folder of the store linked to the repository's own: taking from it would delete
    the repository's objects."""
    repo = init_repo(tmp_path / "repo", {"a.txt": "a\n"})
    store = tmp_path / "store"
    store.mkdir()
    real = run_git(repo, "rev-parse", "HEAD:a.txt")
    (store / real[:2]).symlink_to(repo / ".git" / "objects" / real[:2])
    (store / "pack").symlink_to(repo / ".git" / "objects" / "pack")
    other = loose(store, "ef" + "1" * 38, b"")
    other.unlink()
    other.symlink_to(repo / ".git" / "objects" / real[:2] / real[2:])
    take_objects(store, repo / ".git")
    assert run_git(repo, "show", "HEAD:a.txt") == "a"
    assert (repo / ".git" / "objects" / real[:2] / real[2:]).is_file()


def test_what_a_take_during_the_turn_refused_is_reported_by_the_next(tmp_path: Path) -> None:
    """The take every two seconds of a turn, or the Changes view's, reports nothing: the
    round's own take at the end still names the forged object."""
    repo = init_repo(tmp_path / "repo", {"a.txt": "a\n"})
    store = tmp_path / "store"
    forged = object_id("blob", b"forged\n")
    loose(store, forged, zlib.compress(b"blob 5\0evil\n"))
    with taking_objects(store, repo / ".git", every=0.05):
        deadline = time.monotonic() + 10
        while any(store.glob("??/*")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert take_objects(store, repo / ".git", report=False) == []
    notes = take_objects(store, repo / ".git")
    assert len(notes) == 1 and forged[:12] in notes[0]
    assert take_objects(store, repo / ".git") == []
