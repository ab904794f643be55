"""The stream-json protocol as pure functions: no process needed."""

from __future__ import annotations

import json

import pytest

from anima.agents.claude.profiles import profile_for
from anima.agents.claude.protocol import (
    ContextMeter,
    build_argv,
    interrupt_request,
    parse_line,
    user_message,
)
from anima.agents.dialect import load_system_prompt
from anima.agents.transport import LineFramer
from anima.config import Config, RoleConfig
from anima.events import (
    ACCEPTOR,
    DEVELOPER,
    AssistantText,
    Compacted,
    ContextUsage,
    RawOutput,
    SessionStarted,
    Thinking,
    ToolResult,
    ToolUse,
    TurnResult,
)
from anima.text.redact import REDACTED

# --- argv ---------------------------------------------------------------------------------


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_developer_argv_with_session_id() -> None:
    profile = profile_for(DEVELOPER, Config())
    argv = build_argv(["claude"], profile.config, session_id="S1", resume=False,
                      system_prompt=profile.system_prompt)
    assert argv[:8] == ["claude", "-p", "--input-format", "stream-json", "--output-format",
                        "stream-json", "--verbose", "--session-id"]
    assert _flag(argv, "--session-id") == "S1"
    assert "--resume" not in argv
    assert _flag(argv, "--append-system-prompt").startswith("You are the Developer agent")
    assert _flag(argv, "--permission-mode") == "acceptEdits"
    assert _flag(argv, "--allowedTools") == "Bash Edit Write Read Glob Grep"
    assert _flag(argv, "--disallowedTools") == "Bash(git push:*)"  # allow_push is off
    assert "--model" not in argv


def test_acceptor_argv_resume_model_and_extra_args() -> None:
    config = Config()
    config.acceptor.model = "claude-sonnet-4-5"
    config.acceptor.extra_args = ["--max-turns", "30"]
    profile = profile_for(ACCEPTOR, config)
    argv = build_argv(["python3", "/x/fake.py"], profile.config, session_id="S2", resume=True,
                      system_prompt=profile.system_prompt)
    assert argv[:2] == ["python3", "/x/fake.py"]
    assert _flag(argv, "--resume") == "S2"
    assert "--session-id" not in argv
    assert _flag(argv, "--append-system-prompt").startswith("You are the Acceptor agent")
    assert _flag(argv, "--permission-mode") == "default"
    assert "Bash(git show:*) Bash(git diff:*)" in _flag(argv, "--allowedTools")
    assert _flag(argv, "--disallowedTools") == "Edit Write NotebookEdit Bash(git push:*)"
    assert _flag(argv, "--model") == "claude-sonnet-4-5"
    assert argv[-2:] == ["--max-turns", "30"]


def test_empty_tool_lists_are_omitted() -> None:
    argv = build_argv(["claude"], RoleConfig(permission_mode="plan"), session_id="S",
                      resume=False, system_prompt="p")
    assert "--allowedTools" not in argv and "--disallowedTools" not in argv
    assert _flag(argv, "--permission-mode") == "plan"


def test_role_prompts_name_their_role() -> None:
    assert load_system_prompt(DEVELOPER).startswith("You are the Developer agent")
    acceptor = load_system_prompt(ACCEPTOR)
    assert acceptor.startswith("You are the Acceptor agent")
    assert "REJECTED: <reason>" in acceptor and "ACCEPTED" in acceptor
    with pytest.raises(ValueError):
        load_system_prompt("reviewer")


# --- input lines --------------------------------------------------------------------------


def test_user_message_is_one_json_line() -> None:
    prompt = "line one\nline two\u2028 \"quoted\" ünïcode"
    data = user_message(prompt)
    assert data.endswith(b"\n") and data.count(b"\n") == 1
    assert json.loads(data) == {"type": "user", "message": {"role": "user", "content": prompt}}


def test_interrupt_request_line() -> None:
    data = interrupt_request("req_7")
    assert data.count(b"\n") == 1
    assert json.loads(data) == {"type": "control_request", "request_id": "req_7",
                                "request": {"subtype": "interrupt"}}


# --- framing ------------------------------------------------------------------------------


def test_framer_joins_lines_split_across_reads() -> None:
    framer = LineFramer()
    assert framer.feed(b'{"a":') == []
    assert framer.feed(b"1}\n{") == [b'{"a":1}']
    assert framer.feed(b'"b":2}\n\n{"c"') == [b'{"b":2}', b""]
    assert framer.feed(b":3}\n") == [b'{"c":3}']
    assert framer.flush() is None


def test_framer_byte_at_a_time_and_tail() -> None:
    framer = LineFramer()
    lines: list[bytes] = []
    for byte in b"ab\ncd\nef":
        lines += framer.feed(bytes([byte]))
    assert lines == [b"ab", b"cd"]
    assert framer.pending_bytes == 2
    assert framer.flush() == b"ef"


def test_framer_splits_only_on_newline() -> None:
    framer = LineFramer()
    # \r, \u2028 (in UTF-8) and form feeds are content, not line ends.
    data = 'x\ry\u2028z\x0cw\n'.encode()
    assert framer.feed(data) == [data[:-1]]


def test_framer_handles_a_5mb_line_in_small_reads() -> None:
    text = "y" * (5 * 1024 * 1024)
    line = json.dumps({"type": "assistant", "message": {"content": [
        {"type": "text", "text": text}]}}).encode() + b"\n"
    framer = LineFramer()
    out: list[bytes] = []
    for i in range(0, len(line), 4096):
        out += framer.feed(line[i:i + 4096])
    assert len(out) == 1
    events = parse_line("developer", out[0])
    assert events == [AssistantText(role="developer", text=text)]


def test_framer_drops_a_line_over_its_limit_and_goes_on() -> None:
    framer = LineFramer(limit=10)
    assert framer.feed(b"short\n" + b"x" * 8) == [b"short"]
    assert framer.feed(b"y" * 8) == [] and framer.pending_bytes == 0
    lines = framer.feed(b"z" * 1000 + b"\nnext\n")
    assert lines[0] == b"(Anima dropped a line of 1,016 bytes here: over its limit of 10)"
    assert lines[1:] == [b"next"]
    assert framer.feed(b"w" * 11) == [] and framer.flush() is not None


# --- parsing ------------------------------------------------------------------------------


def _line(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def test_init_maps_to_session_started() -> None:
    events = parse_line("developer", _line({
        "type": "system", "subtype": "init", "session_id": "S", "model": "claude-x",
        "tools": ["Bash", "Read"], "cwd": "/p"}))
    assert events == [SessionStarted(role="developer", session_id="S", model="claude-x",
                                     tools=("Bash", "Read"))]


def test_assistant_blocks_map_in_order() -> None:
    events = parse_line("acceptor", _line({"type": "assistant", "message": {"content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"},
        {"type": "text", "text": "Looking"},
        {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "git show"}},
    ]}}))
    assert events == [
        Thinking(role="acceptor", text="hmm"),
        AssistantText(role="acceptor", text="Looking"),
        ToolUse(role="acceptor", tool="Bash", tool_use_id="tu1", input={"command": "git show"}),
    ]


def test_tool_results_string_and_block_content() -> None:
    events = parse_line("developer", _line({"type": "user", "message": {"content": [
        {"type": "tool_result", "tool_use_id": "a", "content": "plain", "is_error": False},
        {"type": "tool_result", "tool_use_id": "b", "is_error": True, "content": [
            {"type": "text", "text": "one"}, {"type": "text", "text": "two"},
            {"type": "image", "source": {}}]},
    ]}}))
    assert events == [
        ToolResult(role="developer", tool_use_id="a", content="plain", is_error=False),
        ToolResult(role="developer", tool_use_id="b", content="one\ntwo\n[image]", is_error=True),
    ]


def test_user_text_echo_is_not_a_tool_result() -> None:
    line = _line({"type": "user", "message": {"content": [
        {"type": "text", "text": "[Request interrupted by user]"}]}})
    assert parse_line("developer", line) == []


def test_result_maps_every_field() -> None:
    events = parse_line("developer", _line({
        "type": "result", "subtype": "success", "is_error": False, "result": "done",
        "session_id": "S", "total_cost_usd": 0.25, "usage": {"input_tokens": 3},
        "duration_ms": 1234, "num_turns": 4}))
    assert events == [TurnResult(role="developer", text="done", is_error=False, session_id="S",
                                 subtype="success", cost_usd=0.25,
                                 usage={"input_tokens": 3}, duration_ms=1234, num_turns=4)]


def test_result_states_the_turns_spend_when_the_cli_does() -> None:
    # 2.1.330: the total carries on across --resume; the spend since the last result is given.
    (event,) = parse_line("developer", _line({
        "type": "result", "subtype": "success", "is_error": False, "result": "done",
        "session_id": "S", "total_cost_usd": 0.3,
        "model_usage_since_last_result": {"claude-x": {"costUSD": 0.02},
                                          "claude-haiku": {"costUSD": 0.005}}}))
    assert isinstance(event, TurnResult)
    assert event.cost_usd == 0.3 and event.turn_cost_usd == pytest.approx(0.025)


def test_refused_calls_are_redacted_before_they_are_described() -> None:
    """A description keeps one value and cuts it at 160 characters: cut between `deploy:` and
    `@`, or without its `password` key, a secret no longer looks like one."""
    pw, head = "Hunter2SecretPassw0rdXYZ", "git push https://deploy:"
    push = f"cd {'a' * (159 - len(head) - len(pw) - 7)} && {head}{pw}@github.com/acme/app.git"
    (event,) = parse_line("developer", _line({
        "type": "result", "subtype": "success", "result": "done", "permission_denials": [
            {"tool_name": "Bash", "tool_input": {"command": push}},
            {"tool_name": "mcp__db__connect",
             "tool_input": {"password": "Hunter2Secret9", "host": "db"}}]}))
    assert isinstance(event, TurnResult)
    assert event.permission_denials[0].startswith("Bash: cd aaa")
    assert event.permission_denials[1] == f"mcp__db__connect: {REDACTED}"
    assert pw not in str(event.permission_denials) and "Hunter2" not in event.permission_denials[1]


def test_interrupted_result_without_result_text() -> None:
    # Real CLI 2.1.x: an interrupted turn has no "result" key, only "errors".
    (event,) = parse_line("developer", _line({
        "type": "result", "subtype": "error_during_execution", "is_error": True,
        "session_id": "S", "total_cost_usd": 0, "errors": ["aborted"], "num_turns": 2}))
    assert isinstance(event, TurnResult)
    assert event.subtype == "error_during_execution" and event.is_error
    assert event.text == "aborted"


def test_non_json_line_is_raw_output_without_ansi_or_cr() -> None:
    events = parse_line("developer", b"\x1b[31mError:\x1b[0m something broke\r")
    assert events == [RawOutput(role="developer", text="Error: something broke")]


def test_broken_json_and_json_non_objects_are_raw() -> None:
    assert parse_line("developer", b'{"type": "assistant", ') == [
        RawOutput(role="developer", text='{"type": "assistant",')]
    assert parse_line("developer", b"[1, 2]") == [RawOutput(role="developer", text="[1, 2]")]


def test_control_and_unknown_lines_are_ignored() -> None:
    assert parse_line("developer", _line({"type": "control_response", "response": {
        "subtype": "success", "request_id": "r"}})) == []
    assert parse_line("developer", _line({"type": "system", "subtype": "status"})) == []
    assert parse_line("developer", b"   \r") == []
    assert parse_line("developer", b'{"type": "stream_event"}') == []


def test_the_context_in_use_is_the_last_main_call_and_the_window_the_result_names() -> None:
    meter = ContextMeter()

    def assistant(model: str, usage: dict[str, int], parent: str | None = None) -> str:
        return json.dumps({"type": "assistant", "parent_tool_use_id": parent, "message": {
            "model": model, "content": [], "usage": usage}})

    parse_line("developer", assistant("claude-opus-4-8", {"input_tokens": 5,
               "cache_read_input_tokens": 40_000, "cache_creation_input_tokens": 2_000,
               "output_tokens": 900}), meter)
    # A sub-agent's call is another conversation: it does not move the figure.
    parse_line("developer", assistant("claude-haiku-4-5", {"input_tokens": 999_999},
                                      parent="toolu_1"), meter)
    result = json.dumps({"type": "result", "subtype": "success", "session_id": "s1",
                         "result": "ok", "modelUsage": {
                             "claude-opus-4-8[1m]": {"contextWindow": 1_000_000},
                             "claude-haiku-4-5": {"contextWindow": 200_000}}})
    usage, turn = parse_line("developer", result, meter)
    assert isinstance(turn, TurnResult)
    assert usage == ContextUsage(role="developer", session_id="s1", tokens=42_005,
                                 window=1_000_000)
    assert usage.percent == pytest.approx(4.2005)
    # No modelUsage (an older CLI): a 200k window; no assistant line yet: no figure.
    assert parse_line("acceptor", '{"type":"result","result":"x"}', ContextMeter()) == \
        [TurnResult(role="acceptor", text="x", is_error=False, session_id="")]
    boundary = ('{"type":"system","subtype":"compact_boundary","compact_metadata":'
                '{"trigger":"auto","pre_tokens":170000}}')
    assert parse_line("developer", boundary) == [Compacted(role="developer", trigger="auto",
                                                           pre_tokens=170_000)]
