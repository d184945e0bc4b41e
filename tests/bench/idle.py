"""Idle: the window app's own CPU and memory with a model loaded and telemetry on, against a bare PySide6
window's, all measured over the same seconds.

The app is the real window process, started as ``python -m app`` starts it (``runpy`` of the ``app``
package, ``QT_QPA_PLATFORM=offscreen``, ``LEMON_DESK_PRINT_READY=1``) in its own process group, with an
``LEMON_DESK_HOME`` in a temporary folder: settings that name the cached real llama-server as the
``system`` backend and put the local API on a free port, and SmolLM2-135M imported. Once the window is
shown, SmolLM2 is loaded through the window's own API (``POST /api/v1/load``) and waited for in
``GET /api/v1/health``.

"Telemetry on" can be read two ways, so two apps run side by side (each its own home, port and engine)
and each is judged:

- status bar only: the engine's CPU and memory in the status bar, sampled every 2 s whenever a model is
  loaded (``Router.sample_usage``); this is on for everyone;
- Telemetry tab shown: that, and the Telemetry tab on screen, so that the machine and the engine are
  sampled every second and charted (``Router.watch_system``). The app keeps no state that opens the window
  on that tab, so the launcher does what a click on it does once the window has started
  (``side.setCurrentWidget(telemetry)``); nothing is added to the app itself.

The launcher prints a line at the first sample of each kind, so the bench knows that sampling runs.

After ``--settle`` seconds, each app process alone (not its llama-server, whose pid is printed) and a bare
``QMainWindow`` process (startup.py's, started with them) are read every ``SAMPLE_S`` seconds over
``--seconds``: CPU time over wall time, as % of one core, and memory as psutil reads it from ``/proc``:
RSS, PSS, USS, and private dirty pages plus swap. CPU time is the scheduler's run time of every thread,
in nanoseconds (``run_time_s``), not user + system time, whose 10 ms ticks could not tell apart figures
0.03% of a core apart over 30 s.

Which memory figure the target is judged on: USS, the pages only this process maps, which would be freed
if it ended. RSS also counts shared pages (libc, and the Qt libraries whenever another process maps
them too); PSS shares those out. macOS's Activity Monitor shows the phys footprint: the private dirty
pages and what was compressed or swapped, not clean file pages. On Linux that is closest to private
dirty + swap, also printed; USS is that plus this process's clean private pages (mostly the Qt and
Python libraries' code, which only this process maps), so a USS under the target puts the footprint
under it too. Figures are in MiB, as the window's status bar counts its "MB".

Targets (PRODUCT.md): CPU < 0.5% of one core; memory (USS) < 200 MB. Linux only (``/proc``).

Everything is stopped on every path, Ctrl-C included: each app is asked to quit (SIGTERM, which quits it
as its Quit does, stopping its engine), then its process group is killed and reaped, as is the bare
window's; its engine is then waited for and named as an orphan if it outlived the app.

    .venv/bin/python tests/bench/idle.py [--settle S] [--seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.store.library import Library
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings, save_settings
from tests.bench.startup import BARE_WINDOW
from tests.support.llama import build_llama_server, fetch_smollm_gguf

ROOT = Path(__file__).resolve().parents[2]
MODEL = "user.smol"  # an imported model is in the user. namespace
MB = 1024 * 1024  # as the window's status bar counts
CPU_TARGET_PERCENT = 0.5
MEMORY_TARGET_MB = 200
SAMPLE_S = 5.0
READY_TIMEOUT_S = 60.0
LOAD_TIMEOUT_S = 120.0
QUIT_GRACE_S = 30.0  # the app stops its engine before it exits
ORPHAN_GRACE_S = 5.0


# The two ways of having telemetry on, each an app of its own (its own home, API port and engine).
STATUS_BAR = "status-bar"  # the status bar's engine CPU and memory, sampled every 2 s with a model loaded
TELEMETRY_TAB = "telemetry-tab"  # that, and the Telemetry tab on screen: charts fed once a second
BARE = "bare"
LABELS = {
    BARE: "bare PySide6 window",
    STATUS_BAR: "app, status bar only",
    TELEMETRY_TAB: "app, Telemetry tab shown",
}

# ``python -m app``; given ``telemetry-tab``, the Telemetry tab is clicked once the window has started. A line
# is printed at the first sample of each kind, so the bench knows that sampling runs.
APP = """
import runpy, sys
from app.ui.desktop import DesktopApp

tab_shown = sys.argv[1:] == ["telemetry-tab"]
start = DesktopApp.start

def once(sig, line):
    def said(_event):
        sig.disconnect(said)
        print(line, flush=True)
    sig.connect(said)

def start_with_telemetry(self):
    start(self)
    once(self.bridge.usage_changed, "engine usage sampled")
    if tab_shown:
        once(self.bridge.system_sampled, "system sampled")
        self.window.side.setCurrentWidget(self.window.telemetry)

DesktopApp.start = start_with_telemetry
sys.argv = ["lemon-desk"]
runpy.run_module("app", run_name="__main__", alter_sys=True)
"""


class Child:
    """A process in a group of its own; its output lines are read in a thread, so it never blocks on a
    full pipe, and waited for by their start."""

    def __init__(self, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        with log.open("wb") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                env=dict(env),
                cwd=ROOT,
                start_new_session=True,
            )
        self.pid = self.proc.pid
        self.descendants: dict[int, psutil.Process] = {}
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as lines:
            for line in lines:
                self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, start: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"{self.name}: no {start!r} line in {timeout_s:.0f} s{self.tail()}"
                ) from None
            if line is None:
                raise RuntimeError(
                    f"{self.name} ended (exit {self.proc.wait()}) before {start!r}{self.tail()}"
                )
            if line.startswith(start):
                return line

    def tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace").splitlines()[-lines:]
        return "".join(f"\n  {line}" for line in text)

    def note_descendants(self) -> list[psutil.Process]:
        """Its child processes now (engines), remembered so that stopping it can check they went too."""
        with contextlib.suppress(psutil.Error):
            for proc in psutil.Process(self.pid).children(recursive=True):
                self.descendants.setdefault(proc.pid, proc)
        return list(self.descendants.values())

    def stop(self, quit_grace_s: float = 0.0) -> list[psutil.Process]:
        """SIGTERM and up to ``quit_grace_s`` to quit, then SIGKILL to the group; reaped. Returns the
        descendants still alive ``ORPHAN_GRACE_S`` later, killed (orphans: a failure)."""
        self.note_descendants()
        if quit_grace_s and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=quit_grace_s)
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait()
        self._reader.join(timeout=ORPHAN_GRACE_S)  # the pipe ends with the last process holding it
        alive: list[psutil.Process]
        _, alive = psutil.wait_procs(list(self.descendants.values()), timeout=ORPHAN_GRACE_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(alive, timeout=ORPHAN_GRACE_S)
        return alive


@contextlib.contextmanager
def running(
    name: str, argv: list[str], env: Mapping[str, str], log: Path, quit_grace_s: float = 0.0
) -> Iterator[Child]:
    child = Child(name, argv, env, log)
    try:
        yield child
    finally:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C does not cut this short
        try:
            orphans = child.stop(quit_grace_s)
        finally:
            signal.signal(signal.SIGINT, previous)
        for proc in orphans:
            print(f"ORPHAN: pid {proc.pid} outlived {name} (pid {child.pid}); killed", file=sys.stderr)
        if orphans:
            raise RuntimeError(f"{len(orphans)} process(es) outlived {name}")


@dataclass(frozen=True)
class Reading:
    at: float  # time.monotonic()
    cpu_s: float  # run time of all its threads, this process only (not its children)
    rss: int
    pss: int
    uss: int
    private_dirty: int  # with swap: the closest Linux figure to macOS's phys footprint


def dirty_and_swap(pid: int) -> int:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as rollup:
        for line in rollup:
            key, _, rest = line.partition(":")
            if key in ("Private_Dirty", "Swap"):
                fields[key] = int(rest.split()[0]) * 1024
    return fields["Private_Dirty"] + fields["Swap"]


def run_time_s(pid: int) -> float:
    """The time the scheduler ran each of the process's threads, summed, in nanoseconds as it counts them
    (``/proc/PID/task/TID/schedstat``): user + system time come in 10 ms ticks, 0.03% of a core over
    30 s, too coarse for figures a tenth of a percent apart. A thread that ended is no longer counted,
    so the app's threads that come and go (none at idle) would make this read low."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def read(proc: psutil.Process) -> Reading:
    at = time.monotonic()
    cpu_s = run_time_s(proc.pid)
    memory = proc.memory_full_info()
    return Reading(at, cpu_s, memory.rss, memory.pss, memory.uss, dirty_and_swap(proc.pid))


@dataclass(frozen=True)
class Figures:
    readings: list[Reading]

    @property
    def cpu_percent(self) -> float:
        first, last = self.readings[0], self.readings[-1]
        return 100 * (last.cpu_s - first.cpu_s) / (last.at - first.at)

    @property
    def busiest_percent(self) -> float:
        pairs = zip(self.readings, self.readings[1:], strict=False)
        return max(100 * (b.cpu_s - a.cpu_s) / (b.at - a.at) for a, b in pairs)

    def peak(self, field: str) -> float:
        return max(float(getattr(r, field)) for r in self.readings) / MB

    def growth(self, field: str) -> float:
        return (float(getattr(self.readings[-1], field)) - float(getattr(self.readings[0], field))) / MB


def measure(pids: Mapping[str, int], seconds: float) -> dict[str, Figures]:
    """Read each process every ``SAMPLE_S`` over ``seconds``, all at the same moments."""
    procs = {name: psutil.Process(pid) for name, pid in pids.items()}
    readings: dict[str, list[Reading]] = {name: [] for name in procs}
    started = time.monotonic()
    samples = max(1, round(seconds / SAMPLE_S))
    for i in range(samples + 1):
        time.sleep(max(0.0, started + i * seconds / samples - time.monotonic()))
        for name, proc in procs.items():
            readings[name].append(read(proc))
    return {name: Figures(r) for name, r in readings.items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load_through_api(base: str, model: str) -> None:
    """Wait for the window's API, load ``model`` through it, and wait until health lists it."""
    with httpx.Client(base_url=base, trust_env=False, timeout=10.0) as client:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            with contextlib.suppress(httpx.TransportError):
                if client.get("/api/v1/health").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the window's API at {base} did not answer in {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        reply = client.post("/api/v1/load", json={"model_name": model}, timeout=LOAD_TIMEOUT_S)
        if reply.status_code != 200:
            raise RuntimeError(f"POST /api/v1/load: HTTP {reply.status_code}: {reply.text}")
        health = client.get("/api/v1/health").json()
        if model not in [m["model_name"] for m in health["all_models_loaded"]]:
            raise RuntimeError(f"{model} loaded, but /api/v1/health does not list it: {health}")


def report(figures: Mapping[str, Figures], args: argparse.Namespace, engines: list[int]) -> None:
    """The table, the ratios to the bare window, the Telemetry tab's own cost, and the targets for each way
    of having telemetry on."""

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}x" if b > 0 else "n/a"

    bare, modes = figures[BARE], (STATUS_BAR, TELEMETRY_TAB)
    fields = [("rss", "RSS MiB", 10), ("pss", "PSS MiB", 10), ("uss", "USS MiB", 10)]
    fields.append(("private_dirty", "dirty+swap MiB", 16))
    print(
        f"Lemon Desk windows with SmolLM2-135M loaded on llama-server (pids {', '.join(map(str, engines))},"
        f" not counted); {args.settle:.0f} s settle, {args.seconds:.0f} s measured"
    )
    print(f"{'':36}{'CPU % of a core':>16}" + "".join(f"{title:>{w}}" for _, title, w in fields))
    for mode in (BARE, *modes):
        memory = "".join(f"{figures[mode].peak(f):>{w}.1f}" for f, _, w in fields)
        print(f"{LABELS[mode]:36}{figures[mode].cpu_percent:>16.3f}{memory}")
    for mode in modes:
        app = figures[mode]
        ratios = "".join(f"{ratio(app.peak(f), bare.peak(f)):>{w}}" for f, _, w in fields)
        print(f"{'  ' + LABELS[mode] + ' / bare':36}{ratio(app.cpu_percent, bare.cpu_percent):>16}{ratios}")
    tab, status = figures[TELEMETRY_TAB], figures[STATUS_BAR]
    cpu_cost, uss_cost = tab.cpu_percent - status.cpu_percent, tab.peak("uss") - status.peak("uss")
    print(
        f"the Telemetry tab's own cost (tab shown - status bar only): CPU {cpu_cost:+.3f}% of a core,"
        f" USS {uss_cost:+.1f} MiB"
    )
    for mode in modes:
        print(
            f"{LABELS[mode]}: busiest {SAMPLE_S:.0f} s {figures[mode].busiest_percent:.2f}% of a core;"
            f" USS change over the window {figures[mode].growth('uss'):+.1f} MiB"
        )
    print(f"memory: the peak of {len(bare.readings)} readings {SAMPLE_S:.0f} s apart")
    for mode in modes:
        cpu, uss = figures[mode].cpu_percent, figures[mode].peak("uss")
        cpu_met = "met" if cpu < CPU_TARGET_PERCENT else "NOT met"
        memory_met = "met" if uss < MEMORY_TARGET_MB else "NOT met"
        print(
            f"targets, {LABELS[mode]}: CPU < {CPU_TARGET_PERCENT}% of one core: {cpu_met} ({cpu:.3f}%);"
            f" memory (USS) < {MEMORY_TARGET_MB} MB: {memory_met} ({uss:.1f} MiB)"
        )


def prepare_home(home: Path, server_dir: Path, model: Path) -> int:
    """An app home whose settings name the real llama-server as the ``system`` backend and put the API on
    a free port (returned), with ``model`` imported."""
    os.environ["LEMON_DESK_HOME"] = str(home)  # where the store's functions write
    port = free_port()
    settings = Settings(llama_server_path=str(server_dir / "llama-server"), api_port=port)
    save_settings(settings)
    Library(settings).import_path(model, name=MODEL)
    save_model_options({MODEL: ModelOptions(backend="system")})
    return port


def bench(args: argparse.Namespace, tmp: Path) -> None:
    server_dir, model = build_llama_server(print), fetch_smollm_gguf(print)
    os.environ["HF_HOME"] = str(tmp / "hf")
    os.environ["LD_LIBRARY_PATH"] = str(server_dir)
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    apps = {  # the status bar alone, and with the Telemetry tab on screen: each its own home and API port
        mode: prepare_home(tmp / mode, server_dir, model) for mode in (STATUS_BAR, TELEMETRY_TAB)
    }
    with contextlib.ExitStack() as stack:
        bare = stack.enter_context(
            running("the bare window", [sys.executable, "-c", BARE_WINDOW], env, tmp / "bare.log")
        )
        children: dict[str, Child] = {}
        for mode in apps:
            app_env = {**env, "LEMON_DESK_HOME": str(tmp / mode), "LEMON_DESK_PRINT_READY": "1"}
            argv = [sys.executable, "-c", APP, mode]
            children[mode] = stack.enter_context(
                running(f"the app ({mode})", argv, app_env, tmp / f"{mode}.log", QUIT_GRACE_S)
            )
        bare.wait_for("window shown")
        engines: list[int] = []
        for mode, app in children.items():
            app.wait_for("window shown")
            if mode == TELEMETRY_TAB:
                app.wait_for("system sampled")
            load_through_api(f"http://127.0.0.1:{apps[mode]}", MODEL)
            engines += [p.pid for p in app.note_descendants() if "llama-server" in p.name()]
            app.wait_for("engine usage sampled")
        if len(engines) != len(children):
            raise RuntimeError(f"{MODEL} is loaded, but not one llama-server runs under each app: {engines}")
        time.sleep(args.settle)
        pids = {BARE: bare.pid, **{mode: app.pid for mode, app in children.items()}}
        figures = measure(pids, args.seconds)
    report(figures, args, engines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after the load before measuring")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds measured (default 30)")
    args = parser.parse_args()

    def interrupted(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)  # stopped from outside: clean up as after Ctrl-C
    try:
        with tempfile.TemporaryDirectory(prefix="lemon-desk-idle-") as tmp:
            bench(args, Path(tmp))
    except KeyboardInterrupt:
        print("interrupted: every process the bench started is stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
