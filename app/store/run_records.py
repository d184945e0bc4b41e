"""Run records on disk: one small JSON file per running engine, ``run_dir()/engine-<pid>.json``.

Named by the engine's pid, which no two live engines share, so app instances never collide. A file
that cannot be read is set aside (kept, as everywhere in the store) and skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path

from app.core.run_record import RunRecord
from app.store.files import atomic_write_json, read_json, set_aside
from app.store.paths import run_dir

log = logging.getLogger(__name__)

PREFIX = "engine-"


def record_path(pid: int) -> Path:
    return run_dir() / f"{PREFIX}{pid}.json"


def write_run_record(record: RunRecord) -> None:
    atomic_write_json(record_path(record.pid), record.to_json())


def remove_run_record(pid: int) -> None:
    record_path(pid).unlink(missing_ok=True)


def load_run_records() -> list[RunRecord]:
    records = []
    for path in sorted(run_dir().glob(f"{PREFIX}*.json")):
        try:
            records.append(RunRecord.from_json(read_json(path)))
        except FileNotFoundError:
            continue  # its engine was reaped meanwhile
        except (OSError, ValueError) as err:
            backup = set_aside(path)
            log.warning("Unreadable engine run record %s (%s); kept it as %s.", path, err, backup.name)
    return records
