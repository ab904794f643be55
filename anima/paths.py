"""Where everything lives in a managed project: the one place that knows the layout of
`.anima/` (what is the human's, what is Anima's, what git may track)."""

from __future__ import annotations

import importlib.resources
import re
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

#: The `resources/` folder ships as the `anima_resources` package (a top-level `resources`
#: package would clash with other distributions).
RESOURCES_PACKAGE = "anima_resources"


def resource(*parts: str) -> Traversable:
    """A file under `resources/`, from a source checkout or an installed wheel alike."""
    return importlib.resources.files(RESOURCES_PACKAGE).joinpath(*parts)


ANIMA_DIR = ".anima"
#: The human's definitions under `.anima/`, repository-relative, besides milestones/*.md.
#: Which of the human's ignored files (`.env` and the like) every milestone's worktree gets.
WORKTREE_INCLUDE = ".worktreeinclude"
#: The human's files Anima keeps as they wrote them: an agent that changed the list above
#: would hand their secrets to every later milestone's agents.
DEFINITION_FILES = (".anima/config.json", ".anima/soul.md", ".anima/.gitignore", WORKTREE_INCLUDE)
#: A transcript's file name in its milestone's folder.
TRANSCRIPT = "events.jsonl"
#: Its older half, once it reached half its cap.
ROTATED_TRANSCRIPT = "events.1.jsonl"
_MILESTONE_MD = re.compile(r"\.anima/milestones/[^/]+\.md")
_MEMORY_PREFIX = ".anima/memory/"
#: What `.anima/.gitignore` must hold so Anima's runtime files never dirty the tree, and
#: editors' swap and lock files (a human editing a milestone in vim while the Developer runs
#: `git add -A`) never reach a commit, where the `.anima/` check would reject it.
RUNTIME_IGNORES = ("milestones/*.json", "state.json", "logs/", "transcripts/", "anima.lock",
                   "anima.flock", "agents.json", "turn_guard.json", "review_guard.json",
                   "held/", "worktrees/", "sandbox/", "*.tmp", ".*.tmp", ".*.swp", ".*.swo",
                   ".#*", "*~")


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` with each byte that was not UTF-8 written `\\xNN`. Any byte string is a valid
    file name, and `os.fsdecode` gives git's names such bytes as lone surrogates, which no
    JSON record, UTF-8 log or widget takes; the name stays recognisable."""
    return _SURROGATE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def is_under_anima(path: str) -> bool:
    """True for `.anima` itself and anything below it (repository-relative, `/`-separated)."""
    return path == ANIMA_DIR or path.startswith(ANIMA_DIR + "/")


def is_memory_path(path: str) -> bool:
    """The Developer keeps `.anima/memory/` current, so it may commit there."""
    return path.startswith(_MEMORY_PREFIX)


def is_milestone_md(path: str) -> bool:
    """A milestone's definition (repository-relative, `/`-separated)."""
    return _MILESTONE_MD.fullmatch(path) is not None


def is_definition_path(path: str) -> bool:
    """Files the human writes (under `.anima/`, and `.worktreeinclude`) and may track;
    committing them as-is is fine."""
    return path in DEFINITION_FILES or is_milestone_md(path)


@dataclass(frozen=True)
class ProjectPaths:
    root: Path

    @property
    def anima(self) -> Path:
        return self.root / ANIMA_DIR

    @property
    def config(self) -> Path:
        return self.anima / "config.json"

    @property
    def soul(self) -> Path:
        return self.anima / "soul.md"

    @property
    def state(self) -> Path:
        return self.anima / "state.json"

    @property
    def memory(self) -> Path:
        return self.anima / "memory" / "project.md"

    @property
    def vision(self) -> Path:
        return self.root / "VISION.md"

    @property
    def milestones(self) -> Path:
        return self.anima / "milestones"

    @property
    def held(self) -> Path:
        """Milestones that arrived while an agent worked (see anima.guard)."""
        return self.anima / "held"

    @property
    def logs(self) -> Path:
        return self.anima / "logs"

    @property
    def lock(self) -> Path:
        return self.anima / "anima.lock"

    @property
    def agents(self) -> Path:
        """The running Anima's agent processes, so a restart can stop leftovers."""
        return self.anima / "agents.json"

    @property
    def turn_guard(self) -> Path:
        """Anima's copy of the human's definitions while a Developer turn runs."""
        return self.anima / "turn_guard.json"

    @property
    def review_guard(self) -> Path:
        """Where main stood when a review or a check run began, while it runs."""
        return self.anima / "review_guard.json"

    @property
    def gitignore(self) -> Path:
        return self.anima / ".gitignore"

    @property
    def worktrees(self) -> Path:
        """Each running milestone's git worktree: the only tree its agents may write."""
        return self.anima / "worktrees"

    def worktree(self, milestone_id: str) -> Path:
        return self.worktrees / milestone_id

    def sandbox(self, milestone_id: str) -> Path:
        """What Anima keeps for a milestone's confined processes, which none of them can
        write as a whole."""
        return self.anima / "sandbox" / milestone_id

    def agent_state(self, milestone_id: str, role: str) -> Path:
        """A confined agent's own HOME (its CLI's sessions, a private git identity) and
        temporary folder, which no other agent can write."""
        return self.sandbox(milestone_id) / role

    def agent_objects(self, milestone_id: str) -> Path:
        """The git objects the confined Developer's commits write, until Anima takes them
        into the repository (`anima.git.objects`): its git cannot write the repository's."""
        return self.sandbox(milestone_id) / "objects"

    def repository_objects_view(self, milestone_id: str) -> Path:
        """Where the confined Developer sees the repository's objects, read-only."""
        return self.sandbox(milestone_id) / "repository-objects"

    def copied_in(self, milestone_id: str) -> Path:
        """There once the `.worktreeinclude` files and memory notes were copied into the
        milestone's new worktree (a kill before that copies them at the next start)."""
        return self.sandbox(milestone_id) / "copied.done"

    def setup_done(self, milestone_id: str) -> Path:
        """There once `worktree_setup_command` passed in the milestone's worktree."""
        return self.sandbox(milestone_id) / "setup.done"

    def removing(self, milestone_id: str) -> Path:
        """There once what the ended milestone's worktree held uncommitted is stashed and
        git may be deleting it: a tree a kill left half deleted holds nothing of anyone's."""
        return self.sandbox(milestone_id) / "removing"

    def milestone_md(self, milestone_id: str) -> Path:
        return self.milestones / f"{milestone_id}.md"

    def milestone_record(self, milestone_id: str) -> Path:
        return self.milestones / f"{milestone_id}.json"

    def log(self, milestone_id: str) -> Path:
        return self.logs / f"{milestone_id}.log"

    @property
    def all_transcripts(self) -> Path:
        return self.anima / "transcripts"

    def transcripts(self, milestone_id: str) -> Path:
        return self.all_transcripts / milestone_id

    def transcript(self, milestone_id: str) -> Path:
        """The milestone's current transcript (`anima.journal` rotates it beside itself)."""
        return self.transcripts(milestone_id) / TRANSCRIPT


#: The layout as repository-relative paths, for what a message or prompt names.
RELATIVE = ProjectPaths(Path())
