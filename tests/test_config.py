"""`.anima/config.json`: defaults from the seed, and errors that name the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anima.config import Config, load_config
from anima.errors import ConfigError


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")
    return path


def test_a_missing_file_means_every_default(tmp_path: Path) -> None:
    config = load_config(tmp_path / "config.json")
    assert config == Config()
    assert config.auto_start is True
    assert config.max_iterations_per_milestone == 20
    assert config.max_consecutive_rejections == 3
    assert config.agent_timeout_seconds == 600
    assert config.requires_human_review is False
    assert config.merge_on_complete is True
    assert config.claude_command is None
    assert config.developer.model is None and "Edit" in config.developer.allowed_tools
    assert "Write" in config.acceptor.disallowed_tools
    assert config.context_budget_tokens == 16000


def test_a_partial_file_overrides_only_its_keys(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, {"max_consecutive_rejections": 5,
                                          "developer": {"model": "claude-sonnet-4-5"}}))
    assert config.max_consecutive_rejections == 5
    assert config.developer.model == "claude-sonnet-4-5"
    assert config.developer.allowed_tools  # the rest of the role keeps its defaults
    assert config.max_iterations_per_milestone == 20


@pytest.mark.parametrize(("data", "words"), [
    ({"max_iterations_per_milstone": 5}, ["unknown key 'max_iterations_per_milstone'", "typo"]),
    ({"auto_start": "sometimes"}, ["key 'auto_start'", "bool", "'sometimes'"]),
    ({"agent_timeout_seconds": -1}, ["key 'agent_timeout_seconds'", "greater than 0"]),
    ({"max_consecutive_rejections": 0}, ["key 'max_consecutive_rejections'"]),
    ({"developer": {"modle": "x"}}, ["unknown key 'developer.modle'"]),
    ({"acceptor": {"allowed_tools": "Read"}}, ["key 'acceptor.allowed_tools'", "list"]),
    ({"summarizer": {"enabled": "yes please"}}, ["key 'summarizer.enabled'"]),
    ([1, 2], ["expected a JSON object"]),
    ("{not json", ["not valid JSON", "line 1"]),
    # values of the wrong type are named, not guessed at
    ({"max_parallel_milestones": True}, ["key 'max_parallel_milestones'", "integer"]),
    ({"max_iterations_per_milestone": "20"}, ["key 'max_iterations_per_milestone'"]),
    ({"merge_on_complete": "no"}, ["key 'merge_on_complete'", "boolean"]),
    ({"schema_version": 99}, ["schema_version 99 is newer", "update Anima"]),
    ({"pass_env": "GH_TOKEN"}, ["key 'pass_env'", "list"]),
    ({"pass_env": ["DB_PASSWORD=x"]}, ["key 'pass_env'", "variable's name", "'DB_PASSWORD=x'"]),
], ids=["typo", "wrong-type", "negative-timeout", "zero-rejections", "nested-typo",
        "list-expected", "nested-type", "not-an-object", "not-json", "bool-for-int",
        "str-for-int", "str-for-bool", "newer-schema", "pass-env-not-a-list",
        "pass-env-not-a-name"])
def test_every_error_names_the_file_the_key_and_what_was_expected(
        tmp_path: Path, data: object, words: list[str]) -> None:
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert str(path) in message
    for word in words:
        assert word in message


def test_the_example_config_is_every_default(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / ".anima.example" / "config.json"
    assert load_config(example) == Config()
