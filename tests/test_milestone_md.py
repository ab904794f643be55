"""The milestone Markdown parser, on real-world files (the M4 seed) and on malformed ones."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from anima.config import Config
from anima.errors import MilestoneError
from anima.store.definitions import FeatureDef, MilestoneDef
from anima.store.milestone_md import load_milestone, parse_milestone
from anima.store.models import State
from anima.store.names import MILESTONE_ID_RE, validate_milestone_id

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).parent.parent / ".anima.example"

MINIMAL = "# T\n\n## Features\n\n### One\n\nDo it.\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ English


def test_english_milestone() -> None:
    m = load_milestone(DATA / "english_milestone.md")
    assert m.title == "M2 — Session Store"
    assert m.goal == ("Persist user sessions in SQLite so that a restart no longer logs "
                      "everyone out.")
    assert m.front_matter == {"requires_human_review": True, "owner": "platform team",
                              "priority": 2}
    assert m.requires_human_review is True
    assert [f.id for f in m.features] == ["F1", "F2", "F3"]
    assert [f.title for f in m.features] == ["Session table", "Session repository",
                                             "Expiry sweep"]
    f1, f2, f3 = m.features
    assert f1.criteria == ["the migration runs on an empty database",
                           "the migration is idempotent"]
    assert f2.criteria == ["`put` then `get` returns the same session",
                           "`delete` of a missing id is a no-op"]
    assert f3.criteria == ["expired rows are gone after one sweep."]
    # Fenced `##` / `###` lines are content of F2, and a `####` stays inside F3.
    assert "## not a section\n### not a feature either" in f2.body
    assert f2.body.startswith("A `SessionRepo` class")
    assert f3.body.endswith("A level-4 heading stays inside the feature.")
    assert "Expiry sweep" not in f2.body
    assert m.acceptance_criteria == [
        "Sessions survive a process restart",
        "`pytest` passes and `ruff check` is clean",
        "No plaintext tokens are stored",
    ]
    assert m.constraints == ("- Standard library `sqlite3` only; no ORM.\n"
                             "- Keep every query under 10 ms on 10k rows.")
    # Unknown sections are ignored but kept in the source.
    assert "OAuth" not in m.constraints and "OAuth" in m.source
    assert m.source == (DATA / "english_milestone.md").read_text(encoding="utf-8")


def test_models_are_frozen() -> None:
    m = load_milestone(DATA / "english_milestone.md")
    assert isinstance(m, MilestoneDef) and isinstance(m.features[0], FeatureDef)
    with pytest.raises(ValidationError):
        m.title = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        m.features[0].title = "x"  # type: ignore[misc]


# ------------------------------------------------------------------ the M4 seed

M4_TITLES = [
    "自动触发",
    "Agent 进程管理",
    "Scheduler（调度循环）",
    "Developer Agent Prompt 策略",
    "Acceptor Agent Prompt 策略",
    "迭代监控 UI（Iteration Monitor 页）",
    "超时与失控保护",
    "状态持久化",
    "重启恢复",
]


def test_m4_seed() -> None:
    m = load_milestone(DATA / "m4_iteration_loop.md")
    assert m.title == "M4 — Iteration Loop"
    assert m.goal.startswith("实现 Developer-Acceptor 自动迭代引擎")
    assert m.goal.endswith("直到里程碑完成。")
    assert [f.title for f in m.features] == M4_TITLES
    assert [f.id for f in m.features] == [f"F{i}" for i in range(1, 10)]
    assert len(m.acceptance_criteria) == 13
    assert m.acceptance_criteria[0] == ("应用启动后自动检测并开始处理 pending 里程碑"
                                        "（`auto_start: true`）")
    assert m.acceptance_criteria[-1] == "重启恢复时若存在未提交的脏状态，先清理再继续"
    assert not any(c.startswith("[") for c in m.acceptance_criteria)
    assert m.constraints == ""
    assert m.front_matter == {} and m.requires_human_review is None


def test_m4_fenced_headings_are_content() -> None:
    m = load_milestone(DATA / "m4_iteration_loop.md")
    titles = {f.title for f in m.features}
    assert not any("Implementation Report" in t or "ALL_FEATURES_COMPLETE" in t for t in titles)
    assert not any(t in ("Changes", "Notes", "Commits", "Summary") for t in titles)
    dev = m.features[3]
    assert "## Implementation Report — Round {N}" in dev.body
    assert "## ALL_FEATURES_COMPLETE" in dev.body
    assert "### Summary" in dev.body
    assert dev.body.rstrip().endswith("```")
    sched = m.features[2]
    assert sched.body.startswith("```\nwhile 里程碑未完成:")
    # The last feature stops at `## Acceptance Criteria`.
    assert "Acceptance Criteria" not in m.features[-1].body
    assert m.features[-1].body.endswith("5. 继续 Scheduler 主循环")


def test_m4_code_span_marker_is_not_a_criterion() -> None:
    # F5 mentions "`验收：{...}`" inside a code span: that is prose, not a marker.
    m = load_milestone(DATA / "m4_iteration_loop.md")
    assert "`验收：{...}`" in m.features[4].body
    assert all(f.criteria == [] for f in m.features)


# ------------------------------------------------------------------ Chinese


def test_chinese_headings_and_inline_criteria() -> None:
    m = load_milestone(DATA / "chinese_milestone.md")
    assert m.title == "M3 — 通知中心"
    assert m.goal.startswith("为桌面应用增加通知中心")
    assert [f.title for f in m.features] == ["通知模型", "通知弹窗", "通知列表"]
    f1, f2, f3 = m.features
    assert f1.criteria == ["字段齐全且有类型注解", "可序列化为 JSON 并无损读回"]
    assert f2.criteria == ["里程碑进入 `paused` 时弹出警告级通知", "鼠标悬停时不自动消失"]
    # "整体验收（…）：" in prose is not a marker; the bold list-item label is.
    assert f3.criteria == ["未读数显示在图标角标上"]
    assert len(m.acceptance_criteria) == 3
    assert m.acceptance_criteria[1] == "重启应用后通知历史仍在"
    assert m.constraints == "- 不引入新的第三方依赖\n- 通知历史最多保留 500 条"


@pytest.mark.parametrize(
    ("goal", "features", "acceptance", "constraints"),
    [
        ("目标", "功能", "验收标准", "约束"),
        ("Goal", "Feature list", "Acceptance criteria", "Constraints"),
        ("GOALS", "features", "ACCEPTANCE", "constraint"),
        ("1. Goal", "2. Features:", "3. Acceptance Criteria", "4. Constraints"),
        ("Goal / 目标", "Features（功能）", "**验收标准**", "约束条件"),
    ],
)
def test_heading_aliases(goal: str, features: str, acceptance: str, constraints: str) -> None:
    text = (f"# T\n\n## {goal}\n\nG.\n\n## {features}\n\n### A\n\nx\n\n"
            f"## {acceptance}\n\n- [ ] ok\n\n## {constraints}\n\nC.\n")
    m = parse_milestone(text, Path("t.md"))
    assert (m.goal, m.constraints, m.acceptance_criteria) == ("G.", "C.", ["ok"])
    assert [f.title for f in m.features] == ["A"]


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("验收：a；b", ["a", "b"]),
        ("验收: a", ["a"]),
        ("**验收：** a; b;", ["a", "b"]),
        ("**Acceptance**: one", ["one"]),
        ("*Acceptance criteria:* one", ["one"]),
        ("acceptance criteria: `a;b` works", ["`a;b` works"]),
        ("Does X. Acceptance: it does X.", ["it does X."]),
        ("验收标准：全部通过", ["全部通过"]),
        ("整体验收：不是标记", []),
        ("The acceptance: is prose-ish but counts", ["is prose-ish but counts"]),
        ("Unacceptance: no", []),
        ("see `Acceptance: x`", []),
    ],
)
def test_feature_marker_forms(line: str, expected: list[str]) -> None:
    m = parse_milestone(f"# T\n\n## Features\n\n### A\n\n{line}\n", Path("t.md"))
    assert m.features[0].criteria == expected


def test_marker_lead_in_then_list() -> None:
    text = ("# T\n\n## Features\n\n### A\n\nAcceptance criteria: all of these:\n"
            "1. one\n2. two; still two\n")
    assert parse_milestone(text, Path("t.md")).features[0].criteria == ["one", "two; still two"]


def test_marker_in_fence_is_not_a_criterion() -> None:
    text = "# T\n\n## Features\n\n### A\n\n```\nAcceptance: nope\n```\n"
    assert parse_milestone(text, Path("t.md")).features[0].criteria == []


# ------------------------------------------------------------------ list items


def test_features_as_list_items() -> None:
    m = load_milestone(DATA / "list_features.md")
    assert [f.title for f in m.features] == [
        "Version flag",
        "Colored output when stdout is a TTY",
        "Shell completion for bash and zsh",
    ]
    f1, f2, f3 = m.features
    assert f1.criteria == ['output equals `importlib.metadata.version("tool")`']
    assert f1.body.startswith("**Version flag**: `tool --version`")
    assert f2.body == ("Colored output when stdout is a TTY\n"
                       "(plain text otherwise, and always with `NO_COLOR` set)\n\n"
                       "验收：\n- 管道输出中没有 ANSI 转义\n- 设置 `NO_COLOR=1` 时没有颜色")
    assert f2.criteria == ["管道输出中没有 ANSI 转义", "设置 `NO_COLOR=1` 时没有颜色"]
    assert f3.criteria == []
    # No checkboxes: the plain top-level items of the section count instead.
    assert m.acceptance_criteria == ["`tool --help` lists every subcommand",
                                     "The test suite passes"]


def test_list_item_title_cut_at_marker() -> None:
    text = "# T\n\n## 功能\n\n1. 登录页 验收：能登录\n2. 退出\n"
    m = parse_milestone(text, Path("t.md"))
    assert [(f.title, f.criteria) for f in m.features] == [("登录页", ["能登录"]),
                                                           ("退出", [])]


def test_nested_checkboxes_and_unchecked_mixed() -> None:
    text = ("# T\n\n## Features\n\n- a\n\n## Acceptance Criteria\n\n"
            "- [x] done\n  - [ ] nested\n- [ ]\n- plain\n")
    assert parse_milestone(text, Path("t.md")).acceptance_criteria == ["done", "nested"]


# ------------------------------------------------------------------ misc format


def test_optional_sections_missing() -> None:
    m = parse_milestone(MINIMAL, Path("t.md"))
    assert (m.goal, m.constraints, m.acceptance_criteria) == ("", "", [])
    assert m.features[0].body == "Do it."


def test_crlf_and_bom() -> None:
    text = "\ufeff---\r\nrequires_human_review: false\r\n---\r\n" + MINIMAL.replace("\n", "\r\n")
    m = parse_milestone(text, Path("t.md"))
    assert m.title == "T" and m.requires_human_review is False
    assert m.features[0].body == "Do it."


def test_front_matter_scalars_and_comments() -> None:
    text = ("---\n# a comment\n\nname: 'x: y'\nn: 3\nratio: 0.5\nflag: yes\nnothing:\n"
            "requires_human_review: null\n---\n" + MINIMAL)
    m = parse_milestone(text, Path("t.md"))
    assert m.front_matter == {"name": "x: y", "n": 3, "ratio": 0.5, "flag": True,
                              "nothing": None, "requires_human_review": None}
    assert m.requires_human_review is None


def test_front_matter_after_blank_lines_still_counts() -> None:
    m = parse_milestone("\n\n---\nrequires_human_review: true\n---\n" + MINIMAL, Path("t.md"))
    assert m.requires_human_review is True and m.title == "T"


def test_horizontal_rule_later_is_not_front_matter() -> None:
    m = parse_milestone(MINIMAL + "\n---\n\nmore\n", Path("t.md"))
    assert m.front_matter == {} and m.title == "T"


def test_setext_title_and_extra_h1() -> None:
    text = "Title\n=====\n\n## Features\n\n### A\n\nx\n\n# Appendix\n\nnot part of A\n"
    m = parse_milestone(text, Path("t.md"))
    assert m.title == "Title"
    assert m.features[0].body == "x"


def test_parse_is_fast_enough() -> None:
    import time

    text = (DATA / "m4_iteration_loop.md").read_text(encoding="utf-8")
    start = time.perf_counter()
    for _ in range(20):
        parse_milestone(text, Path("m4.md"))
    assert (time.perf_counter() - start) / 20 < 0.1  # ~5 ms here; re-read on every scan


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("", "empty"),
        ("  \n\n", "empty"),
        ("## Features\n\n### A\n", "no title"),
        ("Just prose.\n", "no title"),
        ("# T\n\n## Goal\n\nG\n", "no '## Features' section"),
        ("# T\n\n## Features\n\nOnly prose here.\n", "lists no features"),
        ("# T\n\n## Features\n\n```\n### in a fence\n- nor this\n```\n", "lists no features"),
        ("# T\n\n## Features\n\n###\n\nx\n", "feature heading is empty"),
        ("---\nrequires_human_review: maybe\n---\n" + MINIMAL, "requires_human_review"),
        ("---\nrequires_human_review: 1\n---\n" + MINIMAL, "true or false"),
        ("---\nthis is not a pair\n---\n" + MINIMAL, "line 2"),
        ("---\n  indented: x\n---\n" + MINIMAL, "simple 'key: value'"),
        # a misspelt key would be ignored: merged without the review it asks for
        # a second section of features or criteria would be dropped unread
        (MINIMAL + "\n## Features\n\n### Two\n\nAlso.\n", "line 9: a second 'Features'"),
        (MINIMAL + "\n## Acceptance Criteria\n- [ ] a\n\n## 验收标准\n- [ ] b\n",
         "a second 'Acceptance Criteria'"),
        ("---\nrequires_human_reveiw: true\n---\n" + MINIMAL,
         "did you mean 'requires_human_review'"),
        ("---\nRequires-Human-Review: true\n---\n" + MINIMAL, "unknown key"),
        ("---\nhuman_review: true\n---\n" + MINIMAL, "unknown key 'human_review'"),
        ("---\ndepend_on: [a]\n---\n" + MINIMAL, "did you mean 'depends_on'"),
        ("---\ndependencies: a\n---\n" + MINIMAL, "unknown key 'dependencies'"),
        ("---\na: 1\na: 2\n---\n" + MINIMAL, "duplicate key 'a'"),
        ("---\na: 1\n" + MINIMAL, "never closed"),
    ],
)
def test_malformed(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path, "broken.md", text)
    with pytest.raises(MilestoneError) as info:
        load_milestone(path)
    assert info.value.path == path
    assert str(path) in str(info.value)
    assert needle in info.value.detail


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.md"
    path.write_bytes("# Café\n\n## Features\n\n### A\n".encode("latin-1"))
    with pytest.raises(MilestoneError) as info:
        load_milestone(path)
    assert str(path) in str(info.value) and "UTF-8" in info.value.detail
    assert "0xe9" in info.value.detail


def test_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "gone.md"
    with pytest.raises(MilestoneError) as info:
        load_milestone(path)
    assert info.value.path == path and "cannot read" in info.value.detail


@pytest.mark.parametrize(
    ("name", "suggestion"),
    [("Bad Name.md", "bad-name.md"), ("-x.md", "x.md"), ("UPPER.md", "upper.md"),
     ("a.b.md", "a-b.md"), ("_x.md", "x.md"), ("日本.md", None)],
)
def test_bad_ids(tmp_path: Path, name: str, suggestion: str | None) -> None:
    path = write(tmp_path, name, MINIMAL)
    with pytest.raises(MilestoneError) as info:
        load_milestone(path)
    assert info.value.path == path
    assert str(path) in str(info.value)
    assert MILESTONE_ID_RE.pattern in info.value.detail
    if suggestion:
        assert f"'{suggestion}'" in info.value.detail
    else:
        assert "rename" not in info.value.detail


@pytest.mark.parametrize("stem", ["m1", "0", "hello-cli", "m4_iteration_loop", "a-b_c-9"])
def test_good_ids(stem: str) -> None:
    assert validate_milestone_id(stem, Path(f"{stem}.md")) == stem


# ------------------------------------------------------------------ .anima.example


def test_example_milestone_parses() -> None:
    m = load_milestone(EXAMPLE / "milestones" / "hello-cli.md")
    assert m.title == "Hello CLI"
    assert [f.title for f in m.features] == ["Package skeleton", "Greeting command",
                                             "Version and help"]
    assert all(f.criteria for f in m.features)
    assert 3 <= len(m.acceptance_criteria) <= 5
    assert m.goal and m.constraints
    assert m.requires_human_review is False


def test_example_config_is_the_defaults() -> None:
    data = json.loads((EXAMPLE / "config.json").read_text(encoding="utf-8"))
    assert data == Config().model_dump(mode="json")


def _flat_keys(data: dict[str, object], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for key, value in data.items():
        if isinstance(value, dict):
            keys.extend(_flat_keys(value, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def test_example_readme_documents_every_key() -> None:
    readme = (EXAMPLE / "README.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z_.]+)` \|", readme, re.M))
    # A map keyed by the user's own names (`agent_prices`: per model) is documented as one.
    undocumented = [key for key in _flat_keys(Config().model_dump(mode="json"))
                    if key not in documented and key.split(".")[0] not in documented]
    assert undocumented == []


def test_example_state_and_gitignore() -> None:
    state = json.loads((EXAMPLE / "state.json").read_text(encoding="utf-8"))
    assert state == json.loads(State().model_dump_json())  # today's schema, all defaults
    patterns = {ln.strip() for ln in (EXAMPLE / ".gitignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")}
    assert {"milestones/*.json", "state.json", "logs/", "transcripts/", "anima.lock",
            "*.tmp", ".*.tmp"} <= patterns
    assert (EXAMPLE / "soul.md").read_text(encoding="utf-8").strip()
    assert (EXAMPLE / "memory" / "project.md").read_text(encoding="utf-8").strip()
