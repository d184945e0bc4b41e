"""The REAL lemon-mlx-engine for tests: its Linux CPU ``server`` at b1050-stable, built once from pinned
sources and packed as its release asset, for a loopback release mirror to serve.

The sources are the vendor folder beside this repository (``../shared/vendor/lemon-mlx-engine``, its
``build.sh`` and ``sources/``) or the folder ``LEMON_DESK_MLX_ENGINE_SOURCES`` names. The build is
set-up (``python -m tests.support.prepare`` calls ``build_lemon_mlx_engine``), never run under a test:
8.5 minutes on two quiet cores, 20 on busy ones. ``build.sh`` keeps its output in
``lemon-mlx-engine-b1050-stable`` under the tests' cache, stamped with a digest of the sources, and
skips a build it already made. Without sources, an engine built there before is still used.
"""

from __future__ import annotations

import fcntl
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.llama import run_logged
from tests.support.mlx_env import cache_root

TAG = "b1050-stable"
ASSET = f"mlx-engine-{TAG}-ubuntu-cpu-x64.zip"
SOURCES_ENV = "LEMON_DESK_MLX_ENGINE_SOURCES"
HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]

Say = Callable[[str], None]


def engine_folder() -> Path:
    """Where the build leaves the packed asset, the unpacked ``server`` and its logs."""
    return cache_root() / f"lemon-mlx-engine-{TAG}"


def engine_sources() -> Path | None:
    """The vendor folder to build from (it holds ``build.sh``), or None when there is none."""
    named = os.environ.get(SOURCES_ENV)
    folder = Path(named) if named else REPO_ROOT.parent / "shared" / "vendor" / "lemon-mlx-engine"
    return folder if (folder / "build.sh").is_file() else None


def _built() -> Path | None:
    folder = engine_folder()
    zip_path = folder / ASSET
    return zip_path if zip_path.is_file() and (folder / ".stamp").is_file() else None


def build_lemon_mlx_engine(say: Say) -> Path | None:
    """Build (or find built) the engine's release zip; None, after saying one line, when it cannot be
    had here (no sources and nothing built, or not Linux x86_64). A failed build is a ``BuildFailed``
    with the end of its output (``build.sh`` keeps its own logs beside the zip)."""
    sources = engine_sources()
    if sources is None:
        if (built := _built()) is not None:
            return built
        say(
            f"lemon-mlx-engine: no sources (set {SOURCES_ENV}, or put them in "
            f"{REPO_ROOT.parent / 'shared' / 'vendor' / 'lemon-mlx-engine'}) and none built in "
            f"{engine_folder()}: its tests will skip"
        )
        return None
    if sys.platform != "linux" or platform.machine() != "x86_64":
        say("lemon-mlx-engine: its CPU build is for Linux x86_64 only: its tests will skip")
        return None
    folder = engine_folder()
    folder.mkdir(parents=True, exist_ok=True)
    with (cache_root() / "lemon-mlx-engine.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time, however many runs ask
        if _built() is None:
            log = folder / "build-sh.log"
            log.unlink(missing_ok=True)
            say(f"building lemon-mlx-engine {TAG} from {sources} (8-20 minutes on 2 cores, once; log: {log})")
        else:
            log = folder / "check.log"  # build.sh sees its stamp and says so
        # build.sh compiles at nice 10; the set-up's own priority instead (tests/support/unniced/nice).
        env = {**os.environ, "PATH": f"{HERE / 'unniced'}{os.pathsep}{os.environ['PATH']}"}
        run_logged(["bash", str(sources / "build.sh"), str(folder)], log, say, env)
    return _built()


def lemon_mlx_engine_zip() -> Path:
    """The packed engine for a test; skips the test, saying why in one line, when it is not built."""
    built = _built()
    if built is not None:
        return built
    if engine_sources() is None:
        pytest.skip(f"lemon-mlx-engine {TAG} is not built and its sources are absent (set {SOURCES_ENV})")
    pytest.skip(f"lemon-mlx-engine {TAG} is not built yet: run python -m tests.support.prepare")
