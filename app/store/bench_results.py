"""Benchmark runs kept in ``LEMON_DESK_HOME/bench.json``: each with its hardware and engine versions, so
that a later run on the same machine can be compared with it. Written atomically; a file that cannot be
read is set aside (kept, never deleted) and a new one is started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.core.bench import BenchRun
from app.store.files import atomic_write_json, read_json, set_aside
from app.store.paths import home

FORMAT_VERSION = 1
KEEP_RUNS = 200  # the oldest go first beyond this


def bench_path() -> Path:
    return home() / "bench.json"


@dataclass(frozen=True)
class LoadedRuns:
    runs: list[BenchRun]  # oldest first
    warning: str = ""


def load_runs(path: Path | None = None) -> LoadedRuns:
    path = path or bench_path()
    if not path.exists():
        return LoadedRuns([])
    try:
        data = read_json(path)  # a nesting too deep for the parser is a ValueError here
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unknown format version {data.get('version')!r}")
        return LoadedRuns([BenchRun.from_record(r) for r in data["runs"]])
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        backup = set_aside(path)
        return LoadedRuns([], f"The saved bench results were unreadable ({err}); kept them as {backup.name}.")


def save_run(run: BenchRun, path: Path | None = None) -> LoadedRuns:
    """Add ``run`` to the saved ones; returns them all (with a warning if the old file was unreadable)."""
    path = path or bench_path()
    loaded = load_runs(path)
    runs = [*[r for r in loaded.runs if r.id != run.id][-(KEEP_RUNS - 1) :], run]
    atomic_write_json(path, {"version": FORMAT_VERSION, "runs": [r.to_record() for r in runs]})
    return LoadedRuns(runs, loaded.warning)
