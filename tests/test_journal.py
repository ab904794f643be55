"""The journal: log lines and transcripts, redacted, replayable after a restart."""

from __future__ import annotations

import json
from pathlib import Path

from anima.events import (
    AssistantText,
    CheckFinished,
    CheckStarted,
    Event,
    EventBus,
    LogLine,
    RawOutput,
    ToolResult,
    ToolUse,
    VerdictReached,
)
from anima.journal import Journal, read_transcript, read_transcript_tail, transcript_files
from anima.paths import ProjectPaths
from anima.text.redact import AgentRedactor

KEY = "sk-ant-api03-" + "Kq3Lm4Np5R" * 6


def test_transcripts_replay_and_secrets_never_reach_them(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    bus = EventBus()
    journal = Journal(paths, bus)
    journal.open("m1")
    redactor = AgentRedactor()  # what an agent process does with each event it reads

    def redact(event: Event, stream: str) -> None:
        for ready in redactor(event, stream):
            bus.publish(ready)

    redact(AssistantText(role="developer", text=f"using {KEY}"), "stdout")
    redact(ToolUse(role="developer", tool="Bash", tool_use_id="t1",
                   input={"command": f"curl -H 'x-api-key: {KEY}' x"}), "stdout")
    redact(ToolResult(role="developer", tool_use_id="t1", content=f"token={KEY}"), "stdout")
    for line in ("-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA7secretbody",
                 "-----END RSA PRIVATE KEY-----", "after the key"):
        redact(RawOutput(role="developer", text=line), "stderr")
    for ready in redactor.release():  # the end of its output
        bus.publish(ready)
    bus.publish(LogLine("m1", f"saw {KEY}"))
    journal.close()
    files = list(tmp_path.rglob("*"))
    text = "".join(p.read_text() for p in files if p.is_file())
    assert KEY not in text and "7secretbody" not in text
    events = read_transcript(paths.transcripts("m1") / "events.jsonl")
    assert [type(e).__name__ for e in events] == ["AssistantText", "ToolUse", "ToolResult",
                                                  "RawOutput", "RawOutput", "RawOutput",
                                                  "RawOutput"]
    assert events[0] == AssistantText(role="developer", text="using <REDACTED>")
    assert events[-1].text == "after the key"
    log = paths.log("m1").read_text()
    assert log.startswith("[") and "] saw <REDACTED>" in log


def test_verdicts_and_checks_replay_between_the_agents_events_as_published(
        tmp_path: Path) -> None:
    """The panes show them live between the agents' lines; a restart replays them there
    too, equal to the live ones (a page drops what it holds twice by equality)."""
    paths = ProjectPaths(tmp_path)
    bus = EventBus()
    journal = Journal(paths, bus)
    journal.open("m1")
    published = [
        AssistantText(role="developer", text="committed", milestone_id="m1"),
        CheckStarted("m1", 1, "pytest -q", 1700000000.5, 600.0),
        CheckFinished("m1", 1, "pytest -q", False, "exited 1 after 0.4 s", "1 failed"),
        VerdictReached("m1", 1, "feature", False, "checks failed"),
        AssistantText(role="developer", text="fixing", milestone_id="m1"),
    ]
    for event in [*published, VerdictReached("m2", 1, "feature", True)]:
        bus.publish(event)
    journal.close()
    folder = paths.transcripts("m1")
    assert read_transcript_tail(folder, 100_000) == published
    # events.jsonl stays the agents' raw events (README: users' scripts read it so).
    assert {json.loads(line)["type"] for line in (folder / "events.jsonl").read_text(
        ).splitlines()} == {"AssistantText"}


def test_a_torn_last_line_is_skipped_on_replay(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 1, "type": "AssistantText", "role": "acceptor", "text": "ok"}\n'
                    '{"t": 2, "type": "AssistantText", "ro')
    assert read_transcript(path) == [AssistantText(role="acceptor", text="ok")]


def test_a_transcript_is_capped_and_the_oldest_part_rotated_out(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    bus = EventBus()
    journal = Journal(paths, bus)
    journal.open("m1", max_bytes=20_000)
    for i in range(1000):  # ~110 KB of events
        bus.publish(AssistantText(role="developer", text=f"line {i:04d} " + "x" * 40))
    journal.close()
    folder = paths.transcripts("m1")
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert set(sizes) == {"events.jsonl", "events.1.jsonl"}
    assert sum(sizes.values()) <= 20_000
    events = [e for p in transcript_files(folder) for e in read_transcript(p)]
    texts = [e.text for e in events if isinstance(e, AssistantText)]
    assert texts[-1].startswith("line 0999")  # the newest is always kept, in order
    assert not any(t.startswith("line 0000") for t in texts)  # the oldest rotated out
    numbers = [int(t.split()[1]) for t in texts]
    assert numbers == list(range(numbers[0], 1000)) and len(numbers) > 80  # half the cap, at least


def test_a_restart_replays_only_the_newest_part_of_a_long_transcript(tmp_path: Path) -> None:
    paths = ProjectPaths(tmp_path)
    bus = EventBus()
    journal = Journal(paths, bus)
    journal.open("m1", max_bytes=200_000)
    for i in range(3000):  # ~200 KB: both files in use
        bus.publish(AssistantText(role="developer", text=f"line {i:04d} " + "x" * 40))
    journal.close()
    events = read_transcript_tail(paths.transcripts("m1"), 120_000)
    numbers = [int(e.text.split()[1]) for e in events if isinstance(e, AssistantText)]
    assert numbers == list(range(numbers[0], 3000))  # whole lines, in order, up to the newest
    assert 800 < len(numbers) < 1000  # ~120 KB of ~130-byte lines…
    assert (paths.transcripts("m1") / "events.jsonl").stat().st_size < 100_000  # …of both files
