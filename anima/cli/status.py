"""`anima status`: where every milestone stands, for a human or (with `--json`) a script.

Scripts poll it, so the JSON is put together from the status cache, record by record: only
records that changed since the last run are validated again, and a run where none did never
loads pydantic. Whatever the path, the bytes are those of pydantic's compact dump of
`{"state": State, "milestones": [MilestoneRecord, ...]}` (tests/test_cli.py holds it to that),
followed by `"sandbox": {"mode", "confined", "problem"}`: whether agents started now would be
confined by bubblewrap (config `sandbox`, see `anima.loop.confinement`), and by
`"dependencies"`: what holds each pending milestone, its `depends_on` or its `.md` gone
(`dependency_report`), as the plain `anima status` words it.
"""

from __future__ import annotations

import gc
import json
import sys
from functools import cached_property
from typing import TYPE_CHECKING, Any

from anima import sandbox
from anima.atomic import read_regular
from anima.paths import ProjectPaths
from anima.store.freshness import changed_after, defined_after_record
from anima.store.status_cache import Entry, StatusCache, microseconds, read_if_any, read_snapshot

if TYPE_CHECKING:
    from collections.abc import Set

    from anima.config import Config
    from anima.errors import AnimaError
    from anima.store.dependencies import Dependencies
    from anima.store.models import MilestoneRecord, State
    from anima.store.store import Scan, Store


def show_status(paths: ProjectPaths, as_json: bool) -> None:
    # A short-lived command building a hundred records' objects, none of them in a cycle: the
    # cyclic collector would only rescan them, a quarter of the command's time.
    gc.disable()
    if not as_json:
        _print_table(paths)
        return
    report, problems = _report(paths)
    if sys.stdout.isatty():  # indented for a human at a terminal; compact for the scripts
        report = json.dumps(json.loads(report), indent=2, ensure_ascii=False).encode()
    buffer = getattr(sys.stdout, "buffer", None)  # None: a caller's in-memory stdout
    if buffer is None:
        sys.stdout.write(report.decode() + "\n")
    else:
        sys.stdout.flush()
        buffer.write(report + b"\n")
        buffer.flush()
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)


def _report(paths: ProjectPaths) -> tuple[bytes, list[AnimaError]]:
    """The JSON report and what is wrong with the project's files."""
    snapshot = read_snapshot(paths)
    if snapshot is None:
        return _scanned_report(paths)
    entries = _Entries(paths, StatusCache(paths.root))
    state = entries.state(snapshot.state)
    found = {i: entries.record(i, data) for i, data in snapshot.records.items()}
    listed = sorted((entry.order, i, entry) for i, entry in found.items() if entry is not None)
    report = entries.dependencies([(i, entry) for _, i, entry in listed], snapshot.undefined)
    if entries.validated:
        entries.cache.prune()
    from anima.errors import MilestoneError
    problems = entries.problems + [
        MilestoneError.never_starts(paths.milestone_md(i), why)
        for i, held in json.loads(report).items()
        if (why := held["never_starts"]) is not None and i not in snapshot.undefined]
    return _assemble(state.json, [entry.json for *_, entry in listed], report, paths), problems


class _Entries:
    """Each file's entry from the cache, or validated (and kept) where it has none: pydantic,
    the store and the config are loaded only then."""

    def __init__(self, paths: ProjectPaths, cache: StatusCache) -> None:
        self.paths = paths
        self.cache = cache
        self.problems: list[AnimaError] = []

    @property
    def validated(self) -> bool:
        return "store" in self.__dict__

    @cached_property
    def store(self) -> Store:
        from anima.store.store import Store
        return Store(self.paths)

    @cached_property
    def config(self) -> Config:
        from anima.config import load_config
        return load_config(self.paths.config)

    def state(self, data: bytes | None) -> Entry:
        key = self.cache.key("state.json", data)
        entry = self.cache.get(key)
        if entry is None:
            from anima.store.models import State
            entry = Entry(0, State.__pydantic_serializer__.to_json(self.store.parse_state(data)))
            self.cache.put(key, entry)
        return entry

    def record(self, milestone_id: str, data: bytes) -> Entry | None:
        """The record as written (None: it does not validate), or a pending one as its `.md`
        and the config read now when they changed since: the full scan's
        `Store._as_defined_now`. One whose `.md` no longer reads is listed as written and
        reported, at every poll, as is an ended one's `.md` that defines another milestone
        now (`_ended`)."""
        from anima.errors import MilestoneError, RecordError

        key = self.cache.key(f"{milestone_id}.json", data)
        entry = self.cache.get(key)
        if entry is None:
            try:
                entry = self._entry(self.store.parse_record(milestone_id, data))
            except RecordError as e:
                self.problems.append(e)
                return None
            self.cache.put(key, entry)
        if entry.ended:
            self._ended(milestone_id, data, entry.ended)
        if not (entry.pending and defined_after_record(self.paths, milestone_id)):
            return entry
        key = self.cache.key(f"{milestone_id}.md", data,
                             read_if_any(self.paths.milestone_md(milestone_id)),
                             read_if_any(self.paths.config))
        now = self.cache.get(key)
        if now is None:
            record = self.store.parse_record(milestone_id, data)
            try:
                self.store.retake_definition(
                    record, max_iterations=self.config.max_iterations_per_milestone,
                    requires_human_review=self.config.requires_human_review)
            except MilestoneError as e:
                self.problems.append(e)
                return entry
            now = self._entry(record)
            self.cache.put(key, now)
        return now

    def _ended(self, milestone_id: str, data: bytes, ended: int) -> None:
        """The full scan's `Store._not_run_again`: the `.md` of a milestone that ended (at
        `ended`, in microseconds), changed since into another milestone, is a problem; what
        it says is kept by the record's and the file's bytes."""
        from anima.errors import MilestoneError

        md = self.paths.milestone_md(milestone_id)
        if not md.exists() or not changed_after(md, ended / 1e6):
            return
        key = self.cache.key(f"{milestone_id}.md ended", data, read_if_any(md))
        said = self.cache.get(key)
        if said is None:
            record = self.store.parse_record(milestone_id, data)
            try:
                problem = self.store.not_run_again(record, self.store.definition(milestone_id),
                                                   md)
            except MilestoneError:
                problem = None  # it ended: a file that no longer reads says nothing
            said = Entry(0, b"" if problem is None else problem.detail.encode())
            self.cache.put(key, said)
        if said.json:
            self.problems.append(MilestoneError(md, said.json.decode()))

    def dependencies(self, listed: list[tuple[str, Entry]], undefined: frozenset[str]) -> bytes:
        """The report's `"dependencies"` for the records `listed` (in the report's order):
        from the cache while no status, merge or `depends_on` changed, nor which files are
        gone or unreadable. One that asked git whether you merged a milestone yourself is not
        kept (main moves without any record changing)."""
        unreadable = sorted({str(p.path.stem) for p in self.problems if hasattr(p, "path")})
        key = self.cache.key("dependencies", *(
            part for i, entry in listed for part in (i.encode(), entry.facts)),
            "\0".join(sorted(undefined)).encode(), "\0".join(unreadable).encode())
        if (entry := self.cache.get(key)) is not None:
            return entry.json
        from anima.store.dependencies import dependencies
        from anima.store.models import MilestoneRecord

        records = [MilestoneRecord.model_validate_json(entry.json) for _, entry in listed]
        asked: list[str] = []

        def in_main(record: MilestoneRecord) -> bool:
            from anima.engine.merged import merged_by_you
            asked.append(record.id)
            return merged_by_you(self.paths.root)(record)

        found = dependencies(records, in_main, unreadable=set(unreadable), undefined=undefined)
        report = _dump(dependency_report(self.paths, records, found, undefined))
        if not asked:
            self.cache.put(key, Entry(0, report))
        return report

    @staticmethod
    def _entry(record: MilestoneRecord) -> Entry:
        from anima.store.models import MilestoneRecord, MilestoneStatus
        merge = record.merge
        facts = [record.status, record.depends_on,
                 None if merge is None else [merge.state, merge.merged]]
        ended = record.completed_at if record.status in (
            MilestoneStatus.COMPLETED, MilestoneStatus.CANCELLED) else None
        return Entry(microseconds(record.created_at),
                     MilestoneRecord.__pydantic_serializer__.to_json(record),
                     record.status is MilestoneStatus.PENDING, _dump(facts),
                     0 if ended is None else microseconds(ended))


def _dump(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()


def dependency_report(paths: ProjectPaths, records: list[MilestoneRecord],
                      found: Dependencies, undefined: Set[str]) -> dict[str, dict[str, Any]]:
    """For each pending milestone its `depends_on` holds, or its `.md` being gone
    (`undefined`, which is no problem of the files: `Store.scan` reports none):
    `waiting_for` (the ids it waits for), `never_starts` (why it never starts as its files
    are, else None) and `line`, what `anima status` says of it."""
    from anima.store.dependencies import awaited

    by_id = {r.id: r for r in records}
    report: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.status.value != "pending":
            continue
        if r.id in undefined:
            missing = f"{paths.milestone_md(r.id)} is missing (put it back to run it)"
            report[r.id] = {"waiting_for": [], "never_starts": missing,
                            "line": f"never starts: {missing}"}
        elif (why := found.broken.get(r.id)) is not None:
            report[r.id] = {"waiting_for": [], "never_starts": why, "line": (
                f"never starts: {why} — fix depends_on in {paths.milestone_md(r.id)}")}
        elif (waiting := found.waiting.get(r.id)) is not None:
            report[r.id] = {"waiting_for": waiting, "never_starts": None, "line": (
                "waiting for " + ", ".join(
                    awaited(by_id[d], found.broken) if d in by_id else f"{d} (its file "
                    "cannot be read: see the problem below)" for d in waiting))}
    return report


def _assemble(state: bytes, records: list[bytes], dependencies: bytes,
              paths: ProjectPaths) -> bytes:
    return (b'{"state":' + state + b',"milestones":[' + b",".join(records) + b'],"sandbox":'
            + _dump(sandbox_status(paths)) + b',"dependencies":' + dependencies + b"}")


#: The values of config `sandbox` (`anima.config.Config.sandbox`; its default first).
_SANDBOX_MODES = ("auto", "required", "off")


def sandbox_status(paths: ProjectPaths) -> dict[str, Any]:
    """{"mode", "confined", "problem"}: whether agents Anima starts now run confined, and
    why not (None when they are, or when the sandbox is off). The same answer as
    `anima.loop.confinement.sandbox_problem`, whose `required` error is a problem here (it
    stops `anima run`, not `anima status`); asked of `anima.sandbox` directly, since the loop
    is more than this command may import, and from the config's raw JSON, without pydantic.
    """
    mode: Any = "auto"
    try:
        data = json.loads(read_regular(paths.config).decode("utf-8"))
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as e:
        return {"mode": None, "confined": False,
                "problem": f"{paths.config} cannot be read: {e}"}
    if isinstance(data, dict):
        mode = data.get("sandbox", "auto")
    if mode not in _SANDBOX_MODES:
        return {"mode": mode, "confined": False, "problem": f"{paths.config}: sandbox is "
                f"{json.dumps(mode)}, not one of {', '.join(_SANDBOX_MODES)}"}
    problem = None if mode == "off" else sandbox.unavailable()
    return {"mode": mode, "confined": mode != "off" and problem is None, "problem": problem}


def sandbox_line(status: dict[str, Any]) -> str:
    """The plain line `anima status` prints about it."""
    mode, problem = status["mode"], status["problem"]
    if status["confined"]:
        unscoped = sandbox.unscoped()
        caveat = "" if unscoped is None else f"; {sandbox.UNSCOPED}: {unscoped}"
        return f"agents: confined by bubblewrap (sandbox {mode}){caveat}"
    if mode == "off":
        return "agents: not confined (sandbox off)"
    if mode == "required":
        return f"agents: NOT confined — {problem}; sandbox is required, so none will start"
    return f"agents: NOT confined — {problem}; sandbox is {mode}"


def _scan(paths: ProjectPaths) -> tuple[int, int, State, Scan]:
    """The full scan, which also lists definitions that wait for their record (as pending,
    without writing one: registering is left to a running Anima or `anima add`)."""
    from anima.config import load_config
    from anima.engine.merged import merged_by_you
    from anima.store.store import Store

    config = load_config(paths.config)
    store = Store(paths)
    scan = store.scan(max_iterations=config.max_iterations_per_milestone,
                      requires_human_review=config.requires_human_review, register=False,
                      in_main=merged_by_you(paths.root))
    return (config.max_consecutive_rejections, config.max_parallel_milestones,
            store.load_state(), scan)


def _scanned_report(paths: ProjectPaths) -> tuple[bytes, list[AnimaError]]:
    from anima.store.models import MilestoneRecord, State

    _, _, state, scan = _scan(paths)
    dump = MilestoneRecord.__pydantic_serializer__.to_json
    return (_assemble(State.__pydantic_serializer__.to_json(state),
                      [dump(r) for r in scan.records],
                      _dump(dependency_report(paths, scan.records, scan.dependencies,
                                              scan.orphans)), paths),
            scan.problems)


def _print_table(paths: ProjectPaths) -> None:
    from anima.lock import ProjectLock
    from anima.store.dependencies import held_by_pause, held_line

    max_rejections, limit, state, scan = _scan(paths)
    # A schema 3 file said only the project's wait; a newer one says each milestone's.
    waiting = f"; {state.waiting_reason}" if state.waiting_reason and not any(
        running.waiting_reason for running in state.running) else ""
    was = "running"
    live = ProjectLock(paths.lock).holder() is not None
    if (state.running or state.status.value == "awake") and not live:
        # state.json is as the last Anima left it, and it was killed before it could say so.
        print("state: not running (no Anima drives this project; the last one stopped without "
              "a word, killed perhaps: `anima run` or the app goes on where it stopped)")
        was = "was running"
    elif len(state.running) > 1:
        print(f"state: {state.status.value} ({len(state.running)} milestones running){waiting}")
    else:
        current = state.current_milestone or "-"
        print(f"state: {state.status.value} (current milestone: {current}){waiting}")
    for running in state.running:
        print(f"  {was} {running.id}: round {running.round}, "
              f"{running.activity or running.phase.value}"
              + (f" (in {running.worktree})" if running.worktree else "")
              + (f"; {running.waiting_reason}" if running.waiting_reason and live else ""))
    held_by = dependency_report(paths, scan.records, scan.dependencies, scan.orphans)
    running_ids = {running.id for running in state.running}
    confinement = sandbox_status(paths)
    limit = limit if confinement["confined"] else 1  # one at a time without the sandbox
    held = held_by_pause(scan.records, limit)
    print(sandbox_line(confinement))
    if not scan.records:
        print("no milestones yet")
    for r in scan.records:
        print(f"  {r.id:<24} {r.status.value:<16} features {r.features_done}/"
              f"{len(r.features)}  rounds {r.rounds}  rejections {r.consecutive_rejections}/"
              f"{max_rejections}  {r.spent_text}"
              + (f"  paused: {r.pause_reason}" if r.pause_reason else ""))
        for line in _details(r, live):
            print(f"      {line}")
        if r.id in held_by:
            print(f"      {held_by[r.id]['line']}")
        elif r.status.value == "pending" and held:
            print(f"      waiting {held_line(held)}")
        elif ((r.status.value == "in_progress" and r.id not in running_ids | scan.orphans)
              or (r.status.value == "pending" and live)) \
                and (why := _not_running(len(running_ids), limit, live)):
            print(f"      {why}")
    for problem in scan.problems:
        print(f"problem: {problem}", file=sys.stderr)


def _not_running(running: int, limit: int, live: bool) -> str | None:
    """Why a milestone in progress has no run, or a pending one with nothing to wait for
    has not started: the others fill every slot, or (in progress) no Anima runs (resumed
    from the files, or left so by a signal). None when the running Anima has a slot for it:
    it starts at its next step, or its log says why not."""
    if not live:
        return "not running: the next `anima run` or the app goes on with it"
    if running >= limit:
        return f"waiting for a free slot ({running} of {limit} running)"
    return None


def _details(record: MilestoneRecord, live: bool) -> list[str]:
    """What a human must know beyond the counters: why it failed, which agent CLI each role
    ran, where its merge stands (`live`: an Anima drives the project, and retries it)."""
    from anima.store.models import MergeState

    lines = [f"failed: {record.error}"] if record.error else []
    lines += [f"{role}: {run.describe(getattr(record.sessions, f'{role}_model', None))}"
              for role, run in record.agents.items()]
    merge = record.merge
    if merge is not None and merge.waits_for_you:
        lines.append(f"merge waiting: {merge.detail}")  # names the human's files
    elif merge is not None and merge.state is MergeState.PENDING:
        lines.append(f"merge pending: {merge.detail} " + (
            "(the running Anima tries it again shortly)" if live else
            "(cut short; the next `anima run` or the app finishes it)"))
    elif merge is not None and merge.state is MergeState.FAILED:
        lines.append(f"not merged: {merge.detail}")
    elif merge is not None:
        lines.append(f"merged: {merge.detail}")
    return lines
