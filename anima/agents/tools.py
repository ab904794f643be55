"""Tool calls in words (`Bash: git commit -m …`): the events name tools as Claude Code does,
and a backend whose CLI names them otherwise maps its calls to these names (a shell command is
`Bash` with a `command`, a file change `Edit` with a `file_path`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Which input key best says what a tool call does, per tool.
_KEY_ARGUMENT = {
    "Bash": "command",
    "Read": "file_path",
    "Write": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "NotebookEdit": "notebook_path",
    "Glob": "pattern",
    "Grep": "pattern",
    "WebFetch": "url",
    "WebSearch": "query",
    "Task": "description",
    "Agent": "description",
}


def shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def describe_tool(tool: str, tool_input: dict[str, Any], root: Path | None = None) -> str:
    """`Bash: git commit -m …` — the tool and the one argument that says what it does."""
    key = _KEY_ARGUMENT.get(tool)
    value: Any = tool_input.get(key) if key else None
    if value is None and tool == "TodoWrite":
        value = f"{len(tool_input.get('todos') or [])} todos"
    if value is None:
        value = next((v for v in tool_input.values() if isinstance(v, str) and v), "")
    text = str(value).strip()
    if root is not None and key in ("file_path", "notebook_path"):
        prefix = str(root).rstrip("/") + "/"
        if text.startswith(prefix):
            text = text[len(prefix):]
    if tool == "Grep" and tool_input.get("path"):
        text = f"{text}  in {tool_input['path']}"
    first, _, rest = text.partition("\n")
    if rest:
        first += " …"
    first = shorten(first, 160)
    return f"{tool}: {first}" if first else tool
