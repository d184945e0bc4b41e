"""The ``mlx-lm`` backend: pinned ``mlx`` + ``mlx-lm`` from the package index in a venv the app owns.

The venv is built in a staging folder, checked (``import mlx.core, mlx_lm``), given its install
manifest last, then swapped into ``<engines>/lemon-mlx/mlx-lm``: a crash or a cancel at any moment
leaves either the old install or none, never half of one. Cancelling kills pip (its whole process
group) and removes the staging folder.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from app.core.backends import BackendKind, BackendSpec
from app.core.errors import InstallError
from app.store.installs import InstallManifest, install_dir, write_manifest
from app.store.paths import home

KILL_GRACE_S = 5.0
ERROR_TAIL_LINES = 12


class PipPhase(Enum):
    VENV = "venv"  # creating the virtual environment
    RESOLVE = "resolve"  # pip is finding the packages and their dependencies
    DOWNLOAD = "download"  # pip is fetching a package
    INSTALL = "install"  # pip is unpacking the packages into the venv
    VERIFY = "verify"  # importing mlx and mlx_lm from the new venv
    DONE = "done"  # installed and swapped into place


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


def _requirements(spec: BackendSpec, os_name: str) -> Sequence[str]:
    if spec.kind is not BackendKind.PIP or os_name not in spec.packages:
        raise InstallError(f"{spec.key} has no package list for {os_name}.")
    return spec.packages[os_name]


async def _stop(proc: asyncio.subprocess.Process) -> None:
    """Terminate the process group, wait a grace period, kill it; always reap."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


async def _run(
    argv: Sequence[str], what: str, on_line: Callable[[str], None], env: dict[str, str] | None = None
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
            f"{what} failed (exit code {code}): {output.splitlines()[-1] if output else 'no output'}",
            "Check the network connection to the package index, then try again.",
        )


def staging_dir(recipe: str, backend: str) -> Path:
    """Where an install is built: beside the engines folder (same disk, so renames are atomic), but
    outside it, so a half-made install is never listed as installed."""
    return home() / "partial" / f"{recipe}-{backend}"


def _swap_into_place(staging: Path, final: Path) -> None:
    """Replace ``final`` with ``staging`` by renames: the old install stays until the new one is in."""
    old = staging.with_name(staging.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        os.replace(final, old)
    os.replace(staging, final)
    shutil.rmtree(old, ignore_errors=True)


async def install_pip_backend(
    spec: BackendSpec,
    os_name: str,
    on_progress: Callable[[PipProgress], None],
    python: str = sys.executable,
) -> Path:
    """Install a pip backend (``lemon-mlx:mlx-lm``) and return its folder."""
    requirements = _requirements(spec, os_name)
    staging = staging_dir(spec.recipe, spec.name)
    shutil.rmtree(staging, ignore_errors=True)  # what a crashed or cancelled install left
    staging.parent.mkdir(parents=True, exist_ok=True)
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

    try:
        report(PipPhase.VENV, "Creating the virtual environment")
        await _run([python, "-m", "venv", str(staging)], "Creating the virtual environment", lambda _: None)
        report(PipPhase.RESOLVE, f"Installing {', '.join(requirements)}")
        pip = [str(venv_python(staging)), "-m", "pip", "install", "--no-input", "--progress-bar", "off"]
        await _run(
            [*pip, *requirements],
            f"Installing {', '.join(requirements)}",
            on_pip_line,
            env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        )
        report(PipPhase.VERIFY, "Checking that mlx and mlx-lm load")
        await _run(
            [str(venv_python(staging)), "-c", "import mlx.core, mlx_lm"],
            "Loading mlx in the new environment",
            lambda _: None,
        )
        write_manifest(staging, InstallManifest(spec.version, " ".join(requirements), ""))
        final = install_dir(spec.recipe, spec.name)
        _swap_into_place(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    report(PipPhase.DONE, f"Installed {spec.key} {spec.version}")
    return final
