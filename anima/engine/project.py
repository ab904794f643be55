"""Creating a project's `.anima/` from the shipped example, and opening it: its config and the
runtime ignores.

Below both front ends: `anima init` and the app's "Initialise Anima here" call the same code,
and neither has to import the other for it.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from anima.atomic import write_text_atomic
from anima.config import Config, describe_validation_error, load_config
from anima.errors import AnimaError, ConfigError, GitError, ProjectError
from anima.git import GitRepo
from anima.paths import RUNTIME_IGNORES, ProjectPaths

#: The example milestone, relative to the example folder. It stays in the installation: a copy
#: under `.anima/milestones/` would start on the user's code by itself (`auto_start`).
EXAMPLE_MILESTONE = Path("milestones", "hello-cli.md")


def example_dir() -> Path:
    """The shipped `.anima.example/` (a source checkout and a wheel install both work)."""
    spec = importlib.util.find_spec("anima_example")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if Path(location, "config.json").is_file():
            return Path(location)
    raise AnimaError("the example .anima/ is missing from this installation; reinstall anima")


def example_milestone() -> Path:
    """The example milestone a user adds on purpose (`anima add PROJECT <this path>`)."""
    return example_dir() / EXAMPLE_MILESTONE


def git_problem(folder: Path) -> str | None:
    """Why `folder` cannot be a managed project (not a repository, no commit yet), or None."""
    try:
        GitRepo.open(folder)
    except GitError as e:
        return str(e)
    return None


def init_project(root: Path, *, make_repository: bool = False) -> Path:
    """Create `.anima/` from the example, without a milestone. Never overwrites anything.

    The folder must be a git repository with a commit, checked before anything is written
    (Anima cannot drive anything else); `make_repository` runs `git init` and a first commit
    in a folder that is not one yet.
    """
    root = Path(root)
    if not root.is_dir():
        raise ProjectError(f"{root} is not a folder")
    paths = ProjectPaths(root)
    if paths.anima.exists():
        raise ProjectError(f"{paths.anima} already exists; nothing was changed")
    if make_repository and git_problem(root) is not None:
        GitRepo.create(root)
    problem = git_problem(root)
    if problem:
        raise GitError(f"{problem}; nothing was written (to start a repository there: "
                       f"`cd {root} && git init && git commit --allow-empty -m init`)")
    source = example_dir()
    shutil.copytree(source, paths.anima, ignore=shutil.ignore_patterns(
        "__pycache__", "*.pyc", "README.md", "__init__.py", EXAMPLE_MILESTONE.name))
    return paths.anima


def ensure_gitignore(paths: ProjectPaths) -> None:
    """Add the runtime ignores that are missing (never removes what the user wrote)."""
    existing = paths.gitignore.read_text(encoding="utf-8").splitlines() \
        if paths.gitignore.exists() else []
    missing = [p for p in RUNTIME_IGNORES if p not in existing]
    if missing:
        text = "\n".join([*existing, "# Anima's runtime files", *missing]) + "\n"
        write_text_atomic(paths.gitignore, text)


def open_config(paths: ProjectPaths, overrides: dict[str, Any] | None = None) -> Config:
    config = load_config(paths.config)
    if not overrides:
        return config
    try:
        return Config.model_validate({**config.model_dump(), **overrides})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(paths.config, e)) from e
