"""Secret redaction for everything Anima shows, logs, stores or sends to a model.

Agents stream hundreds of thousands of lines per milestone and any of them may echo an
environment, a config file or an HTTP header. `redact` therefore has to be thorough and cheap:
one lower-casing plus a few substring tests decide which families of secrets a line can hold at
all (usually none), and only those families are searched.

What is replaced by `<REDACTED>`:
- provider tokens: Anthropic `sk-ant-…`, OpenAI `sk-…`/`sk-proj-…`, AWS key ids `AKIA…`/`ASIA…`,
  GitHub `ghp_/gho_/ghs_/ghu_/ghr_…` and `github_pat_…`, GitLab `glpat-…`, Hugging Face `hf_…`,
  npm `npm_…`, Slack `xox[abprs]-…`/`xapp-…`, Google `AIza…`, Stripe `sk_live_…`/`rk_live_…`
  (and `_test_`), SendGrid `SG.….…` — also right after an escape
  (`\n` in JSON or repr text, a colour code);
- JWTs (`eyJ….eyJ….…`), `Bearer <token>`, the value of `Authorization:` headers (the scheme
  word is kept), the password in `scheme://user:password@host` (empty user, `@` inside);
- passwords on well-known command lines: `curl -u user:pw`, `mysql -pPW`, `sshpass -p PW`;
- PEM private key and PGP private key blocks, whole (a block cut off by the end of the text is
  redacted to the end; `LineRedactor` carries a block across separately streamed texts);
- values assigned to a key that names a secret (`password`, `passwd`, `secret`, `token`,
  `api_key`/`apiKey`, `access_key`, `private_key`, `client_secret`, `credentials`,
  `ANTHROPIC_API_KEY`, environment names ending `_PASS`/`_PWD`/`_KEY`/`_AUTH`,
  `--password x` …) in `k=v`, `k: v`, `"k": "v"`, `export K=v` forms, also inside JSON-escaped
  strings. Key and quotes stay, so JSON stays JSON. In `NAME=value` the value runs to white
  space (`DB_PASS=a,b;c`, `API_TOKEN=abc.def`);
- verbatim, whatever they look like (`add_known_secrets`): the values of the files a project
  copies into its worktrees, and of the secret-named variables of Anima's own environment,
  some of which its agents' CLIs inherit (`environment_secrets`); also base64-, URL- or
  JSON-encoded (any character of the value `\\uXXXX`-escaped), and JSON-encoded twice (JSON
  in a JSON string); and broken over lines (`base64` wraps at 76 columns), also over the
  lines an agent CLI prints (`AgentRedactor` holds a line that ends in a value's first part
  back for the next one).

Deliberately left alone: commit hashes, UUIDs, paths, counters and short numbers
(`token_count: 12`, `"input_tokens": 5`, `USE_AUTH=1`), placeholders (`${VAR}`, `<your-key>`,
`***`), code that reads a secret (`password = getpass.getpass()`, `api_key = settings.api_key`),
and the words in prose ("the password: it must be long").
"""

from __future__ import annotations

import base64
import bisect
import dataclasses
import itertools
import json
import re
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

from anima.events import (
    AgentEvent,
    AssistantText,
    Event,
    EventBus,
    RawOutput,
    Thinking,
    ToolResult,
    TurnResult,
)

__all__ = [
    "REDACTED",
    "LineRedactor",
    "RedactingBus",
    "add_known_secrets",
    "environment_secrets",
    "is_secret_key",
    "redact",
    "redact_data",
    "secret_values",
]

REDACTED: Final = "<REDACTED>"

# Why not one big alternation: measured 3x slower here. sre skips ahead fast only when a pattern
# starts with a literal or a small character set; the families below each do, and the
# key/value family is found with str.find on its key words instead of a regex scan at all.

# --- provider tokens and JWTs -------------------------------------------------------------
_TOKEN_TRIGGERS: Final = ("sk-", "akia", "asia", "ghp_", "gho_", "ghs_", "ghu_", "ghr_",
                          "github_pat_", "xox", "xapp-", "aiza", "eyj", "glpat-", "hf_", "npm_",
                          "sk_live_", "rk_live_", "sk_test_", "rk_test_")
# Looked for as written: lower-cased, "sg." is in every `msg.` of a line of code.
_CASED_TOKEN_TRIGGER: Final = "SG."
# Word boundaries are checked in `_replace_token`: a leading `\b` would cost the fast scan.
_TOKENS: Final = re.compile(
    r"sk-ant-[A-Za-z0-9_-]{16,}"
    r"|sk-(?:proj|svcacct|admin)-[A-Za-z0-9_-]{16,}"
    r"|sk-(?=[A-Za-z0-9_-]{0,256}\d)[A-Za-z0-9_-]{20,}"
    # Without a digit: one unbroken mixed-case run (hyphenated words are not keys).
    r"|sk-(?=[A-Za-z]{0,256}[a-z])(?=[A-Za-z]{0,256}[A-Z])[A-Za-z]{20,}(?![\w-])"
    r"|AKIA[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|ASIA[A-Z0-9]{16}(?![A-Za-z0-9])"
    r"|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|glpat-[A-Za-z0-9_-]{20,}"
    r"|(?:hf|npm)_(?=[A-Za-z0-9]{0,256}\d)[A-Za-z0-9]{30,}"
    r"|xox[abprs]-[A-Za-z0-9-]{10,}"
    r"|xapp-\d-[A-Za-z0-9-]{20,}"
    r"|AIza[0-9A-Za-z_-]{30,}"
    r"|[sr]k_(?:live|test)_[A-Za-z0-9]{16,}"
    r"|SG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])"
    # header.payload.signature; header and payload are base64 JSON objects ("{"" -> "eyJ").
    # Tried only where a JWT can stand (see `_replace_token`): not inside a run of its own
    # characters, or every "eyJ" of a line of them would scan the rest of it for the dot.
    r"|(?:(?<![A-Za-z0-9_-])|(?<=\\[A-Za-z])|(?<=\[m)|(?<=[\[;]\dm)|(?<=[\[;]\d\dm)"
    r"|(?<=[\[;]\d\d\dm))eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*"
)

# --- PEM private keys ---------------------------------------------------------------------
# PEM and PGP armour: `-----BEGIN RSA PRIVATE KEY-----`, `-----BEGIN PGP PRIVATE KEY BLOCK-----`.
_PEM: Final = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----"
                         r"(?:[\s\S]*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)")
_PEM_END: Final = re.compile(r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
# The lines of a key's body: base64, blank lines, and the headers an armour may carry.
_PEM_BODY: Final = re.compile(
    r"(?:[ \t]*(?:[A-Za-z0-9+/]+=*|(?:Proc-Type|DEK-Info|Version|Comment|Hash):[^\n]*)?[ \t]*"
    r"(?:\n|\Z))*")

# --- key/value assignments ----------------------------------------------------------------
# How far one match looks. Agents print lines of megabytes: a pattern that scanned the rest
# of the line from each of its many keys would take minutes over one line. A value longer
# than this is followed to its end once, where it is redacted whole.
_SCAN: Final = 4096
_KEY_SCAN: Final = 128  # a key's name, back from its last word
# The last word of every secret key; a hit is then checked against the whole key.
_KEY_ROOTS: Final = ("password", "passwd", "passphrase", "secret", "token", "key",
                     "authorization", "credentials", "pass", "pwd", "auth", "key_base")
_SECRET_WORD = (
    r"(?:passwd|password|passphrase|secret|token|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|secret[_-]?key(?:[_-]?base)?|signing[_-]?key|encryption[_-]?key|authorization"
    r"|credentials)"
)
# Environment names: `DB_PASS`, `MYSQL_PWD`, `STRIPE_KEY`, `APP_KEY`, `GITHUB_AUTH`.
_ENV_SECRET = r"(?-i:[A-Z0-9_]*_(?:PASS|PWD|AUTH|KEY))"
# A word of a `.env` name that marks its value a secret (`STRIPE_LIVE_KEY`, `DB_PASS_2`).
_ENV_SECRET_NAME: Final = re.compile(r"(?:^|_)(?:PASS|PWD|AUTH|KEY|SECRET|TOKEN)(?:_|$)",
                                     re.IGNORECASE)
_SECRET_KEY_END: Final = re.compile(
    r"(?:" + _SECRET_WORD + r"|(?<![A-Za-z0-9_])" + _ENV_SECRET + r")\Z", re.IGNORECASE)
_SECRET_KEY_FULL: Final = re.compile(r"[\w.-]*?" + _SECRET_WORD + "|" + _ENV_SECRET,
                                     re.IGNORECASE)
_SCHEME = r"(?:Bearer|Basic|Token|Digest|Bot)"
_SCHEME_RE: Final = re.compile(_SCHEME + r"[ \t]+", re.IGNORECASE)
# What may follow a secret key: an optional closing quote (possibly JSON-escaped, as in the
# raw stream), a separator, then a double-, escaped-double-, single-quoted or bare value.
_KV_TAIL: Final = re.compile(
    r"(?P<keyq>\\?[\"'])?[ \t]*(?P<sep>:=|=>|=(?!=)|:)[ \t]*"
    r"(?:(?P<dq>\"(?:[^\"\\\n]|\\.)*\")"
    r"|(?P<edq>\\\"(?:[^\"\\\n]|\\[^\"\n])*\\\")"
    r"|(?P<sq>'[^'\n]*')"
    r"|(?P<scheme>" + _SCHEME + r"[ \t]+)?(?P<bare>[^\s\"'`,;()\[\]{}<>\\&]{1," + str(_SCAN)
    + r"}))",
    re.IGNORECASE,
)
# `--password hunter2` (a command-line flag followed by its value).
# A quoted value runs to its closing quote, which stays.
_FLAG: Final = re.compile(r"(?<![\w-])--[\w-]*?" + _SECRET_WORD
                          + r"[ \t]+[\"']?(?P<val>(?<=[\"'])[^\"'\n]+|[^\s\"'-]\S*)",
                          re.IGNORECASE)
# `Bearer <token>` outside a header: a token has a digit or is long; English words are not.
_BEARER_TAIL: Final = re.compile(
    r"[ \t]+(?P<val>(?=[A-Za-z0-9._~+/-]{0,256}\d)[A-Za-z0-9._~+/-]{8,}=*"
    r"|[A-Za-z0-9._~+/-]{20,}=*)")
# `scheme://user:password@host`; the user may be empty (`redis://:pw@host`) and the password
# may hold `@` (the host starts after the last one).
_URL: Final = re.compile(r"(?<=://)(?P<user>[^/\s:@\"']*:)(?P<pw>[^/\s\"'?#]+)(?=@)")
# Passwords given to well-known commands: `curl -u user:pw`, `mysql -pPW`, `sshpass -p PW`.
_CLI_TRIGGERS: Final = ("curl", "mysql", "sshpass")
_CLI_COMMAND: Final = re.compile(r"\b(?:curl|mysql(?:dump|admin)?|sshpass)\b")
# Their password flags, found first (then the command before each, in the same command):
# a pattern from each command word to its flag would scan on from every word of a long line.
_CLI_FLAG: Final = re.compile(
    r"[ \t](?:(?P<user>(?:-u|--user)[ \t=]*[\"']?[^\s:\"']*:)|-p(?P<spaced>[ \t]*)[\"']?)"
    r"(?P<val>[^\s\"']+)")
_COMMAND_BREAK: Final = re.compile(r"[\n|;&]")
# The rest of a `NAME=value` assignment's value, up to white space.
_ENV_VALUE_REST: Final = re.compile(r"\S*")
# The rest of a bare value longer than `_SCAN`.
_BARE_REST: Final = re.compile(r"[^\s\"'`,;()\[\]{}<>\\&]*")

# Values under a secret-looking key that are not secrets: types, keywords, masks.
_NOT_SECRET_VALUES: Final = frozenset({
    "", "none", "null", "nil", "true", "false", "undefined", "string", "str", "int", "bool",
    "boolean", "number", "bytes", "any", "optional", "required", "yes", "no", "redacted",
    "env", "secret", "password", "token", "self", "the", "a", "an", "is", "be",
})
_CODE_REF: Final = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")
_PLACEHOLDER: Final = re.compile(r"[$%<{]|\*+\Z|x+\Z|\.\.\.|…")
_KEY_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
_DISTINCT_PREFIXES: Final = ("sk-ant-", "sk-proj-", "sk-svcacct-", "sk-admin-", "AKIA", "ASIA",
                              "ghp_", "gho_", "ghs_", "ghu_", "ghr_", "github_pat_", "glpat-",
                              "xox", "xapp-")
_ESCAPE_BEFORE: Final = re.compile(r"(?:\\[A-Za-z]|(?:\x1b|\\u001b|\\x1b|\\033|\\e)\[[0-9;]*m)\Z",
                                   re.IGNORECASE)
# ESC sequences (CSI, OSC, two-character) and every C0/C1 control except tab and newline.
_CONTROLS: Final = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
                              r"|\x1b[ -/]*[0-~]?|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_OVERWRITTEN: Final = re.compile(r"^[^\n]*\r(?=[^\n\r])", re.MULTILINE)
_CONTROLS_TRIGGER: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_WORD_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _is_placeholder(value: str) -> bool:
    """`${VAR}`, `%(x)s`, `<your-key>`, `***`, `xxx`, numbers, type names and keywords."""
    v = value.strip()
    return (
        v.lower() in _NOT_SECRET_VALUES
        or _PLACEHOLDER.match(v) is not None
        or (v.replace(".", "", 1).replace("_", "").isdigit() and len(v) < 6)  # not a PIN
        or v == REDACTED
    )


def _with_scheme(value: str) -> tuple[str, str]:
    """Split `Bearer abc` into ("Bearer ", "abc"): the scheme word is not a secret."""
    scheme = _SCHEME_RE.match(value)
    prefix = scheme.group(0) if scheme else ""
    return prefix, value[len(prefix):]


def _env_assignment(text: str, key_start: int, m: re.Match[str]) -> bool:
    """`API_TOKEN=abc.def` as in a shell or a .env file (an upper-case name, `=` without
    spaces): the value is data up to white space, never code."""
    return (m.group("sep") == "=" and m.start("sep") == m.start()
            and m.start("bare") == m.end("sep") and text[key_start: m.start()].isupper())


def _bare_is_secret(text: str, key_start: int, m: re.Match[str]) -> bool:
    """Decide for an unquoted value whether it is data (redact) or code/prose (keep)."""
    value = m.group("bare")
    if _is_placeholder(value):
        return False
    sep = m.group("sep")
    end = m.end("bare")
    if _CODE_REF.fullmatch(value) and not _env_assignment(text, key_start, m):
        # A call, an index or an attribute chain reads a secret rather than holding one.
        if (end < len(text) and text[end] in "([") or "." in value:
            return False
        # `token = next_token` (spaced `=`, identifier without digits) is code, not config.
        spaced = text[m.start("sep") - 1] == " "
        if sep != ":" and spaced and not any(c.isdigit() for c in value):
            return False
    key = text[key_start: m.start()]
    if sep == ":" and m.group("keyq") is None and key.isalpha() and key.islower():
        # A bare English word before a colon is prose unless it starts the line
        # ("password: hunter2" in YAML) or the value looks random (a digit or a symbol).
        window = max(0, key_start - _KEY_SCAN)  # further back, it is not the line's start
        newline = text.rfind("\n", window, key_start)
        if (newline < 0 and window > 0) or text[newline + 1:key_start].strip(" \t-#*") != "":
            return any(not c.isalpha() for c in value) or len(value) >= 20
    return True


def _kv_replacement(text: str, key_start: int, m: re.Match[str]) -> tuple[int, str] | None:
    """Where the tail match `m`'s secret ends and the redacted form up to there, or None to
    keep it as it is."""
    for group, quote_len in (("dq", 1), ("edq", 2), ("sq", 1)):
        quoted = m.group(group)
        if quoted is not None:
            prefix, secret = _with_scheme(quoted[quote_len:-quote_len])
            if _is_placeholder(secret):
                return None
            q = quoted[:quote_len]
            return m.end(), f"{text[m.start(): m.start(group)]}{q}{prefix}{REDACTED}{q}"
    scheme = m.group("scheme")
    if scheme:
        if _is_placeholder(m.group("bare")):
            return None
        return m.end(), f"{text[m.start(): m.start('scheme')]}{scheme}{REDACTED}"
    if not _bare_is_secret(text, key_start, m):
        return None
    end = m.end()
    if len(m.group("bare")) == _SCAN:
        rest = _BARE_REST.match(text, end)
        assert rest is not None
        end = rest.end()
    if _env_assignment(text, key_start, m):  # `DB_PASS=p,a;s&s{w` is one value
        rest = _ENV_VALUE_REST.match(text, end)
        assert rest is not None
        end = rest.end()
        while end > m.end() and text[end - 1] in "\"'`)\\":
            end -= 1
    return end, text[m.start(): m.start("bare")] + REDACTED


def _kv_spans(text: str, low: str) -> list[tuple[int, int, str]]:
    """(start, end, replacement) for every secret key/value and `Bearer` token in `text`."""
    spans: list[tuple[int, int, str]] = []
    for root in _KEY_ROOTS:
        find = low.find
        i = find(root)
        while i != -1:
            pos = next_search = i + len(root)
            key_start, bound = i, max(0, i - _KEY_SCAN)
            while key_start > bound and text[key_start - 1] in _KEY_CHARS:
                key_start -= 1
            if (_SECRET_KEY_END.search(text, key_start, pos) is not None
                    and not (key_start > 0 and text[key_start - 1] == "$")
                    and (m := _KV_TAIL.match(text, pos)) is not None
                    and (found := _kv_replacement(text, key_start, m)) is not None):
                spans.append((pos, *found))
                next_search = found[0]  # a key inside a value redacted whole needs no look
            i = find(root, next_search)
    i = low.find("bearer")
    while i != -1:
        pos = i + 6
        if i == 0 or text[i - 1] not in _WORD_CHARS:
            m = _BEARER_TAIL.match(text, pos)
            if m is not None:
                spans.append((m.start("val"), m.end(), REDACTED))
        i = low.find("bearer", pos)
    return spans


def _apply(text: str, spans: list[tuple[int, int, str]]) -> str:
    """Splice non-overlapping replacements into `text` (earliest wins on overlap)."""
    spans.sort()
    out: list[str] = []
    last = 0
    for start, end, repl in spans:
        if start < last:
            continue
        out.append(text[last:start])
        out.append(repl)
        last = end
    out.append(text[last:])
    return "".join(out)


def _replace_token(m: re.Match[str]) -> str:
    """A token glued to a word is part of it ("task-…" contains "sk-"), unless its prefix
    could not be (`sk-ant-`, `ghp_`, `AKIA`…) or what it is glued to is an escape: `\n` in
    JSON or repr text, a colour code (`\x1b[33m`)."""
    start, token = m.start(), m.group(0)
    if (start > 0 and m.string[start - 1] in _WORD_CHARS
            and not token.startswith(_DISTINCT_PREFIXES)
            and _ESCAPE_BEFORE.search(m.string, max(0, start - 16), start) is None):
        return token
    return REDACTED


def _replace_flag(m: re.Match[str]) -> str:
    if _is_placeholder(m.group("val")):
        return m.group(0)
    start, end = m.start("val") - m.start(), m.end("val") - m.start()
    return m.group(0)[:start] + REDACTED + m.group(0)[end:]


def _lower(text: str) -> str:
    """Lower-case with positions preserved (str.lower lengthens a few non-ASCII letters)."""
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


# --- the project's own secret values --------------------------------------------------------
# The values in the files a project copies into each worktree (`.worktreeinclude`: a `.env`)
# are secrets whatever they look like (a Stripe `sk_live_…`, a database URL with its
# password): each is hidden verbatim wherever it appears. Process-wide: each engine adds its
# project's when it opens a worktree.
_KNOWN_LOCK = threading.Lock()
_known: tuple[str, ...] = ()  # longest first, so a value inside another goes with it
_known_multiline: tuple[str, ...] = ()  # the same for the forms with a line break
#: `_known` by whether a text has a `%` and a `\\`: a form with one (URL-encoded, JSON-escaped)
#: is not looked for in a text without it.
_known_for: dict[tuple[bool, bool], tuple[str, ...]] = {}
_known_values: frozenset[str] = frozenset()  # the values as given
#: The values however a JSON string spells them (`_json_spelling`), for a text with `\\u`.
_known_escaped: re.Pattern[str] | None = None
#: Where a text may end in the first part of a form of `_known`, for a value that goes on in
#: the next line: the last (up to) three characters of each of its proper beginnings ->
#: (the form, how long that beginning is).
_known_starts: dict[str, tuple[tuple[str, int], ...]] = {}
_known_longest = 0
#: JSON's two-character escapes (`\\/` is optional: PHP writes it, most encoders do not).
_JSON_SHORT: Final = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f",
                      "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_PERCENT: Final = re.compile(r"%[0-9A-F]{2}")
#: base64's URL-safe alphabet (JWTs, `base64url`) for its standard one.
_BASE64URL: Final = str.maketrans("+/", "-_")
_ASSIGNMENT: Final = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][\w.-]*)\s*[=:]\s*(.*?)\s*$")
# Values of a copied-in file that are settings, not secrets (see `_is_setting`).
_SETTING_WORDS: Final = frozenset({
    "localhost", "development", "production", "staging", "testing", "local", "debug",
    "warning", "error", "critical", "verbose", "silent", "enabled", "disabled", "default",
    "console", "memory", "sqlite", "sqlite3", "postgres", "postgresql", "mysql", "redis",
})
_SHORT_NUMBER: Final = re.compile(r"[+-]?\d{1,9}(?:\.\d+)?")
_LOCAL_ADDRESS: Final = re.compile(
    r"(?:[a-z][a-z0-9+.-]*://)?(?:localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(?::\d+)?"
    r"(?:/[\w./-]*)?", re.IGNORECASE)


def secret_values(text: str) -> list[str]:
    """What a copied-in file holds, whatever it looks like: the values of its `NAME=value`
    lines (or of a JSON file's keys, at any depth), or for a file of neither (a bare token)
    its lines. Left out: values under six characters (too common to hide everywhere),
    placeholders, and, unless its name says secret (`DB_PASSWORD=localhost`), a value that
    is plainly a setting (`_is_setting`): hiding `production` or `localhost:5432` wherever
    an agent prints it would hide nothing and garble everything."""
    pairs = _json_pairs(text) or list(_assignments(text)) or [
        ("", line) for line in map(str.strip, text.splitlines())
        if line and not line.startswith(("#", "-----"))]  # no comment, no PEM armour
    return [value for name, value in pairs
            if len(value) >= 6 and not _is_placeholder(value)
            and (is_secret_key(name) or _ENV_SECRET_NAME.search(name) is not None
                 or not _is_setting(value))]


def environment_secrets(environ: Mapping[str, str]) -> list[str]:
    """The values of the variables whose names say secret (`is_secret_key`:
    `ANTHROPIC_AUTH_TOKEN`, `AWS_SECRET_ACCESS_KEY`, `GH_TOKEN`), but placeholders and values
    under six characters. Each agent's CLI inherits its own (`anima.credentials`), config
    `pass_env` hands some to every agent and check, and printed bare (`printenv`,
    `echo $TOKEN`) nothing else marks them as secrets."""
    return [value for name, value in environ.items()
            if is_secret_key(name) and len(value) >= 6 and not _is_placeholder(value)]


def _is_setting(value: str) -> bool:
    """A number under a billion (a timeout, a size), a local address without credentials
    (`http://127.0.0.1:8000`), or one of the common setting words (`_SETTING_WORDS`)."""
    return (value.lower() in _SETTING_WORDS or _SHORT_NUMBER.fullmatch(value) is not None
            or _LOCAL_ADDRESS.fullmatch(value) is not None)


def _assignments(text: str) -> Iterable[tuple[str, str]]:
    """`NAME=value` and `name: value` lines; a value's quotes and a comment after it go."""
    for line in text.splitlines():
        m = _ASSIGNMENT.match(line)
        if m is None:
            continue
        name, value = m.groups()
        if value[:1] in ("'", '"'):  # `"v" # a comment`: up to the closing quote
            end = value.find(value[0], 1)
            value = value[1:end] if end > 0 else value[1:]
        else:
            value = value.partition(" #")[0].rstrip()
        yield name, value


def _json_pairs(text: str) -> list[tuple[str, str]]:
    """Every (key, string value) of a JSON document, nested ones too ([] if it is none)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    pairs: list[tuple[str, str]] = []
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        name, value = stack.pop()
        if isinstance(value, str):
            pairs.append((name, value))
        elif isinstance(value, dict):
            stack += [(str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(name, v) for v in value]
    return pairs


def _url_forms(value: str) -> set[str]:
    """`value` URL-encoded as encoders write it: every reserved character escaped (`quote`
    with `safe=""`), or all but `/` (`quote`'s default) or `!'()*` (JavaScript's
    `encodeURIComponent`), a space as `+` (a form's fields); hex digits in either case
    (.NET writes them lower-case)."""
    forms = {urllib.parse.quote(value, safe=safe) for safe in ("", "/", "!'()*")}
    forms.add(urllib.parse.quote_plus(value, safe=""))
    return forms | {_PERCENT.sub(lambda m: m.group().lower(), form) for form in forms}


def _json_escapes(text: str) -> set[str]:
    """`text` inside a JSON string as encoders write it: `\\"`, `\\\\`, `\\uXXXX` for
    non-ASCII (or not), `/` as `\\/` (PHP) or not."""
    forms = {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}
    return forms | {form.replace("/", "\\/") for form in forms}


def _json_forms(value: str) -> set[str]:
    """`value` inside a JSON string, and inside a JSON string inside another (a log record's
    message, a stream line that did not parse): its escapes escaped again (`\\\\/`)."""
    once = _json_escapes(value)
    return once | {twice for form in once for twice in _json_escapes(form)}


def _json_spelling(value: str) -> str:
    """A pattern for `value` inside a JSON string, or one inside another, any of its
    characters escaped or not (`\\u0073ecret`, `\\\\u0073ecret`): it matches that value and
    no other text."""
    def hex_digit(d: str) -> str:
        return f"[{d}{d.upper()}]" if d.isalpha() else d

    parts = []
    for ch in value:
        units = ch.encode("utf-16-be")
        escaped = "".join(r"\\{1,2}u" + "".join(map(hex_digit, units[i:i + 2].hex()))
                          for i in range(0, len(units), 2))
        short = _JSON_SHORT.get(ch)
        spelled = [ch, short, *_json_escapes(short)] if short else [ch]
        parts.append("(?:" + "|".join([escaped, *map(re.escape, spelled)]) + ")")
    return "".join(parts)


def add_known_secrets(values: Iterable[str]) -> None:
    """Hide these values verbatim from now on, wherever `redact` runs in this process, and
    as base64, URL-encoding and JSON write them (`echo $KEY | base64`, `echo "KEY=$KEY" |
    base64`, a query string, `"\\u0073ecret"` with any character escaped). Base64 by the
    groups of three bytes wholly the value's, for each of the three places it may start in
    a group: they read the same whatever comes before or after it (a `KEY=`, the newline
    `echo` adds), in the standard alphabet and the URL-safe one."""
    global _known, _known_multiline, _known_for, _known_values, _known_escaped, _known_starts
    global _known_longest
    values = [value for value in values if len(value) >= 6]
    forms = set()
    for value in values:
        raw = value.encode()
        forms |= {value, *_url_forms(value), *_json_forms(value)}
        for skip in range(3):  # the value's first byte at place `skip` of a group
            whole = (skip + len(raw)) // 3 * 4
            part = base64.b64encode(bytes(skip) + raw).decode()[4 if skip else 0:whole]
            if len(part) >= 8:
                forms |= {part, part.translate(_BASE64URL)}
    with _KNOWN_LOCK:
        known = sorted({*_known, *_known_multiline, *forms}, key=lambda v: (-len(v), v))
        _known = tuple(form for form in known if "\n" not in form)
        _known_multiline = tuple(form for form in known if "\n" in form)
        _known_for = {(percent, backslash): tuple(
            form for form in _known if (percent or "%" not in form)
            and (backslash or "\\" not in form))
            for percent in (False, True) for backslash in (False, True)}
        _known_starts = _starts_index(_known)
        _known_longest = len(_known[0]) if _known else 0
        if set(values) <= _known_values:
            return
        _known_values |= set(values)
        _known_escaped = re.compile("|".join(map(_json_spelling, sorted(
            _known_values, key=lambda v: (-len(v), v))))) if _known_values else None


def _starts_index(forms: Iterable[str]) -> dict[str, tuple[tuple[str, int], ...]]:
    """`_known_starts` for these forms: three lookups tell whether a line ends in the first
    part of any of them, however many and long they are."""
    index: dict[str, list[tuple[str, int]]] = {}
    for form in forms:
        for k in range(1, len(form)):
            index.setdefault(form[max(0, k - 3):k], []).append((form, k))
    return {end: tuple(starts) for end, starts in index.items()}


def _open_starts(text: str) -> list[tuple[str, int]]:
    """The known values (in any of their forms) whose first part `text` ends in, and how
    long that part is: the line that comes next may hold the rest of one."""
    return [(form, k) for end in {text[-3:], text[-2:], text[-1:]}
            for form, k in _known_starts.get(end, ()) if k <= 3 or text.endswith(form[:k])]


def _hide_known(text: str) -> str:
    """Every known value in `text`, whole or broken over its lines (`_across_lines`). Each
    form is looked for once, in the text without its line breaks: most texts hold none."""
    forms = _known_for[("%" in text, "\\" in text)]
    if "\n" not in text:
        for value in forms:
            if value in text:
                text = text.replace(value, REDACTED)
        return text
    for value in _known_multiline:
        if value in text:
            text = text.replace(value, REDACTED)
    joined = text.replace("\n", "")
    found = [value for value in forms if value in joined]
    for value in found:
        if value in text:
            text = text.replace(value, REDACTED)
    return _across_lines(text) if found else text


def _across_lines(text: str, brk: str = "\n") -> str:
    """Known values (in any of their forms) that line breaks (or carriage returns, `brk`)
    cut into pieces: each piece is redacted, the breaks stay. `base64` wraps at 76 columns,
    `fold` and a wrapped message wherever they like, and no line holds the value whole."""
    joined = text.replace(brk, "")
    found = [value for value in _known_for[("%" in text, "\\" in text)] if value in joined]
    if not found:
        return text
    # Where each line starts in `text` and in `joined` (a character's line: the last one
    # that starts at or before it, so empty lines are skipped).
    starts = [0, *(m.end() for m in re.finditer(brk, text))]
    joined_starts = [start - line for line, start in enumerate(starts)]

    def at(j: int) -> int:
        line = bisect.bisect_right(joined_starts, j) - 1
        return starts[line] + j - joined_starts[line]

    cuts: list[tuple[int, int]] = []
    for value in found:
        j = joined.find(value)
        while j >= 0:
            cuts.append((at(j), at(j + len(value) - 1) + 1))
            j = joined.find(value, j + len(value))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(cuts):  # overlapping values (one begins another) go together
        if merged and start <= merged[-1][1]:
            start, end = merged[-1][0], max(end, merged.pop()[1])
        merged.append((start, end))
    return _apply(text, [(start, end, brk.join(
        REDACTED if piece else "" for piece in text[start:end].split(brk)))
        for start, end in merged])


def redact(text: str) -> str:
    """Return `text` with every recognised secret replaced by `<REDACTED>`, and without
    terminal control sequences: an agent's ESC codes would otherwise drive the terminal of
    whoever reads the headless output or `cat`s the log, and a NUL or a BEL garbles both.

    Cheap in the common case: only families whose trigger substrings occur are searched.
    """
    if not text:
        return text
    if _CONTROLS_TRIGGER.search(text):  # first: a control inside a value would hide it
        if "\r" in text:  # a progress line: what a terminal would show, its last state
            text = text.replace("\r\n", "\n")
            if _known:  # not the end of a value a carriage return cut
                text = _across_lines(text, "\r")
            text = _OVERWRITTEN.sub("", text)
        text = _CONTROLS.sub("", text)
    if _known:
        text = _hide_known(text)
    if _known_escaped is not None and "\\u" in text:
        text = _known_escaped.sub(REDACTED, text)
    low = _lower(text)
    if "private key" in low:
        text = _PEM.sub(REDACTED, text)
        low = _lower(text)
    if any(t in low for t in _TOKEN_TRIGGERS) or _CASED_TOKEN_TRIGGER in text:
        new = _TOKENS.sub(_replace_token, text)
        if new != text:
            text, low = new, _lower(new)
    spans = _kv_spans(text, low)
    if spans:
        text = _apply(text, spans)
    if "--" in text and any(root in low for root in _KEY_ROOTS):
        text = _FLAG.sub(_replace_flag, text)
    if "://" in text and "@" in text:
        text = _URL.sub(lambda m: m.group("user") + REDACTED, text)
    if any(t in low for t in _CLI_TRIGGERS):
        text = _cli_passwords(text)
    return text


def _cli_passwords(text: str) -> str:
    """`curl -u user:pw`, `mysql -pPW`, `sshpass -p PW`: each flag whose command, the last
    of those before it and after the last `|`, `;`, `&` or line break, takes it."""
    commands = [(m.start(), m.group(0)) for m in _CLI_COMMAND.finditer(text)]
    starts = [start for start, _ in commands]
    breaks = [m.start() for m in _COMMAND_BREAK.finditer(text)]

    def replace(m: re.Match[str]) -> str:
        at = bisect.bisect_left(starts, m.start()) - 1
        if at < 0 or commands[at][0] < _last_before(breaks, m.start()):
            return m.group(0)
        command = commands[at][1]
        takes = command == "curl" if m.group("user") else \
            command == "sshpass" or (command.startswith("mysql") and not m.group("spaced"))
        return _replace_flag(m) if takes else m.group(0)

    return _CLI_FLAG.sub(replace, text)


def _last_before(positions: list[int], at: int) -> int:
    """The last of the sorted `positions` before `at`, or -1."""
    i = bisect.bisect_left(positions, at)
    return positions[i - 1] if i else -1


def is_secret_key(key: str) -> bool:
    """True for keys such as `password`, `apiKey`, `ANTHROPIC_API_KEY`, `client_secret`."""
    return _SECRET_KEY_FULL.fullmatch(key) is not None


def redact_data(obj: Any) -> Any:
    """Redact strings anywhere in a JSON-like structure, keys too; returns a new structure.

    Whatever is stored under a secret-looking key is redacted as a whole, since after JSON
    decoding nothing in the value itself says it is a secret (`{"password": "hunter2"}`,
    `{"pin": …, "api_key": ["…"]}`).
    """
    if isinstance(obj, str):
        return redact(obj)
    if isinstance(obj, dict):
        return {(redact(k) if isinstance(k, str) else k):
                (_secret_value(v) if isinstance(k, str) and is_secret_key(k) else redact_data(v))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [redact_data(v) for v in obj]
    return obj


def _secret_value(value: Any) -> Any:
    """A value under a secret key: kept only when it is a placeholder, a mask or a flag."""
    if value is None or isinstance(value, bool) or value == "":
        return value
    if isinstance(value, str):
        prefix, secret = _with_scheme(value)
        return value if _is_placeholder(secret) else prefix + REDACTED
    if isinstance(value, int | float):
        return value if _is_placeholder(str(value)) else REDACTED
    if isinstance(value, list | tuple):
        return [_secret_value(v) for v in value]
    return REDACTED  # a nested object: all of it is the secret


class LineRedactor:
    """`redact` for a stream of texts (lines, or whole tool outputs) where a PEM key spans
    several of them.

    A stateless `redact` sees `-----BEGIN … PRIVATE KEY-----` in one text and the base64 body in
    the next ones; this hides the following texts up to the key's END line. Without an END, it
    hides only what looks like a key body (base64 lines, armour headers), so a lone BEGIN line
    (`head -1 key.pem`) does not hide everything after it. One instance per stream.
    """

    def __init__(self) -> None:
        self._in_pem = False

    def __call__(self, text: str) -> str:
        head = ""
        if self._in_pem:
            end = _PEM_END.search(text)
            if end is not None:
                head, text = REDACTED, text[end.end():]
            else:
                body = _PEM_BODY.match(text)
                assert body is not None  # it matches the empty string at least
                if body.end() == len(text):
                    return REDACTED
                head = REDACTED + "\n" if body.end() else ""
                text = text[body.end():]
            self._in_pem = False
        if "-----BEGIN" in text:
            blocks = list(_PEM.finditer(text))
            self._in_pem = bool(blocks) and _PEM_END.search(blocks[-1].group()) is None
        return head + redact(text)


# Agent output: the one place where secrets in what an agent says are removed.
# Everything that leaves an agent process — each stdout event, the turn's result text, every
# stderr line and so the stderr tail a crash reports — passes through `AgentRedactor` in the
# process's reader before anything else sees it: records, events, the log, the transcript, the
# headless output, the window and the next prompt all get the redacted text, and none of them
# has to remember to redact it again.

E = TypeVar("E", bound=Event)


def redact_event(event: E) -> E:
    """A copy of an agent event with every string (and nested dict/list) redacted."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if isinstance(value, str | dict | list | tuple):
            cleaned = redact_data(value)
            if isinstance(value, tuple):
                cleaned = tuple(cleaned)
            if cleaned != value:
                changes[f.name] = cleaned
    return dataclasses.replace(event, **changes) if changes else event


# The text each kind of agent output carries; a PEM key may continue in the next one.
_TEXT_FIELD: Final[dict[type[Event], str]] = {
    RawOutput: "text", ToolResult: "content", AssistantText: "text", Thinking: "text"}


#: How long a raw line that ends in the first part of a known value is held back for the next
#: line of its stream, which may hold the rest: long enough for the rest of one write, too
#: short for anyone to see the wait.
HOLD_SECONDS: Final = 0.1


class _HeldLines:
    """One stream's raw lines: a known value a wrapped message breaks over two (or more) of
    them has no line that holds it whole. A line that ends in the first part of one waits
    for the next; then `_across_lines` redacts both pieces."""

    def __init__(self) -> None:
        self.held: list[RawOutput] = []
        self.since = 0.0  # when the lines held now began to be
        self.open: list[tuple[str, int]] = []  # `_open_starts` of their end

    def add(self, line: RawOutput) -> list[RawOutput]:
        """The lines that can go now: all, unless the last ones may go on into the next."""
        lines = [*self.held, line]
        if any(line.text.startswith(form[k:]) for form, k in self.open):
            pieces = iter(_across_lines("\n".join(held.text for held in lines)).split("\n"))
            texts = ["\n".join(itertools.islice(pieces, held.text.count("\n") + 1))
                     for held in lines]
            lines = [held if text == held.text else dataclasses.replace(held, text=text)
                     for held, text in zip(lines, texts, strict=True)]
        keep, tail = len(lines), ""  # from `keep` on: the lines a value may have begun in
        while keep and len(tail) < _known_longest:
            keep -= 1
            tail = lines[keep].text + tail
        self.open = _open_starts(tail)
        opened, covered = max((k for _, k in self.open), default=0), len(tail)
        while keep < len(lines) and covered - len(lines[keep].text) >= opened:
            covered -= len(lines[keep].text)
            keep += 1
        if keep or not self.held:
            self.since = time.monotonic()
        self.held = lines[keep:]
        return lines[:keep]

    def release(self) -> list[RawOutput]:
        released, self.held = self.held, []
        return released


class AgentRedactor:
    """Redacts one agent process's events. A PEM private key can span several outputs (lines
    of its stderr, two tool results of one `cat`), so each stream and each kind of text output
    has a `LineRedactor` that hides what follows a BEGIN line up to the key's END line. A
    known value can be wrapped over two raw lines (`_HeldLines`): such a line is held back
    until the next line of its stream, another of its events, the turn's result, or
    `release` (when `due`, or at the end of output)."""

    def __init__(self) -> None:
        self._streams: dict[str, LineRedactor] = {}
        self._held: dict[str, _HeldLines] = {}

    def __call__(self, event: Event, stream: str) -> list[Event]:
        """The redacted events to pass on now, in order (none while a line is held)."""
        field = _TEXT_FIELD.get(type(event))
        if field is not None:
            key = stream if isinstance(event, RawOutput) else type(event).__name__
            text = self._streams.setdefault(key, LineRedactor())(getattr(event, field))
            event = dataclasses.replace(event, **{field: text})
        event = redact_event(event)
        held = self._held.setdefault(stream, _HeldLines())
        if isinstance(event, RawOutput):
            return list(held.add(event))
        # A turn's result comes after what its turn printed on the other stream too.
        return [*(self.release() if isinstance(event, TurnResult) else held.release()), event]

    @property
    def due(self) -> float | None:
        """When (monotonic time) the lines held back must go out as they are; None: none is."""
        since = [held.since for held in self._held.values() if held.held]
        return min(since) + HOLD_SECONDS if since else None

    def release(self, due: float | None = None) -> list[Event]:
        """The lines held back (those due by then, if `due` is a time), as they are: no more
        output came to finish a value in them."""
        return [line for held in self._held.values()
                if due is None or held.since + HOLD_SECONDS <= due for line in held.release()]


class RedactingBus(EventBus):
    """The engine's bus: Anima's own events (log lines, errors, verdicts, notices) are redacted
    as they are published. Their texts quote git (file names, commit subjects) and exceptions,
    which never crossed `AgentRedactor`; so the window, the logs, notifications and the
    headless output all get them redacted, and no publisher has to remember to. Agent events
    are already redacted where they left their process."""

    def publish(self, event: Event) -> None:
        super().publish(event if isinstance(event, AgentEvent) else redact_event(event))
