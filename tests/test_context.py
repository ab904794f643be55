"""The prompt budget: token estimate, trimming order and marker, and the file cache."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from anima.text.context import (
    ApiTokenCounter,
    FileCache,
    Section,
    estimate_tokens,
    fit_to_budget,
    trim_marker,
)
from tests.fakes.api_stub import ApiStub

MARKER_START = "[… trimmed to fit the context budget:"


def body(title: str, lines: int, width: int = 79) -> str:
    return f"## {title}\n" + "".join(f"{title} line {i:04d} " + "x" * (width - 20) + "\n"
                                     for i in range(lines))


def total(sections: list[Section]) -> int:
    return sum(estimate_tokens(s.text) for s in sections)


# --- estimate --------------------------------------------------------------------------------

def test_estimate_ascii_is_about_four_chars_a_token() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("x" * 4000) == 1000


def test_estimate_counts_cjk_characters_about_one_token_each() -> None:
    assert estimate_tokens("上下文工程方案") == 7
    assert estimate_tokens("验收标准：ok!") == 5 + 1  # 5 CJK (incl. the full-width colon) + "ok!"
    assert estimate_tokens("こんにちは") == 5 and estimate_tokens("안녕하세요") == 5
    mixed = "功能" * 100 + "a" * 400
    assert estimate_tokens(mixed) == 200 + 100


def test_estimate_is_cheap() -> None:
    text = ("def f(x):\n    return x  # 注释\n" * 3000)
    start = time.perf_counter()
    for _ in range(20):
        estimate_tokens(text)
    assert time.perf_counter() - start < 1.0  # ~100 KB prompt: well under a ms each


# --- fit_to_budget ---------------------------------------------------------------------------

def sections() -> list[Section]:
    return [
        Section("soul", body("Soul", 10), None),
        Section("vision", body("Vision", 40), 2),
        Section("memory", body("Memory", 40), 1),
        Section("history", body("History", 40), 3),
        Section("checklist", body("Checklist", 5), None),
        Section("task", body("Task", 5), None),
    ]


def test_under_budget_is_untouched() -> None:
    parts = sections()
    assert fit_to_budget(parts, total(parts)) == parts
    assert fit_to_budget(parts, 10**6) == parts


def test_over_budget_trims_lowest_cut_order_first_and_keeps_order() -> None:
    parts = sections()
    budget = total(parts) - 300  # less than one section's worth
    out = fit_to_budget(parts, budget)
    assert [s.key for s in out] == [s.key for s in parts]
    assert total(out) <= budget
    by_key = {s.key: s for s in out}
    memory = by_key["memory"].text
    assert memory.startswith("## Memory\nMemory line 0000")  # heading and beginning kept
    assert memory.rstrip("\n").splitlines()[-1].startswith(MARKER_START)
    omitted = len(parts[2].text) - len(memory.split(MARKER_START)[0])
    assert trim_marker(omitted) in memory
    for key in ("soul", "vision", "history", "checklist", "task"):
        assert by_key[key] == next(s for s in parts if s.key == key)
    # close to the budget, not far below it: only what was needed went
    assert total(out) > budget - 30


def test_trimming_cascades_to_the_next_cut_order() -> None:
    parts = sections()
    memory_tokens = estimate_tokens(parts[2].text)
    budget = total(parts) - memory_tokens - 200
    out = {s.key: s for s in fit_to_budget(parts, budget)}
    assert out["memory"].text.startswith("## Memory\n")
    assert out["memory"].text.count("\n") == 2  # heading + marker only
    assert MARKER_START in out["vision"].text
    assert out["history"] == parts[3]
    assert total(list(out.values())) <= budget


def test_soul_is_never_cut_even_when_it_alone_exceeds_the_budget() -> None:
    soul = Section("soul", body("Soul", 500), None)
    task = Section("task", body("Task", 5), None)
    memory = Section("memory", body("Memory", 50), 1)
    out = fit_to_budget([soul, memory, task], estimate_tokens(soul.text) // 2)
    assert out[0] == soul and out[2] == task
    assert out[1].text.startswith("## Memory\n") and MARKER_START in out[1].text


def test_cut_at_a_line_boundary_and_marker_on_its_own_line() -> None:
    section = Section("history", body("History", 100), 1)
    out = fit_to_budget([section], estimate_tokens(section.text) // 2)[0]
    kept, marker = out.text.rstrip("\n").rsplit("\n", 1)
    assert marker.startswith(MARKER_START) and marker.endswith("characters omitted …]")
    assert section.text.startswith(kept + "\n")  # whole lines only
    assert out.text.endswith("\n")  # like the original


def test_one_line_section_can_still_shrink() -> None:
    section = Section("memory", "## Memory: " + "y" * 20000, 1)
    out = fit_to_budget([section], 200)[0]
    assert estimate_tokens(out.text) <= 200 and MARKER_START in out.text


def test_cjk_sections_are_trimmed_by_their_real_weight() -> None:
    section = Section("milestone", "## 里程碑\n" + "实现上下文预算功能。\n" * 500, 1)
    out = fit_to_budget([section], 1000)[0]
    assert estimate_tokens(out.text) <= 1000
    assert estimate_tokens(out.text) > 900
    assert out.text.startswith("## 里程碑\n实现上下文预算功能。")


def test_fit_is_fast_for_a_large_prompt() -> None:
    parts = [Section(f"s{i}", body(f"S{i}", 300), i) for i in range(8)]
    start = time.perf_counter()
    fit_to_budget(parts, 16000)
    assert time.perf_counter() - start < 0.5  # tens of ms at most per round


# --- FileCache ---------------------------------------------------------------------------

def test_file_cache_rereads_only_on_change(tmp_path: Path) -> None:
    path = tmp_path / "soul.md"
    path.write_text("first", encoding="utf-8")
    cache = FileCache()
    assert cache.read(path) == "first"
    assert cache.read(path) == "first"
    assert cache.reads == 1
    st = path.stat()
    path.write_text("secnd", encoding="utf-8")  # same size …
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # … new mtime
    assert cache.read(path) == "secnd"
    assert cache.reads == 2
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000))  # touched, same text
    assert cache.read(path) == "secnd" and cache.reads == 3
    assert cache.read(path) == "secnd" and cache.reads == 3


def test_file_cache_missing_file_and_reappearing(tmp_path: Path) -> None:
    cache = FileCache()
    path = tmp_path / "memory" / "project.md"
    assert cache.read(path) is None
    path.parent.mkdir()
    path.write_text("notes ✓", encoding="utf-8")
    assert cache.read(path) == "notes ✓"
    path.unlink()
    assert cache.read(path) is None
    assert cache.read(tmp_path) is None  # a directory is not a file


def test_file_cache_reads_nothing_through_a_link_inside_its_folder(tmp_path: Path) -> None:
    """The worktree's memory file, or a folder on its way, linked out of the worktree."""
    tree, elsewhere = tmp_path / "tree", tmp_path / "elsewhere"
    (elsewhere / "memory").mkdir(parents=True)
    (elsewhere / "memory" / "project.md").write_text("not yours", encoding="utf-8")
    (tree / ".anima").mkdir(parents=True)
    memory = tree / ".anima" / "memory" / "project.md"
    cache = FileCache()
    (tree / ".anima" / "memory").symlink_to(elsewhere / "memory")
    assert cache.read(memory) == "not yours"  # without `within`, as for the human's files
    assert cache.read(memory, within=tree) is None
    (tree / ".anima" / "memory").unlink()
    memory.parent.mkdir()
    memory.symlink_to(elsewhere / "memory" / "project.md")
    assert cache.read(memory, within=tree) is None
    memory.unlink()
    memory.write_text("the notes", encoding="utf-8")
    assert cache.read(memory, within=tree) == "the notes"
    linked_tree = tmp_path / "via-link"
    linked_tree.symlink_to(tree)  # a link above the folder is the folder's own business
    assert cache.read(linked_tree / ".anima" / "memory" / "project.md",
                      within=linked_tree) == "the notes"


# --- optional exact counts ---------------------------------------------------------------

def test_api_token_counter_uses_count_tokens_when_a_key_is_there() -> None:
    with ApiStub() as stub:
        counter = ApiTokenCounter("claude-haiku-4-5", env={
            "ANTHROPIC_API_KEY": "sk-ant-test-dummy", "ANTHROPIC_BASE_URL": stub.url})
        try:
            assert counter.available
            count = counter.count("hello " * 100)
            assert isinstance(count, int) and count > 100
        finally:
            counter.close()


def test_api_token_counter_without_key_or_server_returns_none() -> None:
    assert ApiTokenCounter("m", env={}).count("text") is None
    counter = ApiTokenCounter("m", env={"ANTHROPIC_API_KEY": "k",
                                        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
                              timeout_seconds=1)
    try:
        assert counter.count("text") is None
    finally:
        counter.close()


@pytest.mark.parametrize("budget", [1000, 2000, 5000])
def test_result_never_exceeds_budget_when_cuttable_content_suffices(budget: int) -> None:
    parts = sections()
    fixed = sum(estimate_tokens(s.text) for s in parts if s.cut_order is None)
    out = fit_to_budget(parts, budget)
    if fixed + 60 <= budget:
        assert total(out) <= budget
