"""`.worktreeinclude`: which ignored files a new worktree gets (real repos, real `git worktree
add`, no mocks)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from anima.errors import GitError
from anima.git.worktree_include import _copy_one, _Folders, copy_included, included_paths
from tests.conftest import init_repo, run_git

pytestmark = pytest.mark.timeout(30)  # a FIFO read by mistake would hang, not fail


def make_repo(tmp_path: Path, gitignore: str, include: str | None,
              tracked: dict[str, str] | None = None) -> Path:
    files = {".gitignore": gitignore, "README.md": "# project\n", **(tracked or {})}
    if include is not None:
        files[".worktreeinclude"] = include
    return init_repo(tmp_path / "repo", files)


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if mode is not None:
        path.chmod(mode)
    return path


def worktree(repo: Path, where: Path, branch: str = "m1") -> Path:
    run_git(repo, "worktree", "add", "-q", "-b", branch, str(where))
    return where


def copy(repo: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    wt = worktree(repo, tmp_path / "wt")
    return wt, copy_included(repo, wt, included_paths(repo))


def tree(root: Path) -> set[str]:
    """Every entry below `root` (outside `.git`), relative, `/`-separated."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in dirnames + filenames:
            if name != ".git":
                found.add(Path(dirpath, name).relative_to(root).as_posix())
    return found


# --- what is copied ---------------------------------------------------------------------------


def test_ignored_and_listed_files_are_copied_with_their_mode(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".env\n*.local.sh\nsecrets/\n",
                     ".env\n*.local.sh\nsecrets/\n")
    write(repo / ".env", "TOKEN=s3cret\n", 0o640)
    write(repo / "tools/run.local.sh", "#!/bin/sh\n", 0o750)
    write(repo / "secrets/deep/key.pem", "KEY\n", 0o600)
    (repo / "secrets").chmod(0o700)

    wt, copied = copy(repo, tmp_path)

    assert copied == [".env", "secrets/deep/key.pem", "tools/run.local.sh"]
    for rel in copied:
        assert (wt / rel).read_bytes() == (repo / rel).read_bytes()
        assert stat.S_IMODE((wt / rel).stat().st_mode) == stat.S_IMODE((repo / rel).stat().st_mode)
        assert (wt / rel).stat().st_mtime_ns == (repo / rel).stat().st_mtime_ns
    assert stat.S_IMODE((wt / "secrets").stat().st_mode) == 0o700  # a private folder stays so


def test_a_tracked_file_is_never_copied_even_when_listed_and_matching_gitignore(
        tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "settings.json\n", "settings.json\n",
                     tracked={"settings.json": '{"committed": true}\n'})
    run_git(repo, "add", "-f", "settings.json")  # tracked although .gitignore names it
    run_git(repo, "commit", "-q", "-m", "track settings")
    (repo / "settings.json").write_text('{"edited": true}\n', encoding="utf-8")

    wt, copied = copy(repo, tmp_path)

    assert copied == []
    assert (wt / "settings.json").read_text(encoding="utf-8") == '{"committed": true}\n'


def test_an_untracked_file_git_does_not_ignore_is_not_copied(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "*.log\n", "notes.txt\n*.log\n")
    write(repo / "notes.txt", "draft\n")
    write(repo / "run.log", "log\n")

    wt, copied = copy(repo, tmp_path)

    assert copied == ["run.log"]
    assert not (wt / "notes.txt").exists()


def test_an_ignored_file_not_listed_is_not_copied(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".env\nbuild/\n", ".env\n")
    write(repo / ".env", "A=1\n")
    write(repo / "build/out.bin", "bin\n")

    wt, copied = copy(repo, tmp_path)

    assert copied == [".env"]
    assert not (wt / "build").exists()


# --- the patterns -----------------------------------------------------------------------------


def test_negation_excludes_a_file_an_earlier_pattern_lists(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "config/*.local\n",
                     "config/*.local\n!config/secret.local\n")
    for name in ("a.local", "b.local", "secret.local"):
        write(repo / "config" / name, name)

    wt, copied = copy(repo, tmp_path)

    assert copied == ["config/a.local", "config/b.local"]
    assert not (wt / "config/secret.local").exists()


def test_anchored_and_unanchored_patterns(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "x\ny\n", "/x\ny\n")
    for rel in ("x", "sub/x", "y", "sub/deeper/y"):
        write(repo / rel, rel)

    _, copied = copy(repo, tmp_path)

    assert copied == ["sub/deeper/y", "x", "y"]  # `/x` is the root's x only


def test_double_star_patterns(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "*.json\n*.key\n", "**/secrets.json\ndocs/**/*.key\n")
    for rel in ("secrets.json", "a/b/secrets.json", "a/other.json", "docs/d.key",
                "docs/a/b/c.key", "elsewhere/e.key"):
        write(repo / rel, rel)

    _, copied = copy(repo, tmp_path)

    assert copied == ["a/b/secrets.json", "docs/a/b/c.key", "docs/d.key", "secrets.json"]


def test_a_folder_pattern_covers_every_file_below_it(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "local/\nnotlocal/\n", "local/\n")
    for rel in ("local/a.txt", "local/deep/er/b.txt", "pkg/local/c.txt", "notlocal/d.txt"):
        write(repo / rel, rel)

    _, copied = copy(repo, tmp_path)

    assert copied == ["local/a.txt", "local/deep/er/b.txt", "pkg/local/c.txt"]


def test_files_of_an_ignored_folder_are_matched_one_by_one(tmp_path: Path) -> None:
    """git ignores `config/local/` as a whole; the list picks files inside it."""
    repo = make_repo(tmp_path, "config/local/\n", "config/local/*.env\n")
    for rel in ("config/local/dev.env", "config/local/test.env", "config/local/cache.db",
                "config/local/sub/x.env"):
        write(repo / rel, rel)

    _, copied = copy(repo, tmp_path)

    assert copied == ["config/local/dev.env", "config/local/test.env"]


def test_comments_blank_lines_and_escapes(tmp_path: Path) -> None:
    include = "# .env is commented out\n\n   \n.secret\r\n\\#hash\n!\n\\\n"  # the last two: invalid
    repo = make_repo(tmp_path, ".env\n.secret\n\\#hash\n", include)
    write(repo / ".env", "A=1\n")
    write(repo / ".secret", "B=2\n")
    write(repo / "#hash", "C=3\n")

    _, copied = copy(repo, tmp_path)

    assert copied == ["#hash", ".secret"]


# --- what is never copied ---------------------------------------------------------------------


def test_a_listed_symlink_is_not_copied(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "passwords", "hunter2\n")
    repo = make_repo(tmp_path, ".env\n", ".env\n")
    (repo / ".env").symlink_to(outside)

    wt, copied = copy(repo, tmp_path)

    assert copied == []
    assert not os.path.lexists(wt / ".env")


def test_nothing_is_copied_through_a_symlinked_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside / ".env", "A=1\n")
    write(outside / "conf/key", "K\n")
    repo = make_repo(tmp_path, "ext\nlinked\n", "ext/\nlinked/\n.env\nkey\n")
    (repo / "ext").symlink_to(outside, target_is_directory=True)
    (repo / "inner").mkdir()
    write(repo / "inner/key", "in the checkout, but not ignored\n")
    (repo / "linked").symlink_to(repo / "inner", target_is_directory=True)

    wt, copied = copy(repo, tmp_path)

    assert copied == []
    assert not os.path.lexists(wt / "ext") and not os.path.lexists(wt / "linked")


def test_a_fifo_is_not_copied_and_does_not_hang(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".env\npipe\n", ".env\npipe\n")
    os.mkfifo(repo / "pipe")
    write(repo / ".env", "A=1\n")

    wt, copied = copy(repo, tmp_path)

    assert copied == [".env"]
    assert not os.path.lexists(wt / "pipe")


def test_the_copy_refuses_what_is_swapped_in_after_git_listed_it(tmp_path: Path) -> None:
    """git lists no FIFO and nothing below a symlink; a path it listed as a regular file may
    still be one of them (or gone) by the time it is copied."""
    outside = write(tmp_path / "outside" / ".env", "A=1\n")
    source, target = tmp_path / "source", tmp_path / "target"
    source.mkdir()
    target.mkdir()
    os.mkfifo(source / "pipe")
    (source / "link").symlink_to(outside)
    (source / "ext").symlink_to(outside.parent, target_is_directory=True)
    (source / "folder").mkdir()
    src, dst = _Folders(source), _Folders(target)
    try:
        for rel in ("pipe", "link", "ext/.env", "folder", "missing", "missing/x"):
            assert not _copy_one(src, dst, rel), rel
    finally:
        src.close()
        dst.close()
    assert list(target.iterdir()) == []


def test_an_existing_target_file_is_not_overwritten(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "victim", "untouched\n")
    repo = make_repo(tmp_path, ".env\n.env.test\nsecrets/\n", ".env\n.env.test\nsecrets/\n")
    write(repo / ".env", "SOURCE=1\n")
    write(repo / ".env.test", "SOURCE=2\n")
    write(repo / "secrets/key", "SOURCE=3\n")
    wt = worktree(repo, tmp_path / "wt")
    write(wt / ".env", "MINE=1\n")
    (wt / ".env.test").symlink_to(outside)  # a link in the way is not written through
    (wt / "secrets").symlink_to(outside.parent, target_is_directory=True)

    copied = copy_included(repo, wt, included_paths(repo))

    assert copied == []
    assert (wt / ".env").read_text(encoding="utf-8") == "MINE=1\n"
    assert outside.read_text(encoding="utf-8") == "untouched\n"
    assert sorted(p.name for p in outside.parent.iterdir()) == ["victim"]


def test_a_copy_killed_halfway_leaves_no_short_file_and_the_next_copy_is_whole(
        tmp_path: Path) -> None:
    """A kill while a large file is copied (here SIGXFSZ, at the file size limit: a kill at
    a known byte) leaves nothing at its path, so the copy at the next start is whole; a
    short `data.db` would be kept there for good (an existing file is never overwritten)."""
    repo = make_repo(tmp_path, "data.db\n", "data.db\n")
    (repo / "data.db").write_bytes(os.urandom(4 << 20))
    wt = worktree(repo, tmp_path / "wt")
    script = ("import resource, signal, sys\nfrom pathlib import Path\n"
              "from anima.git.worktree_include import copy_included, included_paths\n"
              "signal.signal(signal.SIGXFSZ, signal.SIG_DFL)\n"  # Python ignores it
              "resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))\n"
              "source = Path(sys.argv[1])\n"
              "copy_included(source, Path(sys.argv[2]), included_paths(source))\n")
    done = subprocess.run([sys.executable, "-c", script, str(repo), str(wt)], check=False,
                          capture_output=True)
    assert done.returncode == -signal.SIGXFSZ

    assert not os.path.lexists(wt / "data.db")
    assert tree(wt) == tree(repo) - {"data.db"}  # and no partial file under another name

    assert copy_included(repo, wt, included_paths(repo)) == ["data.db"]
    assert (wt / "data.db").read_bytes() == (repo / "data.db").read_bytes()


def test_a_nested_repository_is_not_entered(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, "vendor/\n", "vendor/\n.env\n")
    init_repo(repo / "vendor/lib", {"code.py": "x = 1\n"})
    write(repo / "vendor/lib/.env", "NESTED=1\n")
    write(repo / "vendor/own.cfg", "cfg\n")

    _, copied = copy(repo, tmp_path)

    assert copied == ["vendor/own.cfg"]


def test_nothing_under_anima_is_copied(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".anima/\n*.log\n", ".anima/\n*.log\n*.json\n**\n")
    write(repo / ".anima/state.json", "{}\n")
    write(repo / ".anima/logs/m1.log", "log\n")
    write(repo / "debug.log", "debug\n")
    wt = worktree(repo, repo / ".anima/worktrees/m1")  # where Anima keeps them
    write(wt / "made.log", "the worktree's own\n")

    copied = copy_included(repo, wt, included_paths(repo))

    assert copied == ["debug.log"]
    assert tree(wt) == {".gitignore", ".worktreeinclude", "README.md", "debug.log", "made.log"}


# --- no list ----------------------------------------------------------------------------------


def test_no_worktreeinclude_copies_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".env\n", None)
    write(repo / ".env", "A=1\n")

    wt, copied = copy(repo, tmp_path)

    assert copied == []
    assert not (wt / ".env").exists()


def test_a_list_of_comments_or_negations_only_copies_nothing(tmp_path: Path) -> None:
    repo = make_repo(tmp_path, ".env\n", "# .env\n\n!.env\n")
    write(repo / ".env", "A=1\n")

    _, copied = copy(repo, tmp_path)

    assert copied == []


@pytest.mark.parametrize("kind", ["symlink", "fifo", "folder"])
def test_a_worktreeinclude_that_is_not_a_regular_file_is_ignored(tmp_path: Path,
                                                                  kind: str) -> None:
    repo = make_repo(tmp_path, ".env\n", None)
    write(repo / ".env", "A=1\n")
    wt = worktree(repo, tmp_path / "wt")
    if kind == "symlink":
        (repo / ".worktreeinclude").symlink_to(write(tmp_path / "list", ".env\n"))
    elif kind == "fifo":
        os.mkfifo(repo / ".worktreeinclude")
    else:
        (repo / ".worktreeinclude").mkdir()

    assert copy_included(repo, wt, included_paths(repo)) == []
    assert not (wt / ".env").exists()


def test_a_source_that_is_not_a_repository_is_an_error(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    plain = tmp_path / "plain"
    write(plain / ".worktreeinclude", ".env\n")
    (tmp_path / "target").mkdir()

    with pytest.raises(GitError, match="Cannot list the files git ignores"):
        copy_included(plain, tmp_path / "target", included_paths(plain))
    with pytest.raises(GitError, match="not a folder"):
        copy_included(plain, tmp_path / "missing", [".env"])


def test_a_large_ignored_tree_is_matched_file_by_file(tmp_path: Path) -> None:
    """git lists every file of an ignored node_modules/; each is matched on its own."""
    repo = make_repo(tmp_path, "node_modules/\n.env\n", ".env\n")
    for i in range(2000):
        write(repo / f"node_modules/pkg{i % 50}/file{i}.js", "x")
    write(repo / "node_modules/pkg7/.env", "DEEP=1\n")
    write(repo / ".env", "A=1\n")

    _, copied = copy(repo, tmp_path)

    assert copied == [".env", "node_modules/pkg7/.env"]
