"""Secrets are redacted once, where agent output enters the engine: end to end through the
headless CLI with the fake `claude`, every kind the redactor knows, in every place an agent's
words (or a human's note) end up — the record, `anima status --json`, the log, the transcript
and the headless output."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path

from anima.engine.facade import Engine
from anima.events import Event, LogLine
from anima.store.models import MilestoneStatus, RoundKind, Verdict
from anima.text.redact import REDACTED
from tests.conftest import FakeClaude
from tests.helpers import ignored_dotenv, make_project, milestone_md, record, run_engine

#: kind -> (how it appears in text, the part that must never be stored or shown)
SECRETS = {
    "anthropic": ("key sk-ant-api03-" + "Zx9Yw8Vu7T" * 6, "Zx9Yw8Vu7T" * 6),
    "aws key id": ("id AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    "aws secret": ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                   "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
    "jwt": ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
            "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJSMeKKF2QT4fwpMeJf36POk6y"),
    "bearer": ("sent Bearer 9f8e7d6c5b4a39281706", "9f8e7d6c5b4a39281706"),
    "slack": ("slack xoxb-1234567890-0987654321-AbCdEfGhIj", "0987654321-AbCdEfGhIj"),
    "github": ("token ghp_" + "A1b2C3d4E5" * 4, "A1b2C3d4E5" * 4),
    "google": ("google AIzaSyA-1234567890abcdefghijklmnopqrstu", "1234567890abcdefghijklmnop"),
    "url password": ("db postgres://admin:Hunter2Pass9@db:5432/app", "Hunter2Pass9"),
    "password": ("password: CorrectHorse9Battery", "CorrectHorse9Battery"),
    "pem": ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx8nRsecretbody\nq0ZmFh2Z3k==\n"
            "-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEAx8nRsecretbody"),
}
ALL = "\n".join(text for text, _ in SECRETS.values())

TWO = milestone_md("Greeter", ["Greet command", "Version flag"])


def anima(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "anima", *args], capture_output=True,
                          text=True, timeout=240, env={**os.environ, **env},
                          stdin=subprocess.DEVNULL)


def leaks(text: str) -> list[str]:
    return [kind for kind, (_, secret) in SECRETS.items() if secret in text]


def test_every_kind_of_secret_is_redacted_everywhere(git_repo: Path,
                                                     fake_claude: FakeClaude) -> None:
    make_project(git_repo, {"m1": TWO})
    env = {"ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env,
           "ANTHROPIC_API_KEY": ""}
    report = ("## Implementation Report — Round {round}\n**Feature**: F1\n**Commit**: {head}\n"
              "**Tests**: ok\n**Lint**: clean\n\n### Changes\n"
              + "".join(f"- configured {line}\n" for text, _ in SECRETS.values()
                        for line in text.splitlines()[:1]))
    commit = "echo x >> f1.txt && git add -A && git commit -qm 'feat: F1'"
    # The PEM first: the rejection quotes the tail of the stderr, which then holds the others.
    stderr = [SECRETS["pem"][0], *(text for kind, (text, _) in SECRETS.items() if kind != "pem")]
    crash = {"stderr": [line for text in stderr for line in text.splitlines()], "crash": 1}
    fake_claude.write_script({
        # Round 1: crashes twice (stderr full of secrets) -> a rejection quoting the stderr.
        # Rounds 2-3: a report full of secrets (the summary), rejections full of secrets ->
        # three in a row -> a pause quoting the last one.
        "developer": [crash, crash,
                      {"shell": [commit], "text": report.replace("{round}", "2")},
                      {"shell": [commit], "text": report.replace("{round}", "3")}],
        "acceptor": [{"text": f"REJECTED: secrets in the diff:\n{ALL}"},
                     {"text": f"REJECTED: still there:\n{ALL}"},
                     {"auto": True}, {"auto": True},
                     {"text": f"REJECTED: final check failed:\n{ALL}"}],
    })
    first = anima("run", str(git_repo), "--headless", env=env)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.PAUSED, first.stdout + first.stderr
    assert "crashed twice" in rec.iterations[0].reason
    assert REDACTED in rec.iterations[0].reason  # the stderr tail, redacted
    assert REDACTED in (rec.pause_reason or "")
    resumed = anima("resume", str(git_repo), "m1", "--note", f"use these:\n{ALL}", env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert REDACTED in rec_note(git_repo)
    second = anima("run", str(git_repo), "--headless", env=env)
    status = anima("status", str(git_repo), "--json", env=env)
    rec = record(git_repo, "m1")
    assert rec.status is MilestoneStatus.COMPLETED, second.stdout + second.stderr
    final = next(i for i in rec.iterations if i.kind is RoundKind.FINAL)
    assert final.verdict is Verdict.REJECTED and REDACTED in final.reason
    assert any(REDACTED in i.summary for i in rec.iterations)
    # The Developer got the note and the reasons, redacted.
    prompts = "\n".join(fake_claude.prompts("developer"))
    assert f"use these:\n{SECRETS['anthropic'][0].split()[0]} {REDACTED}" in prompts
    assert leaks(prompts) == []
    anima_dir = git_repo / ".anima"
    files = {
        "record": (anima_dir / "milestones" / "m1.json").read_text(),
        "status --json": status.stdout,
        "log": (anima_dir / "logs" / "m1.log").read_text(),
        "transcript": (anima_dir / "transcripts" / "m1" / "events.jsonl").read_text(),
        "headless output": first.stdout + first.stderr + second.stdout + second.stderr,
        "resume output": resumed.stdout + resumed.stderr,
    }
    found = {name: leaks(text) for name, text in files.items()}
    assert found == {name: [] for name in files}, found
    for name in ("record", "status --json", "log", "transcript"):
        assert REDACTED in files[name], name
    assert json.loads(status.stdout)["milestones"][0]["iterations"][0]["reason"] == \
        rec.iterations[0].reason


def rec_note(repo: Path) -> str:
    return record(repo, "m1").human_notes[-1].text


# --- leaks found by a tester: git-derived and shortened texts -------------------------------

ONE = milestone_md("Greeter", ["Greet command"])
KEY = "sk-ant-api03-" + "Qw3Er5Ty7U" * 6
COMMIT = "echo x >> f1.txt && git add -A && git commit -qm 'feat: F1'"
REPORT = ("## Implementation Report — Round 1\n**Feature**: F1\n**Commit**: {head}\n"
          "**Tests**: ok\n**Lint**: clean\n\n### Changes\n- f1.txt\n")


def where_it_leaks(repo: Path, fake: FakeClaude, secret: str) -> list[str]:
    """Every file under .anima/, `anima status --json` and the prompts that hold `secret`."""
    hits = [str(p.relative_to(repo)) for p in (repo / ".anima").rglob("*")
            if p.is_file() and secret in p.read_text(errors="replace")]
    status = anima("status", str(repo), "--json", env={})
    hits += ["status --json"] if secret in status.stdout else []
    return hits + [f"prompt to {role}" for role in ("developer", "acceptor")
                   if any(secret in p for p in fake.prompts(role))]


def test_a_refused_push_keeps_no_url_password(git_repo: Path, fake: FakeClaude) -> None:
    """The denial is described (and cut to 160 characters) after it is redacted: the cut
    here lands between `deploy:` and `@`, where the URL rule no longer sees a password."""
    pw, head = "Hunter2SecretPassw0rdXYZ", "git push https://deploy:"
    cmd = f"cd {'a' * (159 - len(head) - len(pw) - 7)} && {head}{pw}@github.com/acme/app.git"
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"developer": [{"shell": [COMMIT, cmd], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    notes = " ".join(n for it in record(git_repo, "m1").iterations for n in it.notes)
    assert "tool rules refused" in notes
    assert where_it_leaks(git_repo, fake, pw) == []


def test_commit_subjects_reach_the_acceptor_redacted(git_repo: Path, fake: FakeClaude) -> None:
    make_project(git_repo, {"m1": ONE})
    commit = COMMIT.replace("'feat: F1'", f"'feat: F1 key {KEY}'")
    fake.write_script({"developer": [{"shell": [commit], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    assert any(f"F1 key {REDACTED}" in p for p in fake.prompts("acceptor"))
    assert where_it_leaks(git_repo, fake, KEY) == []


def test_names_of_files_an_acceptor_made_are_redacted_in_notes(git_repo: Path,
                                                               fake: FakeClaude) -> None:
    """The note that the review's changes were undone names the files from git; the record,
    and the log lines the window and the notifications show, get it redacted. (Without the
    sandbox: inside it the Acceptor cannot write a file at all.)"""
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"acceptor": [{"shell": [f"touch 'creds {KEY}'"], "text": "ACCEPTED"}]})
    engine = Engine(git_repo, config_overrides={"summarizer": {"enabled": False},
                                                "sandbox": "off"})
    published: list[Event] = []
    engine.bus.subscribe(published.append)
    try:
        engine.run(watch=False, start_all=True)
    finally:
        engine.shutdown()
    notes = " ".join(n for it in record(git_repo, "m1").iterations for n in it.notes)
    assert f"creds {REDACTED}" in notes
    assert any(f"creds {REDACTED}" in e.text for e in published if isinstance(e, LogLine))
    assert [e for e in published if KEY in repr(e)] == []
    assert where_it_leaks(git_repo, fake, KEY) == []


def test_a_key_split_over_two_tool_outputs_is_redacted(git_repo: Path,
                                                       fake: FakeClaude) -> None:
    """The BEGIN line comes in one tool result, the body and END line in the next."""
    body = "MIIEowIBAAKCAQEAx8nRsplitbody"
    rest = fake.root / "rest-of-key"  # where the confined agent can read it
    rest.write_text(f"{body}\nq0ZmFh2Z3k==\n-----END RSA PRIVATE KEY-----\nafter\n")
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"developer": [{"shell": [
        "echo '-----BEGIN RSA PRIVATE KEY-----'", f"cat {rest}", COMMIT], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    transcript = (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert f"{REDACTED}\\nafter" in transcript
    assert where_it_leaks(git_repo, fake, body) == []


def test_a_token_after_a_colour_code_is_redacted(git_repo: Path, fake: FakeClaude) -> None:
    """A coloured line puts `m` (the end of `\\x1b[33m`) right before the token."""
    token = "sk-" + "Ab3dEf6hIj" * 5
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"developer": [
        {"shell": [f"printf '\\033[33m{token}\\033[0m\\n'", COMMIT], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    assert where_it_leaks(git_repo, fake, token) == []


def test_the_credentials_anima_passes_on_to_its_agents_never_leave_them(
        git_repo: Path, fake_claude: FakeClaude) -> None:
    """Every agent's CLI inherits its API credentials from Anima's environment: a proxy's
    token, Bedrock's AWS secret (with Bedrock on). Printed bare (`printenv`), nothing marks
    them as secrets; the record, the log, the transcript and the Acceptor's prompt had them
    as they are."""
    credentials = {"ANTHROPIC_AUTH_TOKEN": "proxy-7f3a9c2e51b84d06",
                   "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}
    make_project(git_repo, {"m1": ONE})
    fake_claude.write_script({"developer": [{
        "shell": [f"printenv {' '.join(credentials)}", COMMIT],
        "text": REPORT + "".join(f"- used {v}\n" for v in credentials.values())}]})
    env = {"ANIMA_CLAUDE_COMMAND": fake_claude.command, **fake_claude.env, **credentials,
           "CLAUDE_CODE_USE_BEDROCK": "1"}
    run = anima("run", str(git_repo), "--headless", env=env)
    assert record(git_repo, "m1").status is MilestoneStatus.COMPLETED, run.stdout + run.stderr
    transcript = (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert f"{REDACTED}\\n{REDACTED}" in transcript  # the agent did see them
    for value in credentials.values():
        assert value not in run.stdout + run.stderr
        assert where_it_leaks(git_repo, fake_claude, value) == []


def transcript_printing(git_repo: Path, fake: FakeClaude, value: str,
                        commands: list[str]) -> str:
    """The transcript of a milestone whose `.env` (copied in) holds `value` and whose
    Developer runs `commands`, then commits and reports."""
    ignored_dotenv(git_repo, f"PAYMENT_KEY={value}\n")
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"developer": [{"shell": [*commands, COMMIT], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    return (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()


def test_a_copied_in_value_written_json_escaped_is_redacted(
        git_repo: Path, fake: FakeClaude) -> None:
    """A program that prints a `.env` value inside JSON may escape any of its characters
    (`\\u0070`, PHP's `\\/`): the tool output held the value as plainly as printed bare."""
    transcript = transcript_printing(git_repo, fake, "pay/7f3a9c2e51b84d06", [
        "printf '%s\\n' '{\"key\":\"\\u0070ay\\/7f3a9c2e51b84d06\"}'",
        "printf '%s\\n' '{\"key\":\"pay\\/7f3a9c2e51b84d06\"}'",
        "printf '%s\\n' '{\"key\":\"p\\u0061y/7f3a9c2e51b84\\u0064\\u00306\"}'"])
    assert transcript.count(f'"content": "{{\\"key\\":\\"{REDACTED}\\"}}"') == 3
    assert where_it_leaks(git_repo, fake, "7f3a9c2e51b84") == []


def test_a_copied_in_value_json_escaped_twice_is_redacted(
        git_repo: Path, fake: FakeClaude) -> None:
    """JSON inside a JSON string (a log record's message, `docker inspect`, a CLI's stream
    line that failed to parse) escapes the value's escapes again: `\\\\/`, `\\\\u0070`."""
    transcript = transcript_printing(git_repo, fake, "pay/7f3a9c2e51b84d06", [
        "printf '%s\\n' '{\"msg\":\"{\\\"key\\\":\\\"pay\\\\/7f3a9c2e51b84d06\\\"}\"}'",
        "printf '%s\\n' '{\"msg\":\"{\\\"key\\\":\\\"pay\\\\\\/7f3a9c2e51b84d06\\\"}\"}'",
        "printf '%s\\n' '{\"msg\":\"{\\\"key\\\":\\\"\\\\u0070ay\\\\/7f3a9c2e51b84d06\\\"}\"}'"])
    assert transcript.count(REDACTED) >= 3
    assert where_it_leaks(git_repo, fake, "7f3a9c2e51b84") == []


def test_a_copied_in_value_split_over_two_lines_of_the_cli_is_redacted(
        git_repo: Path, fake: FakeClaude) -> None:
    """The agent CLI's own output (stderr, or stdout lines that are not its protocol) comes
    line by line: a `.env` value a wrapped message breaks over two lines has its first half
    end one and its second half start the next, and neither line alone holds it. Each half,
    kept, is most of the secret. (The turn crashes: the crash's note quotes the stderr.)"""
    value = "pay/7f3a9c2e51b84d06e5"
    head, tail = value[:9], value[9:]
    ignored_dotenv(git_repo, f"PAYMENT_KEY={value}\n")
    make_project(git_repo, {"m1": ONE})
    fake.write_script({"developer": [
        {"noise": [f"config: {head}", f"{tail} (from .env)"],
         "stderr": [f"warn: key {head}", f"{tail} was rejected", f"again {value[:3]}",
                    f"{value[3:]}"],
         "crash": 1},
        {"shell": [COMMIT], "text": REPORT}]})
    run_engine(git_repo, summarizer={"enabled": False})
    transcript = (git_repo / ".anima" / "transcripts" / "m1" / "events.jsonl").read_text()
    assert f"warn: key {REDACTED}" in transcript
    assert f"{REDACTED} was rejected" in transcript
    assert f"config: {REDACTED}\\n{REDACTED} (from .env)" in transcript  # the crash's note
    for piece in (head, tail, value[3:]):
        assert where_it_leaks(git_repo, fake, piece) == [], piece


def test_a_copied_in_value_in_the_forms_other_tools_write_is_redacted(
        git_repo: Path, fake: FakeClaude) -> None:
    """URL-encoded by `quote` (it keeps `/`) or with lower-case hex (.NET), base64url (JWT
    tools, `tr '+/' '-_'`), or cut by a carriage return (what a terminal shows is the
    value's end): each of these showed most of the value."""
    value = "pay/7f+3a9c2e5~1b84d06?"
    base64url = base64.urlsafe_b64encode(f"KEY={value}".encode()).decode()
    outputs = [f"?k={urllib.parse.quote(value)}&x=1",
               f"?k={urllib.parse.quote(value, safe='').lower()}&x=1", base64url,
               "pay/7f+3a9\rc2e5~1b84d06?"]
    files = []
    for i, output in enumerate(outputs):  # where the confined agent can read them
        files.append(fake.root / f"out-{i}")
        files[-1].write_text(output + "\n")
    transcript = transcript_printing(git_repo, fake, value, [f"cat {f}" for f in files])
    assert transcript.count(f'"content": "?k={REDACTED}&x=1"') == 2  # the outputs
    for piece in ("c2e5~1b84d06", "c2e5%7E1b84d06", base64url[8:-8]):
        assert where_it_leaks(git_repo, fake, piece) == [], piece
