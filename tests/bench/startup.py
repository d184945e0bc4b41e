"""Start-up: time from launch to the window shown, the app's against a bare PySide6 window's.

Each run is a fresh process started in its own process group, timed from just before the spawn to the
line it prints once the window is shown and the event loop has turned once; the group is then killed and
reaped, so nothing outlives a run. The bare window is a ``QMainWindow`` that prints from a zero-delay timer
after ``show()``; the app is ``lemon-desk`` with ``LEMON_DESK_PRINT_READY=1`` and an empty
``LEMON_DESK_HOME`` in a temporary folder per run. Runs alternate so drift in the machine's load hits
both; the first pair warms the disk cache and is not counted. Target: app / bare <= 3.

The children run without ``PYTHONDONTWRITEBYTECODE``: an installed app has its byte code compiled by
pip, so the first (uncounted) run writes it, as installing would. ``--source`` keeps the variable as
the environment has it, to see the cost of compiling every module from source on each start.

    QT_QPA_PLATFORM=offscreen .venv/bin/python tests/bench/startup.py [--rounds N] [--bundle PATH]

``--bundle dist/lemon-desk`` also times the packaged app (``PATH/lemon-desk``, the same way, in the same
alternation) and prints its time as a ratio to the pip-installed app's.

To find what is slow: ``LEMON_DESK_PRINT_READY=1 .venv/bin/python -X importtime -m app 2> imports.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60

BARE_WINDOW = """
import sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMainWindow
app = QApplication(sys.argv)
window = QMainWindow()
window.setWindowTitle("bare")
window.show()
QTimer.singleShot(0, lambda: print("window shown: bare", flush=True))
app.exec()
"""


def app_command() -> list[str]:
    script = Path(sys.executable).with_name("lemon-desk")
    return [str(script)] if script.exists() else [sys.executable, "-m", "app"]


def child_env(source: bool, **extra: str) -> dict[str, str]:
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen"), **extra}
    if not source:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def time_to_ready(command: list[str], env: dict[str, str]) -> float:
    """Seconds from spawn to the ready line; the process group is killed and reaped before returning."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the line or the end of output
        elapsed = time.perf_counter() - started
        if not line.startswith("window shown"):
            raise RuntimeError(f"{command[0]} ended without showing a window (exit {proc.poll()})")
        return elapsed
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=READY_TIMEOUT_S)
        if proc.stdout is not None:
            proc.stdout.close()


def run_bare(source: bool) -> float:
    return time_to_ready([sys.executable, "-c", BARE_WINDOW], child_env(source))


def run_app(source: bool, command: list[str] | None = None) -> float:
    with tempfile.TemporaryDirectory(prefix="lemon-desk-startup-") as tmp:
        env = child_env(
            source,
            LEMON_DESK_PRINT_READY="1",
            LEMON_DESK_HOME=str(Path(tmp) / "home"),
            HF_HOME=str(Path(tmp) / "hf"),
        )
        return time_to_ready(command or app_command(), env)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7, help="counted runs of each (default 7)")
    parser.add_argument("--source", action="store_true", help="keep PYTHONDONTWRITEBYTECODE as it is")
    parser.add_argument("--bundle", type=Path, help="also time this packaged app folder (dist/lemon-desk)")
    args = parser.parse_args()
    bundle_command = [str(args.bundle.resolve() / "lemon-desk")] if args.bundle else None
    run_bare(args.source), run_app(args.source)  # warm the disk cache (and write the byte code)
    if bundle_command:
        run_app(args.source, bundle_command)
    bare: list[float] = []
    app: list[float] = []
    bundle: list[float] = []
    for _ in range(args.rounds):
        bare.append(run_bare(args.source))
        app.append(run_app(args.source))
        if bundle_command:
            bundle.append(run_app(args.source, bundle_command))
    bare_s, app_s = statistics.median(bare), statistics.median(app)
    print(f"bare PySide6 window: median {bare_s:.3f} s  (runs: {' '.join(f'{t:.3f}' for t in bare)})")
    print(f"lemon-desk window  : median {app_s:.3f} s  (runs: {' '.join(f'{t:.3f}' for t in app)})")
    ratio = app_s / bare_s
    print(f"ratio app / bare   : {ratio:.2f}  (target <= 3: {'met' if ratio <= 3 else 'NOT met'})")
    if bundle:
        bundle_s = statistics.median(bundle)
        print(f"packaged window    : median {bundle_s:.3f} s  (runs: {' '.join(f'{t:.3f}' for t in bundle)})")
        print(f"ratio packaged / pip-installed: {bundle_s / app_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
