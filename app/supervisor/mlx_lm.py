"""The ``mlx-lm`` backend's virtual environment: pinned ``mlx`` + ``mlx-lm`` from the package index.

``build_venv`` makes the venv in a folder the installer gives it (its staging folder), reports pip's
progress line by line, and checks the result (``import mlx.core, mlx_lm``). The installer writes the
manifest and swaps the folder into place, so a crash or a cancel leaves the old install or none.
Cancelling kills pip and everything it started (its process group), and always reaps it.

The venv is made by ``uv`` (the pinned PyPI ``uv``'s static binary; a frozen bundle ships it as
``uv/uv``), because a frozen app has no ``python -m venv`` of its own. Its Python: the app's own when the
app runs from a Python (``sys.executable``); in a frozen bundle, the first Python in ``PYTHON_REQUEST``
that uv finds (its own managed Pythons, then ``python3.x`` on ``PATH``), else one uv downloads (its
managed CPython builds, from GitHub). pip is then put into the venv from that Python's own ``ensurepip``
(offline) and installs the packages as before, so pip's configuration (index, mirrors) and its progress
lines apply unchanged.

A venv may be moved once built: ``python -m ...`` through its ``bin/python`` finds its packages from
``pyvenv.cfg`` beside it, and the app never runs the console scripts whose first line names the old place.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from app.core.backends import BackendKind, BackendSpec
from app.core.errors import InstallError
from app.supervisor.process import signal_group

KILL_GRACE_S = 5.0
ERROR_TAIL_LINES = 12
# The Pythons a frozen app may build the venv on: those mlx and mlx-lm publish wheels for.
PYTHON_REQUEST = ">=3.10,<3.14"


class PipPhase(Enum):
    VENV = "venv"  # creating the virtual environment
    RESOLVE = "resolve"  # pip is finding the packages and their dependencies
    DOWNLOAD = "download"  # pip is fetching a package
    INSTALL = "install"  # pip is unpacking the packages into the venv
    VERIFY = "verify"  # importing mlx and mlx_lm from the new venv


@dataclass(frozen=True)
class PipProgress:
    phase: PipPhase
    message: str
    packages: int  # packages pip has named so far (the total is unknown until it installs)


_COLLECT = re.compile(r"^(Collecting|Processing|Requirement already satisfied:)\s+(\S+)")
_DOWNLOAD = re.compile(r"^\s*(Downloading|Using cached)\s+(\S+)(?:\s+\(([^)]*)\))?")
_INSTALLING = re.compile(r"^Installing collected packages:\s*(.*)$")


def parse_pip_line(line: str) -> tuple[PipPhase, str, bool] | None:
    """(phase, message, names a new package) for a line of ``pip install`` output, else None."""
    if match := _INSTALLING.match(line):
        count = len([p for p in match[1].split(",") if p.strip()])
        return PipPhase.INSTALL, f"Installing {count} packages", False
    if match := _DOWNLOAD.match(line):
        name = Path(match[2]).name
        return PipPhase.DOWNLOAD, f"{match[1]} {name}" + (f" ({match[3]})" if match[3] else ""), False
    if match := _COLLECT.match(line):
        return PipPhase.RESOLVE, f"Found {Path(match[2]).name}", True
    if line.startswith("Successfully installed"):
        return PipPhase.INSTALL, "Packages installed", False
    return None


def venv_python(folder: Path) -> Path:
    return folder / "bin" / "python"


def frozen() -> bool:
    """True inside a PyInstaller bundle."""
    return bool(getattr(sys, "frozen", False))


def uv_binary() -> Path:
    """uv's static binary: the copy a frozen bundle ships, else the pinned ``uv`` package's."""
    if frozen():
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "uv" / "uv"
    from uv import find_uv_bin

    return Path(find_uv_bin())


def venv_base_python() -> str:
    """What ``uv venv --python`` is asked for: this Python, or in a bundle any Python mlx supports."""
    return PYTHON_REQUEST if frozen() else sys.executable


def _requirements(spec: BackendSpec, os_name: str) -> Sequence[str]:
    if spec.kind is not BackendKind.PIP or os_name not in spec.packages:
        raise InstallError(f"{spec.key} has no package list for {os_name}.")
    return spec.packages[os_name]


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Terminate the process group, wait a grace period, kill it; always reap."""
    if proc.returncode is None:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(proc.wait()), KILL_GRACE_S)
        except (TimeoutError, asyncio.CancelledError):
            signal_group(proc.pid, signal.SIGKILL)
    await proc.wait()


NETWORK_HINT = "Check the network connection to the package index, then try again."
NO_PYTHON_HINT = (
    f"The mlx-lm backend needs a Python {PYTHON_REQUEST} with ensurepip (python.org's, Homebrew's, or "
    "Debian's python3 with python3-venv); install one, or let uv download one (needs github.com)."
)


async def _run(
    argv: Sequence[str],
    what: str,
    on_line: Callable[[str], None],
    env: dict[str, str] | None = None,
    hint: str = NETWORK_HINT,
) -> None:
    """Run a command to completion, feeding each output line; InstallError with its last lines."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # pip's own children die with it on cancel
        env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
    )
    tail: deque[str] = deque(maxlen=ERROR_TAIL_LINES)
    try:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip()
            tail.append(line)
            on_line(line)
        code = await proc.wait()
    finally:
        await _stop(proc)
    if code != 0:
        output = "\n".join(tail)
        raise InstallError(
            f"{what} failed (exit code {code}): {output.splitlines()[-1] if output else 'no output'}", hint
        )


async def build_venv(
    spec: BackendSpec,
    os_name: str,
    folder: Path,
    on_progress: Callable[[PipProgress], None],
    python: str | None = None,
) -> Sequence[str]:
    """Make a venv in ``folder`` holding the spec's pinned packages; returns the requirements."""
    requirements = _requirements(spec, os_name)
    packages = 0

    def report(phase: PipPhase, message: str) -> None:
        on_progress(PipProgress(phase, message, packages))

    def on_pip_line(line: str) -> None:
        nonlocal packages
        parsed = parse_pip_line(line)
        if parsed is not None:
            phase, message, new_package = parsed
            packages += new_package
            report(phase, message)

    def on_uv_line(line: str) -> None:
        if line.startswith(("Using ", "Downloading ", "Downloaded ")):  # which Python; a Python download
            report(PipPhase.VENV, line.split(" interpreter at")[0].strip())

    report(PipPhase.VENV, "Creating the virtual environment")
    uv_venv = [str(uv_binary()), "venv", "--no-project", "--no-config", "--python"]
    await _run(
        [*uv_venv, python or venv_base_python(), str(folder)],
        "Creating the virtual environment",
        on_uv_line,
        env={"NO_COLOR": "1"},
        hint=NO_PYTHON_HINT,
    )
    await _run(
        [str(venv_python(folder)), "-m", "ensurepip", "--upgrade", "--default-pip"],
        "Putting pip into the virtual environment",
        lambda _: None,
        hint=NO_PYTHON_HINT,
    )
    report(PipPhase.RESOLVE, f"Installing {', '.join(requirements)}")
    pip = [str(venv_python(folder)), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
    await _run(
        [*pip, *requirements],
        f"Installing {', '.join(requirements)}",
        on_pip_line,
        env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    report(PipPhase.VERIFY, "Checking that mlx and mlx-lm load")
    await _run(
        [str(venv_python(folder)), "-c", "import mlx.core, mlx_lm"],
        "Loading mlx in the new environment",
        lambda _: None,
    )
    return requirements
