"""Install, update and uninstall engine backends from their pinned release assets.

An install downloads into ``<home>/staging/<recipe>-<backend>/`` (resuming a partial file left by a
crashed run), verifies the SHA-256 the versions file gives, unpacks and checks the archive there, writes
the manifest, then swaps the folder into ``<home>/engines/<recipe>/<backend>/`` in one step. Until that
step the old install is untouched and usable; after it, or after any failure or cancellation, the
staging folder is gone. A pip backend (``lemon-mlx:mlx-lm``) goes the same way, with a virtual
environment built by pip (``app.supervisor.mlx_lm``) in place of the unpacked archive.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import secrets
import shutil
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.backends import BackendKey, BackendKind, BackendSpec, BackendState, release_asset_digest
from app.core.errors import DownloadError, InstallError, UnsupportedError
from app.core.launch import ENGINE_BINARY
from app.core.lemon_mlx import MLX_LM
from app.core.matrix import BackendStatus
from app.store.files import inside
from app.store.installs import InstallManifest, install_dir, read_manifest, write_manifest
from app.store.paths import staging_dir
from app.supervisor.archive import Cancelled, find_binary, make_executable, unpack
from app.supervisor.fetch import Progress, fetch, partial_path
from app.supervisor.mlx_lm import PipPhase, build_venv, venv_python

if TYPE_CHECKING:
    import httpx


class InstallPhase(Enum):
    DOWNLOADING = "downloading"  # fetching the release asset; updates carry bytes, speed and ETA
    UNPACKING = "unpacking"  # checking and unpacking the archive into the staging folder
    PREPARING = "preparing"  # pip backend: creating its virtual environment
    INSTALLING_PACKAGES = "installing packages"  # pip backend: pip runs; ``detail`` is its latest step
    CHECKING = "checking"  # pip backend: loading the installed packages once


_PIP_PHASES = {
    PipPhase.VENV: InstallPhase.PREPARING,
    PipPhase.RESOLVE: InstallPhase.INSTALLING_PACKAGES,
    PipPhase.DOWNLOAD: InstallPhase.INSTALLING_PACKAGES,
    PipPhase.INSTALL: InstallPhase.INSTALLING_PACKAGES,
    PipPhase.VERIFY: InstallPhase.CHECKING,
}


@dataclass(frozen=True)
class InstallUpdate:
    phase: InstallPhase
    progress: Progress | None = None
    detail: str = ""  # pip backends: what pip is doing ("Downloading mlx_cpu-0.32.4-....whl (10 MB)")


UpdateCallback = Callable[[InstallUpdate], None]


def installed_binary(recipe: str, backend: str) -> Path | None:
    """The engine executable of a complete install (a pip backend's: its venv's python), or None."""
    folder = install_dir(recipe, backend)
    if read_manifest(folder) is None:
        return None
    if backend == MLX_LM:
        python = venv_python(folder)
        return python if python.exists() else None
    return find_binary(folder, ENGINE_BINARY.get(recipe, recipe))


async def install_backend(
    spec: BackendSpec,
    status: BackendStatus,
    client: httpx.Client,
    on_update: UpdateCallback | None = None,
) -> InstallManifest:
    """Install (or update) one backend. Refuses, before any download, what cannot run here."""
    if status.state is BackendState.UNSUPPORTED:
        raise UnsupportedError(f"{spec.key} cannot run on this machine: {status.message}")
    if spec.kind is BackendKind.SYSTEM:
        raise InstallError(
            f"{spec.key} uses a {spec.binary} you install yourself; Lemon Desk does not install it.",
            f"Put {spec.binary} on your PATH, or set its path in Settings.",
        )
    current = read_manifest(install_dir(spec.recipe, spec.name))
    if current is not None and current.version == spec.version:
        return current
    report = on_update or (lambda _u: None)
    if spec.kind is not BackendKind.PIP and (
        spec.kind is not BackendKind.RELEASE or not status.asset or not status.url
    ):
        raise InstallError(f"This build of Lemon Desk cannot install {spec.key} yet.")
    try:
        if spec.kind is BackendKind.PIP:
            return await _install_pip(spec, report)
        return await _install_release(spec, status.asset or "", status.url or "", client, report)
    except OSError as err:  # the disk (full, read-only), not the network: fetch says so itself
        where = f" ({err.filename})" if err.filename else ""
        raise InstallError(
            f"Could not install {spec.key}: {err.strerror}{where}. Nothing was installed.",
            "Free some disk space (or make the app's folder writable), then install again.",
        ) from None


async def expected_digest(
    spec: BackendSpec, asset: str, url: str, client: httpx.Client
) -> tuple[str | None, str]:
    """The SHA-256 the asset must have and where it comes from: the pin in backend_versions.json, else
    the release's metadata (GitHub's API, or the mirror's ``/api/v3``). (None, "") when neither has
    one: the install goes on, and is shown as unverified. A pin the release contradicts is refused."""
    pinned = spec.sha256.get(asset)
    released = await asyncio.to_thread(_release_digest, client, spec.release_api_url(url), asset)
    if pinned and released and pinned != released:
        raise InstallError(
            f"The pinned SHA-256 of {asset} ({pinned}) is not the one its release gives ({released}). "
            "Nothing was installed.",
            "Report the pin as broken; do not install this asset by hand.",
        )
    if pinned:
        return pinned, "pin"
    return (released, "release") if released else (None, "")


def _release_digest(client: httpx.Client, api_url: str, asset: str) -> str | None:
    import httpx

    try:
        response = client.get(api_url, headers={"Accept": "application/vnd.github+json"}, timeout=15.0)
        if response.status_code != 200:
            return None
        return release_asset_digest(response.json(), asset)
    except (httpx.HTTPError, ValueError, RecursionError):
        return None


@contextlib.contextmanager
def _staging(spec: BackendSpec) -> Iterator[Path]:
    """The backend's claimed staging folder, removed afterwards whatever happens."""
    work = staging_dir() / f"{spec.recipe}-{spec.name}"
    with _claimed(work, spec.key):
        try:
            yield work
        finally:
            shutil.rmtree(work, ignore_errors=True)
            with contextlib.suppress(OSError):
                staging_dir().rmdir()  # only when empty


async def _install_pip(spec: BackendSpec, report: UpdateCallback) -> InstallManifest:
    """Build the venv in staging (pip, then an import check), write the manifest, swap it in."""
    # pip installs for the machine the app runs on, whatever hardware profile is mocked.
    os_name = "macos" if sys.platform == "darwin" else "linux"
    with _staging(spec) as work:
        _clear_leftovers(work)
        venv = work / "venv"
        requirements = await build_venv(
            spec, os_name, venv, lambda p: report(InstallUpdate(_PIP_PHASES[p.phase], detail=p.message))
        )
        manifest = InstallManifest(spec.version, " ".join(requirements), "")
        write_manifest(venv, manifest)
        _swap_into_place(venv, install_dir(spec.recipe, spec.name), work / "previous")
        return manifest


async def _install_release(
    spec: BackendSpec, asset: str, url: str, client: httpx.Client, report: UpdateCallback
) -> InstallManifest:
    with _staging(spec) as work:
        download = inside(work, work / asset)
        _clear_leftovers(work, keep=partial_path(download))
        report(InstallUpdate(InstallPhase.DOWNLOADING))
        expected, source = await expected_digest(spec, asset, url, client)
        try:
            digest = await fetch(
                client,
                url,
                download,
                sha256=expected,
                on_progress=lambda p: report(InstallUpdate(InstallPhase.DOWNLOADING, p)),
            )
        except DownloadError as err:
            raise InstallError(f"Could not install {spec.key}: {err.message}", err.hint) from None
        report(InstallUpdate(InstallPhase.UNPACKING))
        unpacked = work / "unpacked"
        await _in_thread(lambda cancel: _unpack_checked(download, unpacked, spec.recipe, cancel))
        manifest = InstallManifest(spec.version, asset, digest, source)
        write_manifest(unpacked, manifest)
        _swap_into_place(unpacked, install_dir(spec.recipe, spec.name), work / "previous")
        return manifest


def _unpack_checked(archive: Path, dest: Path, recipe: str, cancel: threading.Event) -> None:
    unpack(archive, dest, cancel)
    name = ENGINE_BINARY.get(recipe, recipe)
    binary = find_binary(dest, name)
    if binary is None:
        raise InstallError(
            f"{archive.name} holds no {name}, so it is not a {recipe} release. Nothing was installed.",
            "Check the release mirror, or report the pin as broken.",
        )
    make_executable(binary)


async def _in_thread(job: Callable[[threading.Event], None]) -> None:
    """Run blocking file work in a thread; on cancellation, tell it to stop and wait until it has."""
    cancel = threading.Event()
    task = asyncio.ensure_future(asyncio.to_thread(job, cancel))
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        cancel.set()
        with contextlib.suppress(Cancelled, InstallError):
            await task
        raise


@contextlib.contextmanager
def _claimed(work: Path, key: BackendKey) -> Iterator[None]:
    """An exclusive lock on the staging folder: two app processes never install one backend at once."""
    work.mkdir(parents=True, exist_ok=True)
    fd = os.open(work, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InstallError(
                f"{key} is being installed by another Lemon Desk right now.", "Wait for it to finish."
            ) from None
        yield
    finally:
        os.close(fd)


def _clear_leftovers(work: Path, keep: Path | None = None) -> None:
    """Remove what a crashed run left, except its partial download (resumed with a Range request)."""
    for item in work.iterdir():
        if item == keep:
            continue
        if item.is_dir() and not item.is_symlink():
            shutil.rmtree(item)
        else:
            item.unlink()


_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2); False where the system cannot."""
    if _libc is None or not hasattr(_libc, "renameat2"):
        return False
    return bool(_libc.renameat2(_AT_FDCWD, bytes(a), _AT_FDCWD, bytes(b), _RENAME_EXCHANGE) == 0)


def _swap_into_place(new: Path, target: Path, previous: Path) -> None:
    """Put ``new`` at ``target``; an existing install ends up at ``previous`` (deleted by the caller)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.exists():
        os.rename(new, target)
    elif _exchange(new, target):
        os.rename(new, previous)
    else:
        os.rename(target, previous)
        os.rename(new, target)


def uninstall_backend(recipe: str, backend: str) -> bool:
    """Remove an install; False when there was none. It disappears in one step, then is deleted."""
    target = install_dir(recipe, backend)
    if not target.exists():
        return False
    trash = staging_dir() / f"removing-{recipe}-{backend}-{secrets.token_hex(4)}"
    trash.parent.mkdir(parents=True, exist_ok=True)
    os.rename(target, trash)
    shutil.rmtree(trash, ignore_errors=True)
    with contextlib.suppress(OSError):
        staging_dir().rmdir()
    return True
