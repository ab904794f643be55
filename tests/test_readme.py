"""The README's quick start works exactly as written: its commands run, in order, in a fresh
folder (the fake `claude` stands in for the real one; the two install lines are this checkout's
own install, already done)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.conftest import REPO_ROOT, FakeClaude

INSTALLS = ("python -m pip install", "npm install")


def quick_start() -> list[str]:
    """The commands of the README's "Quick start on the example", comments and installs out."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start on the example", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the quick start has no bash block"
    commands = [line.split("  #", 1)[0].strip() for line in block.group(1).splitlines()]
    return [c for c in commands if c and not c.startswith("#") and not c.startswith(INSTALLS)]


def test_the_quick_start_runs_as_written(tmp_path: Path, fake_claude: FakeClaude) -> None:
    commands = quick_start()
    assert any(c.startswith("anima add . ") for c in commands)
    env = {**os.environ, **fake_claude.env, "ANIMA_CLAUDE_COMMAND": fake_claude.command,
           "GIT_AUTHOR_NAME": "Reader", "GIT_AUTHOR_EMAIL": "reader@example.invalid",
           "GIT_COMMITTER_NAME": "Reader", "GIT_COMMITTER_EMAIL": "reader@example.invalid"}
    done = subprocess.run(["bash", "-ec", "\n".join(commands)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "added milestone hello-cli (pending)" in done.stdout
    assert "nothing left to do" in done.stdout
    assert "completed" in done.stdout.rsplit("[anima] nothing left to do", 1)[1]
