"""`anima` on the command line: the commands, their output and exit codes (README, "CLI")."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from anima.errors import (
    ActionError,
    AgentNotFound,
    AnimaError,
    ConfigError,
    GitError,
    MilestoneError,
    ProjectError,
    RecordError,
    unexpected,
)
from anima.paths import ProjectPaths

if TYPE_CHECKING:
    from anima.config import Config
    from anima.engine.control import Action
    from anima.events import EventBus

# Each command imports what it uses: `anima status` is what scripts poll, and the engine, git,
# the lock, even pydantic would more than double its start-up time.

log = logging.getLogger(__name__)

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_PAUSED = 0, 1, 2, 3
#: How long a CLI action waits for `notify_command` before it exits.
NOTIFY_WAIT_SECONDS = 30.0


def _project(path: str) -> ProjectPaths:
    paths = ProjectPaths(Path(path).resolve())
    if not paths.anima.is_dir():
        raise ProjectError(f"{paths.root} has no .anima/ folder: run `anima init {path}` first")
    return paths


def cmd_init(args: argparse.Namespace) -> int:
    from anima.engine.project import example_milestone, init_project

    try:
        created = init_project(Path(args.project), make_repository=args.git_init)
    except GitError as e:
        raise GitError(f"{e} (or `anima init --git-init {args.project}`)") from None
    print(f"created {created} from the example, without a milestone; add yours with "
          f"`anima add {args.project} FILE.md`, or try the example one with "
          f"`anima add {args.project} {example_milestone()}`")
    return EXIT_OK


def cmd_add(args: argparse.Namespace) -> int:
    from anima.config import load_config
    from anima.engine.facade import Engine

    paths = _project(args.project)
    engine = Engine(paths.root)
    engine.config = load_config(paths.config)
    milestone_id = engine.add_milestone(Path(args.file))
    status = engine.store.load_record(milestone_id).status.value
    if status == "pending":
        print(f"added milestone {milestone_id} (pending)")
    else:  # its `.md` put back: the record still says where the milestone stands
        print(f"added {milestone_id}.md back: milestone {milestone_id} is {status}, as its "
              "record says")
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    from anima.cli.status import show_status

    show_status(_project(args.project), args.json)
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Drive the project headless. SIGTERM / Ctrl+C / a closed terminal stop politely: the
    turn is interrupted, both agents stop within seconds, the milestone stays in_progress and
    the next start resumes it; the exit code is then 128 + the signal (130, 143, 129) so
    scripts can tell."""
    from anima.engine.facade import Engine
    from anima.store.dependencies import held_line

    paths = _project(args.project)
    engine = Engine(paths.root)
    from anima.cli.printer import HeadlessPrinter
    from anima.events import LogLine

    printer = HeadlessPrinter(sys.stdout, sys.stderr)
    engine.bus.subscribe(printer)
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if received:
            printer(LogLine(None, f"received {name} again: already stopping"))
            return
        received.append(signum)
        printer(LogLine(None, f"received {name}: stopping the agents"))
        # request_stop waits for the agents; a signal handler must not block the loop.
        threading.Thread(target=engine.request_stop, name="anima-stop", daemon=True).start()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: the terminal closed
        signal.signal(sig, on_signal)
    try:
        outcome = engine.run(watch=args.watch, start_all=True)
    finally:
        engine.shutdown()
    for problem in outcome.problems:
        print(f"[anima] problem: {problem}", file=sys.stderr)
    for milestone_id, awaited in outcome.waiting:  # no run can start them before you act
        print(f"[anima] {milestone_id} waits for {', '.join(awaited)} (`anima status` says "
              "why)")
    if outcome.held:
        print(f"[anima] {', '.join(outcome.held)} wait{'s' if len(outcome.held) == 1 else ''} "
              + held_line(list(outcome.held_by)))
    # Every milestone that waits for you is named; then the exit code says the worst.
    stopped = bool(received and outcome.in_progress)
    if stopped:
        print(f"[anima] stopped by {signal.Signals(received[0]).name}: "
              f"{', '.join(outcome.in_progress)} continues on the next "
              f"`anima run {args.project} --headless` (or in the app)")
    if outcome.paused:
        print(f"[anima] paused for a human: {', '.join(outcome.paused)} — review, then "
              + _commands(f"anima resume {args.project}", outcome.paused, " [--note TEXT]"))
    if outcome.failed:
        print(f"[anima] failed: {', '.join(outcome.failed)} — the error is in `anima status "
              f"{args.project}` and .anima/logs/anima.log; "
              + _commands(f"anima resume {args.project}", outcome.failed) + " retries it")
    if outcome.awaiting_review:
        print(f"[anima] awaiting your review: {', '.join(outcome.awaiting_review)} — "
              + _commands(f"anima approve {args.project}", outcome.awaiting_review))
    for milestone_id, why in outcome.unmerged:
        print(f"[anima] {milestone_id} is completed, not merged into main yet: {why} (the "
              f"next `anima run {args.project} --headless`, or one with --watch, merges it)")
    for milestone_id, why in outcome.blocked:  # a definition to fix: exit 2's kind
        print(f"[anima] {milestone_id} never starts as its file is written: {why} — fix "
              f"depends_on in {paths.milestone_md(milestone_id)}")
    for milestone_id, problem in outcome.unreadable:  # likewise
        print(f"[anima] {milestone_id} never starts as its file is written: {problem}")
    for milestone_id in outcome.undefined:  # likewise
        print(f"[anima] {milestone_id} does not go on without its definition: "
              f".anima/milestones/{milestone_id}.md is missing — put the file back, or "
              f"`anima abort {args.project} {milestone_id}`")
    if not (stopped or outcome.paused or outcome.failed or outcome.awaiting_review
            or outcome.unmerged or outcome.blocked or outcome.unreadable or outcome.undefined):
        print("[anima] nothing left to do")
    if stopped:
        return 128 + received[0]
    if outcome.paused:
        return EXIT_PAUSED
    if outcome.failed:
        return EXIT_ERROR
    return EXIT_USAGE if outcome.blocked or outcome.unreadable or outcome.undefined \
        else EXIT_OK


def _commands(command: str, milestone_ids: tuple[str, ...], options: str = "") -> str:
    """The command to run for each milestone, ready to paste."""
    return " or ".join(f"`{command} {m}{options}`" for m in milestone_ids)


@contextmanager
def _action_bus(paths: ProjectPaths, config: Config) -> Iterator[EventBus]:
    """What a human's action says goes to the milestone's log, anima.log and stdout, and its
    notices (an approve completes a milestone) to `notify_command`, as from the window or a
    headless run; the command is waited for before the CLI exits."""
    from anima.cli.printer import HeadlessPrinter
    from anima.journal import Journal, log_event
    from anima.notify import NotifyCommand
    from anima.text.redact import RedactingBus

    bus = RedactingBus()
    Journal(paths, bus)
    bus.subscribe(log_event)
    bus.subscribe(HeadlessPrinter(sys.stdout, sys.stderr))
    notify = NotifyCommand(bus, config.notify_command, str(paths.root)) \
        if config.notify_command else None
    try:
        yield bus
    finally:
        if notify is not None:
            notify.close(timeout=NOTIFY_WAIT_SECONDS)


def _ask_running(paths: ProjectPaths, action: Action, milestone_id: str,
                 note: str = "") -> int | None:
    """An Anima running the project holds its lock, so acting on the files would be refused:
    it is asked to act instead, over its control socket, and its answer is printed. None when
    no Anima listens."""
    from anima.engine.control import send

    reply = send(paths.root, action, milestone_id, note)
    if reply is None:
        return None
    if not reply.ok:
        print(f"anima: {reply.message}", file=sys.stderr)
        return EXIT_USAGE
    print(reply.message)
    return EXIT_OK


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop one milestone of the running Anima now: it pauses ("stopped by you") and its
    round is redone on resume; the others go on. With no Anima running nothing runs, so there
    is nothing to stop: said, with exit 2, as for any action that does not apply."""
    paths = _project(args.project)
    if (code := _ask_running(paths, "stop", args.id)) is not None:
        return code
    from anima.engine.read_only import driven_elsewhere
    from anima.loop.actions import load
    from anima.store.store import Store

    if (holder := driven_elsewhere(paths.root)) is not None:
        raise ProjectError(f"the Anima running {paths.root} ({holder.describe()}) does not "
                           "answer on its control socket: stop the milestone in that Anima")
    record = load(Store(paths), args.id)  # an unknown id is named as such
    raise ActionError(f"nothing to stop: no Anima is running {paths.root} "
                      f"({record.id} is {record.status.value})")


def cmd_resume(args: argparse.Namespace) -> int:
    paths = _project(args.project)
    if (code := _ask_running(paths, "resume", args.id, args.note or "")) is not None:
        return code
    from anima.config import load_config
    from anima.lock import ProjectLock
    from anima.loop import actions
    from anima.store.store import Store

    config = load_config(paths.config)
    with ProjectLock(paths.lock, command=f"anima resume {args.id}"), \
            _action_bus(paths, config) as bus:
        record = actions.resume(Store(paths), config, args.id, args.note or "", bus)
    print(f"resumed {record.id}: in_progress, rejections reset"
          + (", your note goes to the Developer's next prompt" if args.note else "")
          + f"; run `anima run {args.project} --headless` or open the app to continue")
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    paths = _project(args.project)
    if (code := _ask_running(paths, "approve", args.id)) is not None:
        return code
    from anima.config import load_config
    from anima.git import GitRepo
    from anima.lock import ProjectLock
    from anima.loop import actions
    from anima.store.store import Store

    config = load_config(paths.config)
    with ProjectLock(paths.lock, command=f"anima approve {args.id}"), \
            _action_bus(paths, config) as bus:
        record = actions.approve(Store(paths), GitRepo.open(paths.root), config, args.id, bus)
    go_on = f"; run `anima run {args.project} --headless` or open the app to go on"
    print(actions.approved(record) + (go_on if record.status.value == "in_progress" else ""))
    return EXIT_OK


def cmd_abort(args: argparse.Namespace) -> int:
    paths = _project(args.project)
    if (code := _ask_running(paths, "abort", args.id)) is not None:
        return code
    from anima.config import load_config
    from anima.git import GitRepo
    from anima.lock import ProjectLock
    from anima.loop import actions
    from anima.store.store import Store

    config = load_config(paths.config)
    with ProjectLock(paths.lock, command=f"anima abort {args.id}"), \
            _action_bus(paths, config) as bus:
        record = actions.abort(Store(paths), GitRepo.open(paths.root), config, args.id, bus)
    print(f"aborted {record.id}: cancelled")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="anima", description=(
        "Runs a project milestone by milestone with a Developer and an Acceptor Claude Code "
        "agent. `anima [PROJECT]` opens the desktop app."))
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="create .anima/ from the example; never overwrites")
    p.add_argument("project")
    p.add_argument("--git-init", action="store_true",
                   help="run `git init` and an empty first commit if PROJECT is not a repository")
    p.set_defaults(fn=cmd_init)
    p = sub.add_parser("add", help="add a milestone (same as dropping the file in)")
    p.add_argument("project")
    p.add_argument("file")
    p.set_defaults(fn=cmd_add)
    p = sub.add_parser("run", help="run without a window until nothing can proceed")
    p.add_argument("project")
    p.add_argument("--headless", action="store_true", required=True,
                   help="required: the app is `anima PROJECT`")
    p.add_argument("--watch", action="store_true",
                   help="keep running and start milestones as they are dropped in")
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("status", help="milestones and state")
    p.add_argument("project")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_status)
    p = sub.add_parser("stop", help="stop a milestone of the running Anima now: it pauses, "
                                    "its round is redone on resume; the others go on")
    p.add_argument("project")
    p.add_argument("id")
    p.set_defaults(fn=cmd_stop)
    p = sub.add_parser("resume", help="paused → in_progress, rejections reset")
    p.add_argument("project")
    p.add_argument("id")
    p.add_argument("--note", default="", help="a note for the Developer's next prompt")
    p.set_defaults(fn=cmd_resume)
    p = sub.add_parser("approve", help="awaiting_review → completed")
    p.add_argument("project")
    p.add_argument("id")
    p.set_defaults(fn=cmd_approve)
    p = sub.add_parser("abort", help="paused/awaiting_review/pending/failed (or in_progress "
                                     "that no run drives) → cancelled; its worktree is "
                                     "removed, the branch is kept")
    p.add_argument("project")
    p.add_argument("id")
    p.set_defaults(fn=cmd_abort)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return EXIT_USAGE if e.code not in (0, None) else EXIT_OK
    from anima.cli.pipes import reader_may_go

    with reader_may_go():
        return _command(args, argv)


def _command(args: argparse.Namespace, argv: list[str]) -> int:
    # `status`, which scripts poll, opens the log only when it fails.
    logfile = None if args.command == "status" else _configure_logging(args)
    try:
        code: int = args.fn(args)
        return code
    except (ConfigError, ProjectError, MilestoneError, RecordError, AgentNotFound,
            ActionError) as e:
        print(f"anima: {e}", file=sys.stderr)
        return EXIT_USAGE
    except AnimaError as e:
        logfile = logfile or _configure_logging(args)
        log.error("anima %s failed", args.command, exc_info=e)
        print(f"anima: {e}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as e:
        from anima.text.redact import redact

        logfile = logfile or _configure_logging(args)
        log.exception("unexpected error in `anima %s`", " ".join(argv))
        where = f"; the traceback is in {logfile}" if logfile else ""
        print(redact(f"anima: {unexpected(e)}{where}"), file=sys.stderr)
        return EXIT_ERROR


def _configure_logging(args: argparse.Namespace) -> Path | None:
    """The project's anima.log, when the command names a project that has `.anima/`. The
    command writes runtime files there (this log, records, a milestone's log): git is told
    to ignore them first, should `.anima/.gitignore` be missing (design.md)."""
    project = getattr(args, "project", None)
    if args.command == "init" or project is None:
        return None
    from anima.engine.project import ensure_gitignore
    from anima.logsetup import configure_logging

    paths = ProjectPaths(Path(project).resolve())
    if not paths.anima.is_dir():
        return None
    try:
        ensure_gitignore(paths)
        return configure_logging(paths)
    except OSError:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
