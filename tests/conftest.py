"""Shared fixtures: the fake and the real `claude`, a Messages API stub, a temp git repo, and a
guard that fails any test leaving a child process behind."""

from __future__ import annotations

import atexit
import compileall
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Qt runs headless in the suite (CI has no display); set before any Qt import.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# `anima status` keeps a cache in the user's cache folder: the suite's, not the user's.
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="anima-tests-cache-")

from anima.agents.claude.discovery import find_claude
from anima.agents.dialect import AgentBinary
from tests.fakes.api_stub import ApiStub

atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

REPO_ROOT = Path(__file__).resolve().parent.parent
FAKE_CLAUDE = Path(__file__).resolve().parent / "fakes" / "fake_claude.py"
CLI_LINES_DIR = Path(__file__).resolve().parent / "fixtures" / "cli_lines"
#: Where the README's test command installs the real CLIs: the newest on npm (`@latest`, which
#: npm otherwise skips on Node < 22) and the oldest version Anima supports.
REAL_CLI_DIRS = (".claude-cli", ".claude-cli-2.1.197")
REAL_INSTALL_HINT = ("npm install --prefix .claude-cli @anthropic-ai/claude-code@latest && "
                     "npm install --prefix .claude-cli-2.1.197 @anthropic-ai/claude-code@2.1.197")


# --- the fake claude ----------------------------------------------------------------------


class FakeClaude:
    """One test's fake `claude`: its script, its state dir and its prompt log."""

    def __init__(self, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root = root
        self.script_path = root / "script.json"
        self.state_dir = root / "state"
        self.log_path = root / "prompts.jsonl"
        self.path = FAKE_CLAUDE
        # Run through this interpreter: no dependence on which python3 is first on PATH.
        self.argv = [sys.executable, "-I", "-S", str(FAKE_CLAUDE)]
        self.command = shlex.join(self.argv)
        self.write_script({})

    @property
    def env(self) -> dict[str, str]:
        """Variables the child needs; lay them over os.environ (AgentProcess(env=…) does)."""
        return {
            "FAKE_CLAUDE_SCRIPT": str(self.script_path),
            "FAKE_CLAUDE_STATE": str(self.state_dir),
            "FAKE_CLAUDE_LOG": str(self.log_path),
            # Its log and state are the test's, outside any worktree: writable in the sandbox;
            # the CLI lines it replays must stay visible where the checkout lives under /tmp
            # (the sandbox's private /tmp hides the rest of it).
            "ANIMA_SANDBOX_WRITABLE": os.pathsep.join([str(self.root), str(CLI_LINES_DIR)]),
        }

    @property
    def binary(self) -> AgentBinary:
        return find_claude(self.command)

    def write_script(self, script: dict[str, Any]) -> None:
        self.script_path.write_text(json.dumps(script), encoding="utf-8")

    def entries(self, role: str | None = None) -> list[dict[str, Any]]:
        """Every logged prompt entry (role, session_id, resume, prompt, argv, pid, turn)."""
        if not self.log_path.exists():
            return []
        text = self.log_path.read_text(encoding="utf-8")
        # Only whole lines: a fake may be writing the next one while a test polls.
        lines = text.splitlines()[:text.count("\n")]
        found = [json.loads(line) for line in lines if line.strip()]
        return [e for e in found if role is None or e["role"] == role]

    def prompts(self, role: str | None = None) -> list[str]:
        return [e["prompt"] for e in self.entries(role)]

    def use_env(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point Anima at the fake through its environment (ANIMA_CLAUDE_COMMAND & co.)."""
        monkeypatch.setenv("ANIMA_CLAUDE_COMMAND", self.command)
        for key, value in self.env.items():
            monkeypatch.setenv(key, value)


@pytest.fixture
def fake_claude(tmp_path: Path) -> FakeClaude:
    return FakeClaude(tmp_path / "fake_claude")


@pytest.fixture
def fake(fake_claude: FakeClaude, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    """The fake `claude`, found by the code under test (the app's window tests)."""
    fake_claude.use_env(monkeypatch)
    return fake_claude


# --- git ----------------------------------------------------------------------------------


def run_git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def git_repo(tmp_path: Path) -> Path:
    """A repo with one commit on `main`; identity set locally, so commits work anywhere."""
    return init_repo(tmp_path / "repo", {"README.md": "# test project\n"})


def init_repo(repo: Path, files: dict[str, str]) -> Path:
    """A new repo at `repo` whose first commit on `main` holds `files`; identity set locally,
    so commits work anywhere (tests and benches alike)."""
    repo.mkdir(parents=True)
    run_git(repo, "init", "-q", "-b", "main")
    run_git(repo, "config", "user.name", "Anima Test")
    run_git(repo, "config", "user.email", "anima-test@example.invalid")
    run_git(repo, "config", "commit.gpgsign", "false")
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text, encoding="utf-8")
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-q", "-m", "chore: initial commit")
    return repo


# --- the Messages API stub and the real CLI -----------------------------------------------


@pytest.fixture
def api_stub() -> Iterator[ApiStub]:
    with ApiStub() as stub:
        yield stub


def _real_claude_version(path: str) -> str | None:
    """The CLI's version, or None when `path` is not a working real `claude` (or is the fake)."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20,
                             env={k: v for k, v in os.environ.items() if k != "CLAUDECODE"})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0 or "Fake Claude" in out.stdout:
        return None
    return out.stdout.split()[0] if out.stdout.split() else None


def find_real_claudes() -> dict[str, str]:
    """{version: path} of every real CLI to test against: $ANIMA_REAL_CLAUDE alone when set,
    else each install of REAL_CLI_DIRS, else `claude` on PATH (never the fake)."""
    if os.environ.get("ANIMA_REAL_CLAUDE"):
        candidates = [os.environ["ANIMA_REAL_CLAUDE"]]
    else:
        candidates = [str(REPO_ROOT / d / "node_modules" / ".bin" / "claude")
                      for d in REAL_CLI_DIRS]
        candidates = [c for c in candidates if os.access(c, os.X_OK)] or \
            [c for c in [shutil.which("claude")] if c]
    found: dict[str, str] = {}
    for candidate in candidates:
        if os.access(candidate, os.X_OK) and (version := _real_claude_version(candidate)):
            found.setdefault(version, candidate)
    return found


def find_real_claude() -> str | None:
    """The newest real CLI found (benches measure one)."""
    found = find_real_claudes()
    return found[max(found, key=_version_key)] if found else None


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split(".") if part.isdigit())


_REAL_CLAUDES = find_real_claudes()


@pytest.fixture(scope="session", params=sorted(_REAL_CLAUDES, key=_version_key) or [None],
                ids=lambda version: f"claude-{version}" if version else "no-claude")
def real_claude_bin(request: pytest.FixtureRequest) -> str:
    """Each real CLI installed (the newest on npm and 2.1.197 in CI): every real-CLI test runs
    against each, since users have either."""
    if request.param is None:
        if os.environ.get("CI"):
            pytest.fail(f"real claude CLI not installed (CI must install it): {REAL_INSTALL_HINT}")
        pytest.skip(f"real claude CLI not installed: {REAL_INSTALL_HINT}")
    return _REAL_CLAUDES[request.param]


@pytest.fixture(scope="session")
def newest_claude_bin() -> str:
    """The newest real CLI alone, for what does not depend on the CLI's version (several
    milestones at once: each pair is the single-milestone case, which runs against each)."""
    if not _REAL_CLAUDES:
        if os.environ.get("CI"):
            pytest.fail(f"real claude CLI not installed (CI must install it): {REAL_INSTALL_HINT}")
        pytest.skip(f"real claude CLI not installed: {REAL_INSTALL_HINT}")
    return _REAL_CLAUDES[max(_REAL_CLAUDES, key=_version_key)]


def real_claude_env(stub: ApiStub, home: Path) -> dict[str, str]:
    """The real CLI, offline: everything to the Messages API stub, nothing out."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "ANTHROPIC_BASE_URL": stub.url,
        "ANTHROPIC_API_KEY": "sk-ant-test-dummy",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "XDG_CONFIG_HOME": str(home / ".config"),
    }


@pytest.fixture
def real_env(api_stub: ApiStub, tmp_path: Path) -> dict[str, str]:
    return real_claude_env(api_stub, tmp_path / "home")


# --- the real codex -------------------------------------------------------------------------

REAL_CODEX_DIR = ".codex-cli"
CODEX_INSTALL_HINT = "npm install --prefix .codex-cli @openai/codex@latest"


def find_real_codex() -> str | None:
    """$ANIMA_REAL_CODEX, else the README's install, else `codex` on PATH."""
    candidates = [os.environ.get("ANIMA_REAL_CODEX") or
                  str(REPO_ROOT / REAL_CODEX_DIR / "node_modules" / ".bin" / "codex"),
                  shutil.which("codex")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.fixture(scope="session")
def real_codex_bin() -> str:
    found = find_real_codex()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(f"real codex CLI not installed (CI must install it): {CODEX_INSTALL_HINT}")
        pytest.skip(f"real codex CLI not installed: {CODEX_INSTALL_HINT}")
    return found


@pytest.fixture
def codex_home() -> Iterator[Path]:
    """A CODEX_HOME outside /tmp: under /tmp Codex refuses to set up the helper its own
    read-only sandbox runs commands through."""
    folder = Path(tempfile.mkdtemp(prefix="anima-codex-home-", dir="/var/tmp"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def real_codex_env(stub: Any, home: Path) -> dict[str, str]:
    """The real codex pointed at a `ResponsesStub` (its config.toml in `home`)."""
    from tests.fakes.responses_stub import KEY_VAR

    stub.codex_home(home)
    return {"CODEX_HOME": str(home), KEY_VAR: "sk-stub"}


# --- no process left behind ---------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, command) of a pid from /proc, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name_end = raw.rfind(")")
    fields = raw[name_end + 2:].split()
    return int(fields[1]), fields[0], raw[raw.find("(") + 1:name_end]


def descendants(root: int) -> dict[int, str]:
    """All live or zombie descendants of `root`: {pid: "state command"}."""
    children: dict[int, list[int]] = {}
    info: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _proc_stat(int(entry))
        if stat is None:
            continue
        children.setdefault(stat[0], []).append(int(entry))
        info[int(entry)] = f"{stat[1]} {stat[2]}"
    found: dict[int, str] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            found[child] = info[child]
            stack.append(child)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """Fail a test that leaves a child (or a zombie) of the test process behind."""
    before = set(descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 2.0
    while True:
        left = {p: d for p, d in descendants(os.getpid()).items() if p not in before}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, os.WNOHANG)
            except (ProcessLookupError, ChildProcessError):
                pass
        pytest.fail(f"test left child processes behind: {left}")


def pytest_configure(config: pytest.Config) -> None:
    """Compile Anima's sources and the fakes once, before the workers start: the suite starts
    `python -m anima` hundreds of times and the fake `claude` thousands, and where the
    environment says PYTHONDONTWRITEBYTECODE (as this CI's does) each of them compiled every
    module again (a quarter of a second of CPU each for Anima, on a machine of two cores).
    Reading cached bytecode is still allowed there."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        for folder in ("anima", "ui", "tests/fakes"):
            compileall.compile_dir(REPO_ROOT / folder, quiet=1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `-n 4` (pytest-xdist, `--dist loadgroup`), the tests that drive a real agent CLI
    run one after another on one worker per CLI: each starts a heavy Node or native process
    whose start-up the others would slow past their timeouts on a small CI machine."""
    for item in items:
        for marker in ("real_claude", "real_codex"):
            if item.get_closest_marker(marker) is not None:
                item.add_marker(pytest.mark.xdist_group(marker))



@pytest.fixture(autouse=True)
def app_style(request: pytest.FixtureRequest) -> Iterator[None]:
    """The window's tests see it as the app draws it, its style sheet on: bold titles and
    padded buttons change what fits (a 1024-pixel screen did not fit the window once)."""
    if not request.module.__name__.rpartition(".")[2].startswith("test_ui_"):
        yield
        return
    from ui.app import styled_application

    app = styled_application()
    yield
    app.setStyleSheet("")
