"""A scripted stand-in for `claude -p --input-format stream-json --output-format stream-json`.

It speaks the same wire format as the real CLI (checked against 2.1.x: a `system/init` line per
turn, `assistant` / `user` lines, one `result` per turn, `control_request` interrupts answered
with a `control_response` then an `error_during_execution` result) and is driven by a JSON
script so tests decide every reply. Standard library only: the suite starts it thousands of
times (through `fake_claude.py`).

Environment:
  FAKE_CLAUDE_SCRIPT  JSON file {"developer": [turn…], "acceptor": [turn…],
                      "developer_default": turn, "acceptor_default": turn, "lose_sessions": bool,
                      "cost_style": "2.1.197" | "2.1.330",
                      "milestones": {id: {the keys above, for that milestone's agents only
                                          (its own turn counters), and "feature_dir"}}}
A milestone's agents are told apart by their working directory (.anima/worktrees/<id>).
A turn's `cost_usd` is what it spends; `total_cost_usd` is cumulative per process like the real
CLI's: from 0 in each process (2.1.197, also after --resume), or carried on from the session's
earlier processes with `model_usage_since_last_result` added (2.1.330).
  FAKE_CLAUDE_STATE   directory for turn counters and known sessions (survives restarts)
  FAKE_CLAUDE_LOG     JSONL file, one entry per received prompt
See tests/conftest.py (FakeClaude) and the turn keys in `run_turn`.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from fake_claude import VERSION

#: Lines the real CLIs printed (tests/fixtures/cli_lines/<case>-<version>.jsonl), replayed
#: by a turn's `replay` key so error turns have the real field shapes of each version.
CLI_LINES = Path(__file__).resolve().parent.parent / "fixtures" / "cli_lines"
TOOLS = ["Task", "Bash", "Edit", "Glob", "Grep", "Read", "Write"]
FEATURE_RE = re.compile(r"^\s*-?\s*\[( |/|!)\]\s+(F\d+)\b", re.MULTILINE)
ROUND_RE = re.compile(r"\bround:?\s*(\d+)", re.IGNORECASE)
MERGE_RE = re.compile(r"This round is a \*\*merge round\*\*\. `([^`]+)`")
BASE_RE = re.compile(r"Base commit:\s*`?([0-9a-fA-F]{7,40})")
RULE_RE = re.compile(r"(\w+)(?:\(([^)]*)\))?")
COMMAND_SEP_RE = re.compile(r"&&|\|\||[;|\n]")

_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, separators=(",", ":")) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def emit_raw(text: str) -> None:
    with _out_lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def process_started() -> float | None:
    """Wall-clock time this process was created (from /proc, to ~10 ms), so a benchmark can
    tell the agent's own start-up from the time Anima took to start it."""
    try:
        stat = Path("/proc/self/stat").read_text()
        ticks = int(stat[stat.rfind(")") + 2:].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


STARTED = process_started()
#: The milestone whose agent this is: its worktree's name ("" elsewhere).
MILESTONE = Path.cwd().name if Path.cwd().parent.name == "worktrees" else ""


class Args:
    """The subset of the real CLI's flags Anima passes."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.session_id = ""
        self.resume = False
        self.system_prompt = ""
        self.permission_mode = "default"
        self.model = "claude-fake-1"
        self.version = False
        self.denied_bash: list[str] = []  # command prefixes of `Bash(prefix:*)` rules
        with_value = {"--session-id", "--resume", "--append-system-prompt", "--permission-mode",
                      "--model", "--input-format", "--output-format", "--allowedTools",
                      "--disallowedTools", "--system-prompt", "--max-turns"}
        i = 0
        while i < len(argv):
            arg = argv[i]
            value = argv[i + 1] if arg in with_value and i + 1 < len(argv) else None
            if arg in ("--version", "-v"):
                self.version = True
            elif arg == "--session-id":
                self.session_id = value or ""
            elif arg == "--resume":
                self.session_id, self.resume = value or "", True
            elif arg == "--append-system-prompt":
                self.system_prompt = value or ""
            elif arg == "--permission-mode":
                self.permission_mode = value or "default"
            elif arg == "--model":
                self.model = value or self.model
            elif arg == "--disallowedTools":
                self.denied_bash += [rule.removesuffix(":*").strip()
                                     for tool, rule in RULE_RE.findall(value or "")
                                     if tool == "Bash" and rule]
            i += 2 if value is not None else 1
        if not self.session_id:
            self.session_id = str(uuid.uuid4())

    @property
    def role(self) -> str:
        """"You are the X agent" decides; else whichever role is named first (prompts may
        mention the other role too)."""
        prompt = self.system_prompt
        for name in ("Developer", "Acceptor"):
            if f"You are the {name} agent" in prompt:
                return name.lower()
        found = [(prompt.find(f"{n} agent"), n.lower()) for n in ("Developer", "Acceptor")]
        found = [f for f in found if f[0] >= 0]
        return min(found)[1] if found else "unknown"


class State:
    """Turn counters per role and the sessions that finished a turn, kept on disk."""

    def __init__(self, directory: str | None) -> None:
        self.dir = Path(directory) if directory else None
        self.mem: dict[str, int] = {}
        if self.dir:
            self.dir.mkdir(parents=True, exist_ok=True)

    def next_turn(self, role: str) -> int:
        if self.dir is None:
            n = self.mem.get(role, 0)
            self.mem[role] = n + 1
            return n
        path = self.dir / f"{role}.count"
        with open(self.dir / "lock", "a") as lock:  # agents of several milestones at once
            fcntl.flock(lock, fcntl.LOCK_EX)
            n = int(path.read_text()) if path.exists() else 0
            path.write_text(str(n + 1))
        return n

    def knows(self, session_id: str) -> bool:
        return self.dir is None or (self.dir / f"session-{session_id}").exists()

    def remember(self, session_id: str) -> None:
        if self.dir is not None:
            (self.dir / f"session-{session_id}").write_text("1")


class Cost:
    """The process's running `total_cost_usd`, as the chosen CLI version keeps it."""

    def __init__(self, args: Args, state: State, style: str) -> None:
        self.state, self.session, self.style = state, args.session_id, style
        self.total = 0.0
        if style == "2.1.330" and args.resume and state.dir is not None:
            carried = state.dir / f"cost-{self.session}"
            self.total = float(carried.read_text()) if carried.exists() else 0.0

    def spend(self, amount: float, model: str) -> dict[str, Any]:
        """The result's cost fields after spending `amount` in this turn."""
        self.total += amount
        if self.state.dir is not None:
            (self.state.dir / f"cost-{self.session}").write_text(repr(self.total))
        fields: dict[str, Any] = {"total_cost_usd": round(self.total, 10)}
        if self.style == "2.1.330":
            fields["model_usage_since_last_result"] = {model: {
                "inputTokens": 100, "outputTokens": 50, "costUSD": amount}}
        return fields


class Interrupted(Exception):
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


class Input:
    """Reads stdin on a thread: control requests are seen while a turn is busy."""

    def __init__(self) -> None:
        self.turns: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.interrupts: queue.Queue[str] = queue.Queue()
        self.pending = 0  # turns received and not finished: an interrupt then aborts one
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for raw in sys.stdin.buffer:
            try:
                msg = json.loads(raw)
            except ValueError:
                continue
            if msg.get("type") == "control_request":
                request_id = str(msg.get("request_id", ""))
                with self.lock:
                    busy = self.pending > 0
                if (msg.get("request") or {}).get("subtype") == "interrupt" and busy:
                    self.interrupts.put(request_id)
                else:
                    emit({"type": "control_response",
                          "response": {"subtype": "success", "request_id": request_id}})
            elif msg.get("type") == "user":
                with self.lock:
                    self.pending += 1
                self.turns.put(msg)
        self.turns.put(None)

    def finish_turn(self) -> None:
        """Answer interrupts that came too late to abort anything, like the real CLI."""
        with self.lock:
            self.pending -= 1
            idle = self.pending == 0
        while idle:
            try:
                request_id = self.interrupts.get_nowait()
            except queue.Empty:
                return
            emit({"type": "control_response",
                  "response": {"subtype": "success", "request_id": request_id}})

    def wait(self, seconds: float | None, interruptible: bool = True) -> None:
        """Sleep (forever if None), unless an interrupt arrives first."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            try:
                request_id = self.interrupts.get(timeout=left if left is not None else 3600)
            except queue.Empty:
                continue
            if interruptible:
                raise Interrupted(request_id)


def _read_all(fh: IO[bytes]) -> str:
    fh.seek(0)
    return fh.read().decode(errors="replace")


def prompt_text(msg: dict[str, Any]) -> str:
    content = (msg.get("message") or {}).get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))


def git(cwd: str, *args: str) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else ""


class Turn:
    """Emits one turn's stream-json and gathers what the reply text needs."""

    def __init__(self, args: Args, index: int, prompt: str, cost: Cost) -> None:
        self.args = args
        self.cost = cost
        self.index = index
        self.prompt = prompt
        self.cwd = os.getcwd()
        self.session = args.session_id
        self.num_turns = 1
        self.denials: list[dict[str, Any]] = []
        self.context_tokens = 10  # what each assistant line reports as input + cache tokens
        self.context_window = 200_000
        match = FEATURE_RE.search(prompt)
        self.feature = match.group(2) if match else ""
        self.feature_dir = "features"
        self.signature = ""

    def assistant(self, blocks: list[dict[str, Any]]) -> None:
        emit({"type": "assistant", "message": {
            "id": f"msg_{uuid.uuid4().hex[:24]}", "type": "message", "role": "assistant",
            "model": self.args.model, "content": blocks, "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 5,
                      "cache_read_input_tokens": max(0, self.context_tokens - 10),
                      "cache_creation_input_tokens": 0}},
            "parent_tool_use_id": None, "session_id": self.session, "uuid": str(uuid.uuid4())})

    def tool(self, name: str, tool_input: dict[str, Any], output: str, is_error: bool) -> None:
        tool_id = f"toolu_{uuid.uuid4().hex[:20]}"
        self.assistant([{"type": "tool_use", "id": tool_id, "name": name, "input": tool_input}])
        emit({"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tool_id, "content": output,
             "is_error": is_error}]},
            "parent_tool_use_id": None, "session_id": self.session, "uuid": str(uuid.uuid4())})
        self.num_turns += 1

    def denied(self, command: str) -> bool:
        """Whether a `--disallowedTools "Bash(prefix:*)"` rule refuses `command`: like the
        real CLI, every part of a compound command is checked."""
        parts = [p.strip() for p in COMMAND_SEP_RE.split(command)]
        return any(p == rule or p.startswith(rule + " ") for p in parts
                   for rule in self.args.denied_bash)

    def bash(self, command: str, own_session: bool = False) -> str:
        """Run `command` in a shell; the call returns when the shell exits, even if something
        it sent to the background still holds its output (as the real Bash tool does).
        `own_session`: start the shell in a session of its own, as the real CLI does.
        A command the tool rules refuse is not run; the result lists it in
        `permission_denials`, as the real CLI's does."""
        if self.denied(command):
            tool_input = {"command": command, "description": "run a command"}
            self.tool("Bash", tool_input, f"Permission to use Bash with command {command} has "
                      "been denied.", True)
            self.denials.append({"tool_name": "Bash", "tool_use_id": "toolu_denied",
                                 "tool_input": tool_input})
            return ""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.run(command, shell=True, cwd=self.cwd, stdout=out, stderr=err,
                                  stdin=subprocess.DEVNULL, start_new_session=own_session)
            stdout, stderr = (_read_all(f) for f in (out, err))
        output = (stdout + stderr).strip()
        self.tool("Bash", {"command": command, "description": "run a command"},
                  output if proc.returncode == 0 else f"Exit code {proc.returncode}\n{output}",
                  proc.returncode != 0)
        return stdout.strip()

    def write_file(self, path: str, content: str) -> None:
        """The Write tool: a write the filesystem refuses (the sandbox) is an error result
        the model sees, as the real CLI's, not a crash."""
        target = Path(self.cwd, path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(content, encoding="utf-8")
        except OSError as e:
            self.tool("Write", {"file_path": str(target), "content": content},
                      f"Error writing file: {e}", True)
            return
        self.tool("Write", {"file_path": str(target), "content": content},
                  f"File created successfully at: {target}", False)

    def auto_developer(self) -> str:
        match = ROUND_RE.search(self.prompt)
        round_no = int(match.group(1)) if match else 1
        if MERGE_RE.search(self.prompt):
            return self.auto_merge(round_no)
        if not self.feature:
            base = BASE_RE.search(self.prompt)
            log_range = f"{base.group(1)}..HEAD" if base else "-n 20"
            commits = self.bash(f'git log --format="%H %s" {log_range}')
            listing = "\n".join(f"- {line}" for line in commits.splitlines()) or "- (none)"
            return ("## ALL_FEATURES_COMPLETE\n\n### Commits\n" + listing
                    + "\n\n### Summary\nEvery feature of the milestone is implemented.")
        fid = self.feature
        self.write_file(f"{self.feature_dir}/{fid}.txt",
                        f"{fid}\nround {round_no}\nturn {self.index}\n{self.signature}")
        self.bash(f'git add -A && git commit -q -m "feat: {fid}"')
        head = git(self.cwd, "rev-parse", "HEAD")
        return (f"## Implementation Report — Round {round_no}\n\n"
                f"**Feature**: {fid}\n**Commit**: {head}\n**Tests**: 1 passed, 0 failed\n"
                f"**Lint**: clean\n\n### Changes\n- {self.feature_dir}/{fid}.txt: added")

    def auto_merge(self, round_no: int) -> str:
        """A merge round: merge main in, keep both sides of every conflict, commit."""
        main = MERGE_RE.search(self.prompt).group(1)  # type: ignore[union-attr]
        self.bash(f"git merge --no-edit {main} || true")
        conflicted = self.bash("git diff --name-only --diff-filter=U").split()
        for path in conflicted:
            text = (Path(self.cwd) / path).read_text(encoding="utf-8")
            kept = [line for line in text.splitlines(keepends=True)
                    if not line.startswith(("<<<<<<<", "=======", ">>>>>>>"))]
            self.write_file(path, "".join(kept))
        if conflicted:
            self.bash("git add -A && git commit -q --no-edit")
        head = git(self.cwd, "rev-parse", "HEAD")
        return (f"## Implementation Report — Round {round_no}\n\n"
                f"**Feature**: none (merge)\n**Commit**: {head}\n**Tests**: 1 passed, 0 failed\n"
                f"**Lint**: clean\n\n### Changes\n- merged {main}; resolved "
                f"{', '.join(conflicted) or 'nothing'}")

    def fill(self, text: str) -> str:
        """`{head}`, `{head_short}` and `{head~N}` (a commit N below HEAD) in a reply."""
        text = re.sub(r"\{head~(\d+)\}",
                      lambda m: git(self.cwd, "rev-parse", f"HEAD~{m.group(1)}"), text)
        if "{head" in text:
            head = git(self.cwd, "rev-parse", "HEAD")
            text = text.replace("{head_short}", head[:7]).replace("{head}", head)
        return text.replace("{feature}", self.feature)

    def result(self, text: str | None, spec: dict[str, Any], started: float) -> None:
        is_error = spec.get("is_error", False)  # as scripted: a CLI may send "false" as text
        out: dict[str, Any] = {
            "type": "result", "subtype": spec.get("subtype", "success"), "is_error": is_error,
            "duration_ms": int((time.monotonic() - started) * 1000), "duration_api_ms": 1,
            "num_turns": self.num_turns, "session_id": self.session,
            **self.cost.spend(float(spec.get("cost_usd", 0.01)), self.args.model),
            "usage": spec.get("usage", {"input_tokens": 100, "output_tokens": 50}),
            "modelUsage": {self.args.model: {"inputTokens": 100, "outputTokens": 50,
                                             "contextWindow": self.context_window}},
            "uuid": str(uuid.uuid4()), "permission_denials": self.denials,
        }
        if text is not None:
            out["result"] = text
        emit(out)


def _reset_clock(epoch: float) -> str:
    """"9:41pm" as the CLI words a reset time (UTC here)."""
    text = time.strftime("%I:%M%p", time.gmtime(epoch)).lower()
    return text.lstrip("0")


def replay(turn: Turn, spec: dict[str, Any], inp: Input) -> bool:
    """Emit a captured turn's lines up to its `result` (system/init is the fake's own).

    `replay_after` waits that many seconds first (a turn that worked a while before it met
    the limit); `resets_in` moves the reset of a usage limit to that many seconds from then;
    `retry_delay` spaces the `api_retry` lines (seconds). A captured result that is not an
    error is left out, so the turn goes on with its scripted reply. Returns whether a result
    was emitted."""
    lines = (CLI_LINES / f"{spec['replay']}.jsonl").read_text(encoding="utf-8").splitlines()
    if spec.get("replay_after"):
        inp.wait(float(spec["replay_after"]))
    resets = time.time() + float(spec["resets_in"]) if "resets_in" in spec else None
    for raw in lines:
        obj = json.loads(raw)
        kind, subtype = obj.get("type"), obj.get("subtype")
        if kind == "system" and subtype == "init":
            continue
        if "session_id" in obj:
            obj["session_id"] = turn.session
        if kind == "system" and subtype == "api_retry" and spec.get("retry_delay"):
            inp.wait(float(spec["retry_delay"]))
        if kind == "rate_limit_event" and resets is not None:
            info = obj["rate_limit_info"]
            info["resetsAt"] = math.ceil(resets)
            for window in (info.get("unifiedWindows") or {}).values():
                window["resetsAt"] = math.ceil(resets)
        if kind == "result":
            if not obj.get("is_error"):
                return False
            if resets is not None and isinstance(obj.get("result"), str):
                obj["result"] = re.sub(r"resets [0-9:]+[ap]m", "resets " + _reset_clock(resets),
                                       obj["result"])
            obj.pop("model_usage_since_last_result", None)
            obj.update(turn.cost.spend(0.0, turn.args.model))  # this process's running total
            emit(obj)
            return True
        emit(obj)
    return False


def run_turn(args: Args, spec: dict[str, Any], index: int, prompt: str, inp: Input,
             cost: Cost, own: dict[str, Any] | None = None) -> None:
    """Turn keys: noise, crash, delay, hang, ignore_interrupt, ignore_sigterm, shell (with
    own_session: each command in a session of its own, like the real CLI's Bash), think
    (seconds before edit_file), edit_file,
    hang_after, auto, say (chatter before the reply), huge_line_bytes, text, is_error, subtype,
    cost_usd, interrupted_cost_usd (what an interrupted turn spent), usage, stderr,
    context_tokens (input + cache tokens each assistant line reports), context_window, compact
    ({pre_tokens, post_tokens}: a compact_boundary line first, as when the CLI compacts by
    itself), replay (with replay_after, resets_in, retry_delay), late_interrupted_result."""
    started = time.monotonic()
    if spec.get("ignore_sigterm"):  # a wedged agent: only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    turn = Turn(args, index, prompt, cost)
    if own:  # a milestone with a script of its own: its files, signed
        turn.feature_dir = own.get("feature_dir", turn.feature_dir)
        turn.signature = f"by {MILESTONE}\n"
    turn.context_tokens = int(spec.get("context_tokens", turn.context_tokens))
    turn.context_window = int(spec.get("context_window", turn.context_window))
    emit({"type": "system", "subtype": "init", "cwd": turn.cwd, "session_id": args.session_id,
          "tools": TOOLS, "mcp_servers": [], "model": args.model,
          "permissionMode": args.permission_mode, "apiKeySource": "none",
          "claude_code_version": VERSION.split()[0], "uuid": str(uuid.uuid4())})
    for line in spec.get("noise", []):
        emit_raw(str(line))
    for line in spec.get("stderr", []):
        sys.stderr.write(str(line) + "\n")
        sys.stderr.flush()
    if "crash" in spec:
        sys.stderr.write("Traceback (most recent call last):\n  File \"fake_claude.py\", "
                         "line 1, in run_turn\nRuntimeError: fake claude crashed on purpose\n")
        sys.stderr.flush()
        os._exit(int(spec["crash"]))
    interruptible = not spec.get("ignore_interrupt", False)
    try:
        if spec.get("replay") and replay(turn, spec, inp):
            return
        if spec.get("delay"):
            inp.wait(float(spec["delay"]), interruptible)
        if spec.get("hang"):
            inp.wait(None, interruptible)
    except Interrupted as e:
        emit({"type": "control_response",
              "response": {"subtype": "success", "request_id": e.request_id}})
        emit({"type": "user", "message": {"role": "user", "content": [
            {"type": "text", "text": "[Request interrupted by user]"}]},
            "parent_tool_use_id": None, "session_id": args.session_id})
        turn.num_turns += 1
        out = {"type": "result", "subtype": "error_during_execution", "is_error": True,
               "duration_ms": int((time.monotonic() - started) * 1000), "duration_api_ms": 0,
               "num_turns": turn.num_turns, "session_id": args.session_id,
               # What the model calls before the interrupt spent (the real CLI counts them).
               **cost.spend(float(spec.get("interrupted_cost_usd", 0.0)), args.model),
               "usage": {"input_tokens": 0, "output_tokens": 0},
               "terminal_reason": "aborted_streaming", "errors": ["interrupted"]}
        emit(out)
        return
    if spec.get("compact"):
        emit({"type": "system", "subtype": "compact_boundary", "session_id": args.session_id,
              "compact_metadata": {"trigger": "auto", **spec["compact"]},
              "uuid": str(uuid.uuid4())})
    for command in spec.get("shell", []):
        turn.bash(command, own_session=bool(spec.get("own_session")))
    if spec.get("think"):  # the model's next step takes a while (no process runs meanwhile)
        time.sleep(float(spec["think"]))
    if spec.get("edit_file"):
        edit = spec["edit_file"]
        turn.write_file(edit["path"], edit.get("content", ""))
    if spec.get("hang_after"):  # did its damage; now waits for a kill
        inp.wait(None, interruptible=False)
    reply = ""
    if spec.get("auto"):
        reply = turn.auto_developer() if args.role == "developer" else "ACCEPTED"
    if "text" in spec:
        reply = turn.fill(str(spec["text"]))
    if spec.get("say"):  # chatter before the reply (a secret it read, say)
        reply = f"{spec['say']}\n\n{reply}"
    if spec.get("huge_line_bytes"):
        size = int(spec["huge_line_bytes"])
        turn.assistant([{"type": "text", "text": "x" * size}])
    if reply:
        turn.assistant([{"type": "text", "text": reply}])
    turn.result(reply, spec, started)
    if spec.get("late_interrupted_result") is not None:
        # An interrupt that raced the end of the turn: its result comes after this one.
        threading.Timer(float(spec["late_interrupted_result"]), emit, [{
            "type": "result", "subtype": "error_during_execution", "is_error": True,
            "duration_ms": 1, "num_turns": 1, "session_id": args.session_id,
            **cost.spend(0.0, args.model), "usage": {"input_tokens": 0, "output_tokens": 0},
            "terminal_reason": "aborted_streaming", "errors": ["interrupted"]}]).start()


def main() -> int:
    args = Args(sys.argv[1:])
    if args.version:
        print(VERSION)
        return 0
    script_path = os.environ.get("FAKE_CLAUDE_SCRIPT")
    script: dict[str, Any] = {}
    if script_path and Path(script_path).exists():
        script = json.loads(Path(script_path).read_text(encoding="utf-8"))
    state = State(os.environ.get("FAKE_CLAUDE_STATE"))
    log_path = os.environ.get("FAKE_CLAUDE_LOG")
    lost = args.resume and bool(script.get("lose_sessions")) and not state.knows(args.session_id)
    inp = Input()
    cost = Cost(args, state, str(script.get("cost_style", "2.1.197")))
    while True:
        msg = inp.turns.get()
        if msg is None:  # stdin closed: the CLI writes its session file, then exits
            time.sleep(float(script.get("exit_delay", 0)))
            return 0
        prompt = prompt_text(msg)
        role = args.role
        index = -1 if lost or script.get("milestones", {}).get(MILESTONE) else \
            state.next_turn(role)
        if log_path:
            entry = {"role": role, "session_id": args.session_id, "resume": args.resume,
                     "prompt": prompt, "argv": sys.argv[1:], "pid": os.getpid(), "turn": index,
                     "cwd": os.getcwd(), "time": time.time(), "started": STARTED}
            with open(log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(entry) + "\n")
        if lost:
            # What the real CLI does for a session file it never wrote: no model call, an
            # error result, exit 1.
            sys.stderr.write(f"No conversation found with session ID: {args.session_id}\n")
            sys.stderr.flush()
            Turn(args, index, prompt, cost).result(None, {"is_error": True, "cost_usd": 0,
                                                    "subtype": "error_during_execution"},
                                             time.monotonic())
            return 1
        own = script.get("milestones", {}).get(MILESTONE, {})
        if own and not lost:
            index = state.next_turn(f"{MILESTONE}-{role}")
        turns = own.get(role, script.get(role, []) if not own else [])
        spec = turns[index] if index < len(turns) else own.get(
            f"{role}_default", script.get(f"{role}_default", {"auto": True}))
        try:
            run_turn(args, spec, index, prompt, inp, cost, own)
        finally:
            inp.finish_turn()
        state.remember(args.session_id)


def run() -> None:
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the daemon stdin reader holds stdin's lock and would stall shutdown.
    os._exit(code)
