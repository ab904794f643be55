"""The credentials in Anima's environment never reach the agents' commands, the checks or the
setup command (the network is open: a `GH_TOKEN` there would let the Developer, or the code
it writes, push or publish as you); each agent's CLI keeps its own login, and config
`pass_env` lets a named one through. Sandboxed or not: this is no mount. The real engine
headless, the fake `claude` and a check that print what they see of their environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from anima.credentials import is_credential
from anima.store.models import MilestoneStatus
from tests.conftest import FakeClaude
from tests.helpers import make_project, milestone_md, record
from tests.test_recovery import Runner

PY = sys.executable
GITHUB = "ghp_0123456789abcdefghijABCDEFGHIJ012345"
NPM = "npm_plain-looking-value-0123456789"
OPENAI = "sk-proj-not-this-clis-key-0123456789"
ANTHROPIC = "sk-ant-the-claude-clis-own-key-0123456789"
DATABASE = "db-password-the-checks-need-0123"
#: VS Code's terminal: git asks the editor for your logins through these.
ASKPASS = "/usr/share/code/resources/app/extensions/git/dist/askpass.sh"
IPC = "/run/user/0/vscode-git-0123456789.sock"
#: A password in a URL, whatever the variable's name; a proxy's is the agents' way out.
DATABASE_URL = "postgres://app:db-url-password-0123@db.internal:5432/prod"
PROXY = "http://me:proxy-password-0123@127.0.0.1:9"
SECRETS = {"GH_TOKEN": GITHUB, "NPM_TOKEN": NPM, "OPENAI_API_KEY": OPENAI,
           "ANTHROPIC_API_KEY": ANTHROPIC, "DATABASE_PASSWORD": DATABASE,
           "GIT_ASKPASS": ASKPASS, "VSCODE_GIT_IPC_HANDLE": IPC, "DATABASE_URL": DATABASE_URL}
#: Not credentials: inherited as they are.
OTHERS = {"https_proxy": PROXY, "NO_PROXY": "*", "REDIS_URL": "redis://cache:6379/0"}


def dump_env(fake: FakeClaude, who: str) -> str:
    """A command that writes its environment where the test reads it (outside the tree,
    writable in the sandbox: the fake's folder)."""
    return f"env > {fake.root / who}.env"


def seen(fake: FakeClaude, who: str) -> str:
    return (fake.root / f"{who}.env").read_text(encoding="utf-8")


@pytest.mark.parametrize("sandbox", ["auto", "off"])
def test_credentials_reach_only_their_own_cli_and_what_pass_env_names(
        git_repo: Path, fake_claude: FakeClaude, sandbox: str) -> None:
    project = make_project(git_repo, {"m1": milestone_md("One", ["Hello"])}, {
        "sandbox": sandbox, "check_command": dump_env(fake_claude, "check"),
        "worktree_setup_command": dump_env(fake_claude, "setup"),
        "pass_env": ["DATABASE_PASSWORD"]})
    fake_claude.write_script({
        "developer": [{"shell": [dump_env(fake_claude, "developer")], "auto": True}],
        "acceptor_default": {"shell": [dump_env(fake_claude, "acceptor")], "auto": True}})
    runner = Runner(project, fake_claude, env={**SECRETS, **OTHERS})
    assert runner.wait(90) == 0, runner.stdout[-3000:] + runner.stderr
    assert record(project, "m1").status is MilestoneStatus.COMPLETED

    agents = {who: seen(fake_claude, who) for who in ("developer", "acceptor")}
    commands = {who: seen(fake_claude, who) for who in ("check", "setup")}
    for who, env in {**agents, **commands}.items():
        for value in (GITHUB, NPM, OPENAI, ASKPASS, IPC, DATABASE_URL):  # another CLI's key too
            assert value not in env, (who, value)
        assert f"DATABASE_PASSWORD={DATABASE}" in env, who  # pass_env
        assert f"https_proxy={PROXY}" in env and "REDIS_URL=redis://cache:6379/0" in env, who
        assert "PATH=" in env and "ANIMA_SANDBOX_WRITABLE=" in env, who  # the rest is there
    for who, env in agents.items():
        assert f"ANTHROPIC_API_KEY={ANTHROPIC}" in env, who  # the claude CLI's own login
    for who, env in commands.items():
        assert ANTHROPIC not in env, who  # the checks run the Developer's code

    said = runner.stdout + runner.stderr
    assert said.count("kept out of the agents' and checks' environment") == 1, said
    assert ("DATABASE_URL, GH_TOKEN, GIT_ASKPASS, NPM_TOKEN, OPENAI_API_KEY, "
            "VSCODE_GIT_IPC_HANDLE") in said, said
    assert "ANTHROPIC_API_KEY reaches only the claude CLI" in said, said
    assert "pass_env" in said
    assert not any(value in said for value in SECRETS.values())


@pytest.mark.parametrize(("name", "value", "kept_out"), [
    ("DATABASE_URL", "postgres://app:pw@db/prod", True),
    ("CELERY_BROKER", "amqp://:pw@rabbit//", True),  # no user, a password
    ("SOMETHING", "see mysql://root:pw@localhost/x for the dump", True),
    ("REPO", "git+ssh://git@github.com/you/repo.git", False),  # a user, no password
    ("HOMEPAGE", "https://example.com/a:b@c", False),  # '@' in the path, not the authority
    ("ALL_PROXY", "socks5://you:pw@proxy:1080", False),  # the CLIs' way to their API
    ("no_proxy", "localhost", False),
])
def test_a_url_with_a_password_is_a_credential_whatever_its_name(
        name: str, value: str, kept_out: bool) -> None:
    assert is_credential(name, value) is kept_out
