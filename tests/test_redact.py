"""Redaction: every secret family, the look-alikes that must survive, and the stream speed."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse

import pytest

from anima.events import EngineError, Event, LogLine, Notice, RawOutput
from anima.text.redact import (
    REDACTED,
    AgentRedactor,
    LineRedactor,
    RedactingBus,
    add_known_secrets,
    is_secret_key,
    redact,
    redact_data,
    secret_values,
)

ANT = "sk-ant-api03-" + "a1B2c3D4e5" * 8
OPENAI = "sk-" + "Ab3dEf6hIj" * 5
PROJ = "sk-proj-" + "Zz9_yY8-xX" * 5
GHP = "ghp_" + "A1b2C3d4E5" * 4
JWT = ("eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4ifQ."
       "SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c")
PEM = ("-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAx8nR\nq0ZmFh2Z3k==\n"
       "-----END RSA PRIVATE KEY-----")


@pytest.mark.parametrize(("text", "expected"), [
    (f"key {ANT} here", f"key {REDACTED} here"),
    (f"export ANTHROPIC_API_KEY={ANT}", f"export ANTHROPIC_API_KEY={REDACTED}"),
    ("ANTHROPIC_API_KEY=dummy-value-1", f"ANTHROPIC_API_KEY={REDACTED}"),
    (f"openai {OPENAI} and {PROJ}.", f"openai {REDACTED} and {REDACTED}."),
    ("id AKIAIOSFODNN7EXAMPLE,", f"id {REDACTED},"),
    ("id ASIAY34FZKBOKMUTVV7A", f"id {REDACTED}"),
    ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
     f"aws_secret_access_key = {REDACTED}"),
    (f"token {GHP}", f"token {REDACTED}"),
    ("gho_" + "x" * 36 + " ghs_" + "Y1" * 18, f"{REDACTED} {REDACTED}"),
    ("github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz", REDACTED),
    ("slack xoxb-1234567890-0987654321-AbCdEfGhIj", f"slack {REDACTED}"),
    ("google AIzaSyA-1234567890abcdefghijklmnopqrstu", f"google {REDACTED}"),
    ("curl -H 'Authorization: Bearer abc.def-123456' https://x",
     f"curl -H 'Authorization: Bearer {REDACTED}' https://x"),
    ('{"Authorization": "Bearer abcdef123456"}', f'{{"Authorization": "Bearer {REDACTED}"}}'),
    ("Authorization: Basic dXNlcjpwYXNzd29yZA==", f"Authorization: Basic {REDACTED}"),
    ("proxy-authorization: token9f8e7d6c", f"proxy-authorization: {REDACTED}"),
    ("sent Bearer 9f8e7d6c5b4a39281706", f"sent Bearer {REDACTED}"),
    (f"jwt {JWT} end", f"jwt {REDACTED} end"),
    # right after an escape: a JSON-escaped newline, colour codes of every length
    (f"a\\n{JWT}", f"a\\n{REDACTED}"),
    (f"\x1b[m{JWT}\x1b[0m", REDACTED),
    (f"\x1b[1;33m{JWT}", REDACTED),
    (f"\x1b[38;5;208m{JWT}", REDACTED),
    (f"before\n{PEM}\nafter", f"before\n{REDACTED}\nafter"),
    ("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq", REDACTED),
    ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbg==\n-----END OPENSSH PRIVATE KEY-----", REDACTED),
    ('password="hunter2"', f'password="{REDACTED}"'),
    ("password: hunter2", f"password: {REDACTED}"),
    ("  db_password: correcthorse", f"  db_password: {REDACTED}"),
    ("passwd=abc", f"passwd={REDACTED}"),
    ("secret: 's3cr3t value'", f"secret: '{REDACTED}'"),
    ('{"client_secret": "abc123xyz", "n": 1}', f'{{"client_secret": "{REDACTED}", "n": 1}}'),
    ("apiKey: 'abc123'", f"apiKey: '{REDACTED}'"),
    ("x-api-key: abc123def", f"x-api-key: {REDACTED}"),
    ("apikey=zzz999", f"apikey={REDACTED}"),
    ("ACCESS_KEY=AbCdEf123", f"ACCESS_KEY={REDACTED}"),
    ("private_key = 'MIIBOgIBAAJBAK'", f"private_key = '{REDACTED}'"),
    ("GITHUB_TOKEN=foo123", f"GITHUB_TOKEN={REDACTED}"),
    ("refresh_token: r-9f8e7d", f"refresh_token: {REDACTED}"),
    ("--password hunter2 --api-key=abc123", f"--password {REDACTED} --api-key={REDACTED}"),
    ('run --password "a b c" --next', f'run --password "{REDACTED}" --next'),
    ("run --password 'hunter2' x", f"run --password '{REDACTED}' x"),
    ("curl -ubot:Qpw2secret https://x", f"curl -ubot:{REDACTED} https://x"),
    ("postgres://admin:hunter2@db:5432/app", f"postgres://admin:{REDACTED}@db:5432/app"),
    ("PASSWORD = 'x y z'", f"PASSWORD = '{REDACTED}'"),
    ("token password=hunter2", f"token password={REDACTED}"),
    ("password=hunter2&user=bob", f"password={REDACTED}&user=bob"),
    ("İstanbul password=abc123 İ", f"İstanbul password={REDACTED} İ"),
])
def test_secret_is_redacted(text: str, expected: str) -> None:
    assert redact(text) == expected



@pytest.mark.parametrize(("text", "expected"), [
    # glued to an escape: a colour code, a JSON or repr escape, a backslash-t in a command
    (f"\x1b[33m{OPENAI}\x1b[0m", REDACTED),  # the colour codes go too (terminal controls)
    (f'"\\u001b[33m{OPENAI}"', f'"\\u001b[33m{REDACTED}"'),
    (f"ANTHROPIC\\t{ANT}", f"ANTHROPIC\\t{REDACTED}"),
    (f"'line\\n{GHP}'", f"'line\\n{REDACTED}'"),
    (f"KEY{ANT}", f"KEY{REDACTED}"),
    ("idAKIAIOSFODNN7EXAMPLE", f"id{REDACTED}"),
    # more token formats
    ("glpat-" + "Ab1_" * 5, REDACTED),
    ("hf_" + "aB3d" * 9, REDACTED),
    ("npm_" + "aB3d" * 9, REDACTED),
    ("xapp-1-A0123456789-1234567890123-abcdef", REDACTED),
    ("key sk-" + "AbcdefGhijKlmnopQrstUvwx", f"key {REDACTED}"),
    # Stripe secret and restricted keys, SendGrid keys, under names that say nothing
    ("stripe: sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc", f"stripe: {REDACTED}"),
    ("(rk_live_" + "51Hx83jfk29Dkq01LmzAb3dEf" + ")", f"({REDACTED})"),
    ("sk_test_" + "4eC39HqLyjWDarjtT1zdp7dc", REDACTED),
    ("MAIL=SG." + "ngeVfQFYQlKU0ufo8x5d1A" + ".TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
     f"MAIL={REDACTED}"),
    # URLs: an empty user, a password holding `@`
    ("redis://:pw9Secret@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
    ("postgres://app:p@ss@db:5432/app", f"postgres://app:{REDACTED}@db:5432/app"),
    # environment names
    ("DB_PASS=hunter2 MYSQL_PWD=abc", f"DB_PASS={REDACTED} MYSQL_PWD={REDACTED}"),
    ("SECRET_KEY_BASE=abcdef0123", f"SECRET_KEY_BASE={REDACTED}"),
    ("STRIPE_KEY=rk_live_abc APP_KEY=base64:abcd==", f"STRIPE_KEY={REDACTED} APP_KEY={REDACTED}"),
    ("AWS_CREDENTIALS=xyz GITHUB_AUTH=xyz", f"AWS_CREDENTIALS={REDACTED} GITHUB_AUTH={REDACTED}"),
    # values with a dot, or cut by punctuation, or all digits, after a secret name
    ("API_TOKEN=abc.def123", f"API_TOKEN={REDACTED}"),
    ("MAPBOX_TOKEN=pk.eyJ1IjoiYWJjIn0.abc", f"MAPBOX_TOKEN={REDACTED}"),
    ("DB_PASSWORD=p,a;s&s{w'rd next", f"DB_PASSWORD={REDACTED} next"),
    ('"DB_PASS=abc,def"', f'"DB_PASS={REDACTED}"'),
    ("API_KEY=86753091234", f"API_KEY={REDACTED}"),
    ("password: 86753091", f"password: {REDACTED}"),
    # PGP keys and passwords on command lines
    ("-----BEGIN PGP PRIVATE KEY BLOCK-----\n\nlQOYBF\n-----END PGP PRIVATE KEY BLOCK-----",
     REDACTED),
    ("curl -u admin:s3cr3t https://x", f"curl -u admin:{REDACTED} https://x"),
    ("mysql -u root -pS3cret db", f"mysql -u root -p{REDACTED} db"),
    ("sshpass -p 'Pw0rd' ssh host", f"sshpass -p '{REDACTED}' ssh host"),
])
def test_secret_glued_escaped_or_in_a_less_common_form_is_redacted(text: str,
                                                                   expected: str) -> None:
    assert redact(text) == expected


@pytest.mark.parametrize("text", [
    "docker run -u 1000:1000 img && mysql -p mydb",
    "export DB_PASS=$(cat secret.txt) PASSWORD=${DB_PASSWORD} MYSQL_PWD=$PW",
    "API_TOKEN = settings.api_token",
    "sk-learn-style-hyphenated-words-here and task-management-system-design",
    "ask_live_questions_here_please and msg.payload.attachments.thumbnail_url",
    "MSG.ngeVfQFYQlKU0ufo8x5d1A.TwL2iGABf9DHoTf-09kqeF8tAmbihYzrnopKc-1s5cr",
    "timeout_token: 30 USE_AUTH=1",
    "https://user@example.com/a@b and http://host:8080/x@y",
])
def test_look_alikes_of_the_less_common_forms_are_kept(text: str) -> None:
    assert redact(text) == text


def test_redact_data_redacts_keys_and_any_value_under_a_secret_key() -> None:
    data = {ANT: "k", "password": 86753091234, "api_key": ["PlainListSecret99"],
            "env": {"DB_PASS": "hunter2"}, "secret": {"nested": 1}, "token": None,
            "token_count": 12, "input_tokens": 1234567}
    assert redact_data(data) == {
        REDACTED: "k", "password": REDACTED, "api_key": [REDACTED], "env": {"DB_PASS": REDACTED},
        "secret": REDACTED, "token": None, "token_count": 12, "input_tokens": 1234567}

@pytest.mark.parametrize("text", [
    "commit 3f2a9c1e0b7d4a6f8e9c0b1a2d3e4f5a6b7c8d9e on milestone/m1",
    "session 123e4567-e89b-12d3-a456-426614174000 resumed",
    "edited /home/user/project/anima/token_counter.py and src/secret_santa/main.rs",
    "token_count: 12",
    '{"input_tokens": 5, "output_tokens": 55, "cache_read_input_tokens": 14000}',
    "max_tokens=300 tokens_used: 1234",
    "the password is stored in the keychain",
    "Remember the password: it must be long",
    "Enter password: ",
    "password = getpass.getpass()",
    "api_key = settings.api_key",
    'api_key = os.environ["ANTHROPIC_API_KEY"]',
    "token = next_token",
    "secret = None",
    "token: string;",
    "if password == 'x':",
    "password != other",
    "Password: ${DB_PASSWORD}",
    "token: <your-token>",
    "secret=***",
    'password=""',
    "echo $API_KEY",
    "PWD=/home/user/project OLDPWD=/tmp",
    "scikit-learn and task-abcdefghijklmnopqrstuvwxyz0123 and desk-lamp",
    "the bearer of bad news",
    "Authorization: required",
    "monkey: banana1",
    "AKIA is the prefix of AWS key ids",
    "git@github.com:owner/repo.git https://example.com/a@b",
    "",
])
def test_ordinary_text_is_kept(text: str) -> None:
    assert redact(text) == text


def test_raw_stream_json_line_stays_valid_json() -> None:
    event = {"type": "user", "message": {"content": [{
        "type": "tool_result",
        "content": f'cat .env\nANTHROPIC_API_KEY={ANT}\npassword="hunter2"\n{{"token": "t0k3n"}}',
    }]}, "usage": {"input_tokens": 3}}
    line = json.dumps(event)
    cleaned = redact(line)
    parsed = json.loads(cleaned)
    content = parsed["message"]["content"][0]["content"]
    assert ANT not in cleaned and "hunter2" not in cleaned and "t0k3n" not in cleaned
    assert f"ANTHROPIC_API_KEY={REDACTED}" in content
    assert parsed["usage"] == {"input_tokens": 3}


def test_redact_data_walks_structures_and_secret_keys() -> None:
    data = {
        "password": "hunter2",
        "Authorization": "Bearer abc",
        "token_count": 12,
        "apiKey": "${KEY}",
        "nested": [{"text": f"key {ANT}"}, ("a", f"GITHUB_TOKEN={GHP}")],
        "ok": "plain text",
        "n": None,
    }
    out = redact_data(data)
    assert out == {
        "password": REDACTED,
        "Authorization": f"Bearer {REDACTED}",
        "token_count": 12,
        "apiKey": "${KEY}",
        "nested": [{"text": f"key {REDACTED}"}, ["a", f"GITHUB_TOKEN={REDACTED}"]],
        "ok": "plain text",
        "n": None,
    }
    assert data["password"] == "hunter2"  # the input is not mutated


@pytest.mark.parametrize(("key", "secret"), [
    ("password", True), ("DB_PASSWORD", True), ("apiKey", True), ("ANTHROPIC_API_KEY", True),
    ("client_secret", True), ("aws_secret_access_key", True), ("access_token", True),
    ("token_count", False), ("input_tokens", False), ("keyboard", False), ("monkey", False),
])
def test_is_secret_key(key: str, secret: bool) -> None:
    assert is_secret_key(key) is secret


def test_redaction_is_idempotent() -> None:
    text = f"ANTHROPIC_API_KEY={ANT} password: hunter2 Bearer 9f8e7d6c5b4a {JWT}"
    once = redact(text)
    assert redact(once) == once


def test_line_redactor_hides_a_pem_block_split_over_lines() -> None:
    lines = ["config:", "-----BEGIN EC PRIVATE KEY-----", "MHcCAQEEIBkg", "oUQDQgAE",
             "-----END EC PRIVATE KEY----- trailing", f"next {ANT}"]
    r = LineRedactor()
    out = [r(line) for line in lines]
    assert out == ["config:", REDACTED, REDACTED, REDACTED, f"{REDACTED} trailing",
                   f"next {REDACTED}"]


def test_a_key_split_over_outputs_is_hidden_up_to_its_end_and_no_further() -> None:
    r = LineRedactor()
    assert r("$ head -1 id_rsa\n-----BEGIN RSA PRIVATE KEY-----") == f"$ head -1 id_rsa\n{REDACTED}"
    assert r("MIIEowIBAAKC\nq0ZmFh==\n-----END RSA PRIVATE KEY-----\nok") == f"{REDACTED}\nok"
    assert r("after") == "after"
    # Without an END, only what looks like a key body is hidden.
    r = LineRedactor()
    r("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert r("b3BlbnNzaC1rZXk=\nThat was the key.") == f"{REDACTED}\nThat was the key."
    assert r("a.txt b.txt") == "a.txt b.txt"


def test_the_engine_bus_redacts_animas_own_lines_errors_and_notices() -> None:
    bus = RedactingBus()
    seen: list[Event] = []
    bus.subscribe(seen.append)
    bus.publish(LogLine("m1", f"undone: untracked creds {ANT} removed"))
    bus.publish(EngineError(f"cannot read {ANT}.md", "m1"))
    bus.publish(Notice("m1", "paused", f"paused: GITHUB_TOKEN={GHP}"))
    assert seen == [LogLine("m1", f"undone: untracked creds {REDACTED} removed"),
                    EngineError(f"cannot read {REDACTED}.md", "m1"),
                    Notice("m1", "paused", f"paused: GITHUB_TOKEN={REDACTED}")]


def test_hundred_thousand_stream_lines_are_quick() -> None:
    """A sanity check, not a benchmark: realistic stream lines, one in ten with a secret."""
    usage = {"input_tokens": 3, "cache_read_input_tokens": 14000, "output_tokens": 55}
    samples = [
        json.dumps({"type": "assistant", "message": {"content": [
            {"type": "text", "text": "Running the tests for the scheduler module now."}],
            "usage": usage}, "session_id": "123e4567-e89b-12d3-a456-426614174000"}),
        json.dumps({"type": "user", "message": {"content": [{
            "type": "tool_result",
            "content": "def fit(sections, budget):\n    return sum(map(len, sections))\n"}]}}),
        "[12:00:01] developer: edited anima/scheduler.py (+12 -3), commit 3f2a9c1e0b7d",
        f"password: hunter2 and export ANTHROPIC_API_KEY={ANT}",
    ]
    lines = [samples[i % 3] if i % 10 else samples[3] for i in range(100_000)]
    start = time.perf_counter()
    out = [redact(line) for line in lines]
    elapsed = time.perf_counter() - start
    assert out[0] == f"password: {REDACTED} and export ANTHROPIC_API_KEY={REDACTED}"
    assert out[1] == lines[1]
    print(f"redact: {len(lines) / elapsed:,.0f} lines/s")


@pytest.mark.parametrize(("raw", "shown"), [
    ("\x1b[1;31mFAILED\x1b[0m test_x", "FAILED test_x"),  # colours
    ("\x1b]0;pwned\x07title set", "title set"),  # the terminal's title
    ("bell\x07 nul\x00 del\x7f", "bell nul del"),
    ("tab\tand\nnewline\r\nkept", "tab\tand\nnewline\nkept"),
    ("Downloading 10%\rDownloading 100%\ndone", "Downloading 100%\ndone"),  # a progress line
])
def test_terminal_controls_in_agent_text_are_removed(raw: str, shown: str) -> None:
    assert redact(raw) == shown


#: Lines an agent can print (a generated file, a minified bundle, a test's repr) on which a
#: pattern that scans on from each of the line's many matches takes quadratic time: a
#: megabyte of them took Anima's reader thread minutes to hours.
REPEATED = ["sk-", "sk-a", "password=", "password:", "api_key=", "X_KEY=", "key=",
            "--password=", "curl -u ", "curl ", "mysql ", "sshpass ", "token: ",
            "eyJ", "eyJabcdefghi."]


def test_a_long_line_of_near_secrets_does_not_stall_the_reader() -> None:
    """Not a benchmark: the bound is ten times what it takes (the old patterns took over a
    minute for these 200 KB lines)."""
    start = time.perf_counter()
    for unit in REPEATED:
        line = unit * (200_000 // len(unit))
        assert len(redact(line)) > 0
    assert time.perf_counter() - start < 15


@pytest.mark.parametrize(("raw", "shown"), [
    # a value longer than one look is redacted whole
    (f"API_TOKEN={'a1' * 5000} next", f"API_TOKEN={REDACTED} next"),
    (f"password: {'Zz9' * 3000}", f"password: {REDACTED}"),
    # a key inside a value already redacted is not looked at again
    ("password=abc1password=def2 rest", f"password={REDACTED} rest"),
    # the command's flag, in the same command only
    ("curl -s https://x -u admin:hunter2 -o out", f"curl -s https://x -u admin:{REDACTED} -o out"),
    ("curl https://x; ls -u admin:hunter2", "curl https://x; ls -u admin:hunter2"),
    ("mysql -h db -psecret42 app", f"mysql -h db -p{REDACTED} app"),
    ("mysql -h db -p app", "mysql -h db -p app"),  # prompts for it
    ("sshpass -p hunter2 ssh host", f"sshpass -p {REDACTED} ssh host"),
    ("echo x | sshpass -p 'hunter2' ssh h", f"echo x | sshpass -p '{REDACTED}' ssh h"),
    # a digit far into the run of an `sk-` key still marks it
    (f"key sk-{'a' * 40}1", f"key {REDACTED}"),
])
def test_secrets_past_the_bounds_of_one_look_are_still_hidden(raw: str, shown: str) -> None:
    assert redact(raw) == shown


def test_the_secret_values_of_a_dotenv_file() -> None:
    """Every value, whatever it looks like, but short ones, placeholders and plain
    settings (unless under a secret's name)."""
    env = "\n".join([
        "# the payment provider",
        "STRIPE=stripe_live_Hx83jfk29Dkq01Lmz",
        "export DB_PASS='hunter22'",
        'DATABASE_URL="postgres://app:p4ssw0rd@db.internal:5432/app"',
        "COOKIE_SIGNATURE=correcthorsebatterystaple",  # no digit, a name that says nothing
        "NODE_ENV=production", "PORT=8080", "DEBUG=true", "APP_NAME=my-cool-app",
        "API_KEY=${API_KEY}", "LEGACY_TOKEN=<your-token>", "TIMEOUT_MS=300000",
        "API_URL=http://localhost:3000/v1", "REDIS=127.0.0.1:6379", "DB_PASSWORD=postgres",
        "CALLBACK=https://example.com/hook # the webhook",
        'QUIK="qk_live_9f8e7d6c5b4a3928" # quoted, then a comment',
    ])
    assert secret_values(env) == ["stripe_live_Hx83jfk29Dkq01Lmz", "hunter22",
                                  "postgres://app:p4ssw0rd@db.internal:5432/app",
                                  "correcthorsebatterystaple", "my-cool-app", "postgres",
                                  "https://example.com/hook", "qk_live_9f8e7d6c5b4a3928"]


def test_the_secret_values_of_a_json_file() -> None:
    """A `credentials.json` listed in `.worktreeinclude`: its values at any depth."""
    text = json.dumps({"service": "svc_live_1a2b3c4d5e6f7a8b", "region": "eu-west-1",
                       "db": {"password": "hunter22", "hosts": ["db1", "db2"]}})
    assert sorted(secret_values(text)) == ["eu-west-1", "hunter22",
                                           "svc_live_1a2b3c4d5e6f7a8b"]


def test_the_secret_values_of_a_file_of_neither() -> None:
    """A bare token, or a key file: its lines, not its comments or PEM armour."""
    assert secret_values("# the token\nq8Zt3vK1pL9mN2xR7sW4\n\n") == ["q8Zt3vK1pL9mN2xR7sW4"]
    assert secret_values("-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq\n"
                         "-----END PRIVATE KEY-----\n") == ["MIIEvQIBADANBgkq"]


def test_a_known_secret_is_hidden_in_the_forms_a_shell_writes_it() -> None:
    value = "kk_live_7d6c5b4a39281706ff"
    add_known_secrets([value])
    encoded = base64.b64encode(f"{value}\n".encode()).decode()  # `echo $KEY | base64`
    assert redact(encoded).startswith(REDACTED) and len(redact(encoded)) < len(REDACTED) + 5
    assert redact(f"?key={urllib.parse.quote(value + '/', safe='')}") == f"?key={REDACTED}%2F"
    assert redact(f"{value[:8]}\x01{value[8:]}") == REDACTED  # a control char inside it
    spaced = "pass phrase/with+all (of) it"  # in a form's field, and as JavaScript writes it
    add_known_secrets([spaced])
    for encoded in (urllib.parse.quote_plus(spaced), "pass%20phrase%2Fwith%2Ball%20(of)%20it"):
        assert redact(f"q={encoded}&x") == f"q={REDACTED}&x", encoded
    # `echo "KEY=$KEY" | base64`: the value starts inside a group of three bytes; the
    # groups wholly its own read the same whatever comes before
    for before in ("K=", "KY=", "KEY="):
        encoded = base64.b64encode(f"{before}{value}\n".encode()).decode()
        shown = redact(encoded)
        assert REDACTED in shown and len(shown) <= len(REDACTED) + 12, (before, shown)


def test_a_known_secret_is_hidden_however_json_escapes_it() -> None:
    value = 'zq"ł/-77\\x-9k'  # a quote, a backslash, non-ASCII and a slash
    add_known_secrets([value])
    for form in (json.dumps(value), json.dumps(value, ensure_ascii=False),
                 json.dumps(value).replace("/", "\\/"), '"\\u007Aq\\"\\u0142/-77\\\\x-9\\u006b"'):
        assert redact(f'{{"k": {form}}}') == f'{{"k": "{REDACTED}"}}', form
    # only that value: the same letters escaped around something else stay
    assert redact('"\\u007Aq\\"\\u0142/-78\\\\x-9k"') == '"\\u007Aq\\"\\u0142/-78\\\\x-9k"'
    # JSON inside a JSON string: every escape escaped again, some characters `\\u`-escaped
    inner = json.dumps({"k": value}).replace("/", "\\/")
    for outer in (json.dumps({"log": inner}), json.dumps({"log": inner}, ensure_ascii=False),
                  json.dumps({"log": inner.replace("zq", "\\u007aq")})):
        assert value not in json.loads(json.loads(redact(outer))["log"])["k"], outer


def test_a_known_secret_is_hidden_verbatim_wherever_it_appears() -> None:
    value = "zq81-looks-like-nothing-we-know-5521"
    assert redact(f"the key is {value}.") == f"the key is {value}."
    add_known_secrets([value, "short"])  # too short to hide everywhere
    assert redact(f"the key is {value}.") == f"the key is {REDACTED}."
    assert redact(json.dumps({"out": value * 2})) == json.dumps({"out": REDACTED * 2})
    assert redact("a short word") == "a short word"


def test_a_known_secret_broken_over_lines_is_hidden_piece_by_piece() -> None:
    """`base64` wraps at 76 columns, `fold` anywhere: no line holds the value whole. Each
    piece goes, the line breaks stay; a value's first part alone, or its pieces apart, stay."""
    value = "wq/8d7c6b5a49382716ff0e"
    add_known_secrets([value, value[:-4]])  # one begins the other: the longer one goes
    assert redact(f"a {value[:5]}\n{value[5:12]}\n\n{value[12:]} b") == \
        f"a {REDACTED}\n{REDACTED}\n\n{REDACTED} b"
    wrapped = base64.encodebytes(f"PAYMENT_KEY={value}\n".encode() * 3).decode()
    form = base64.b64encode(value.encode()).decode()[:28]  # the value's own groups
    assert wrapped.count(form) < wrapped.replace("\n", "").count(form)  # one is broken
    assert form not in redact(wrapped).replace("\n", "")
    for kept in (f"a {value[:5]}\nxyz", f"a {value[:5]}\n\nand {value[5:]}"):
        assert redact(kept) == kept


def test_a_line_held_for_the_rest_of_a_value_waits_its_own_time() -> None:
    """Each stream's held line goes when it is due, not when another stream's is: the other
    one may still get the rest of its value."""
    value = "hx/4c3b2a1f0e9d8c7b6a5"
    add_known_secrets([value])
    redactor = AgentRedactor()
    assert redactor(RawOutput(role="developer", text=f"err {value[:8]}"), "stderr") == []
    time.sleep(0.05)
    assert redactor(RawOutput(role="developer", text=f"out {value[:8]}"), "stdout") == []
    assert redactor.due is not None
    assert [e.text for e in redactor.release(redactor.due)] == [f"err {value[:8]}"]
    shown = redactor(RawOutput(role="developer", text=f"{value[8:]} end"), "stdout")
    shown += redactor.release()  # the end of output (`end` may begin another known value)
    assert [e.text for e in shown] == [f"out {REDACTED}", f"{REDACTED} end"]
