"""The packaged app for tests: ``packaging/build.py``'s bundle, built once per source hash and kept
under ``platformdirs.user_cache_dir("lemon-desk-tests")/bundle-<hash>``.

The hash covers app/, resources/, packaging/, pyproject.toml and the building Python (build.py's
``source_hash``), so a changed source builds again (about three minutes on two cores) and an unchanged
one reuses the bundle in no time. ``python -m tests.support.prepare`` builds it; tests only find it. Older
bundles are removed when a new one is built. The build goes to a ``.partial`` folder renamed into place,
so an interrupted build is never reused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.support.llama import NotBuilt, Say, _locked, cache_dir, run_logged

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "packaging" / "build.py"


def source_hash() -> str:
    done = subprocess.run(
        [sys.executable, str(BUILD), "--print-hash"], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def bundle_dir() -> Path:
    """The unpacked bundle (``.../lemon-desk``, holding the ``lemon-desk`` executable) for this source,
    made by ``build_bundle``: a source changed since is not built yet."""
    bundle = cache_dir() / f"bundle-{source_hash()}" / "lemon-desk"
    if not (bundle / "lemon-desk").exists():
        raise NotBuilt(f"the packaged app for this source is not in {bundle.parent}")
    return bundle


def build_bundle(say: Say) -> Path:
    """Build the packaged app for this source, unless it is built already."""
    final = cache_dir() / f"bundle-{source_hash()}"
    with _locked("bundle"):
        if (final / "lemon-desk" / "lemon-desk").exists():
            return final / "lemon-desk"
        for old in cache_dir().glob("bundle-*"):
            shutil.rmtree(old, ignore_errors=True)
        partial = final.with_name(final.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        log = cache_dir() / "bundle-build.log"
        log.unlink(missing_ok=True)
        say(f"building the packaged app (PyInstaller, about three minutes; log: {log})")
        started = time.monotonic()
        run_logged(
            [sys.executable, str(BUILD), "--dist", str(partial / "dist"), "--work", str(partial / "work")],
            log,
            say,
        )
        for built in (partial / "dist").iterdir():  # the bundle and its archive
            built.rename(partial / built.name)
        shutil.rmtree(partial / "dist")
        shutil.rmtree(partial / "work")
        partial.rename(final)
        say(f"bundle built in {time.monotonic() - started:.0f} s")
    return final / "lemon-desk"
