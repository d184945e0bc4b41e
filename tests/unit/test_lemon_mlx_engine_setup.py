"""The set-up of the real lemon-mlx engine for tests (tests/support/lemon_mlx_engine.py): where its
sources are looked for, what is said without them, and the one-line skip. The build script here is a
FAKE (it writes the asset's name and a stamp); the real one takes 8-20 minutes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import lemon_mlx_engine as engine
from tests.support.llama import BuildFailed

FAKE_BUILD = """#!/usr/bin/env bash
set -e
mkdir -p "$1"
echo fake > "$1/mlx-engine-b1050-stable-ubuntu-cpu-x64.zip"
echo stamp > "$1/.stamp"
echo "built $1"
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # platformdirs' cache on Linux
    return tmp_path / "cache" / "lemon-desk-tests"


def test_without_sources_or_a_built_engine_it_says_one_line_and_tests_skip_saying_why(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(engine.SOURCES_ENV, str(tmp_path / "nowhere"))
    said: list[str] = []
    assert engine.build_lemon_mlx_engine(said.append) is None
    assert len(said) == 1 and "no sources" in said[0] and "its tests will skip" in said[0]
    with pytest.raises(pytest.skip.Exception) as skipped:
        engine.lemon_mlx_engine_zip()
    assert str(skipped.value) == (
        "lemon-mlx-engine b1050-stable is not built and its sources are absent (set "
        "LEMON_DESK_MLX_ENGINE_SOURCES)"
    )


def test_the_sources_an_environment_variable_names_are_built_into_the_cache(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = tmp_path / "vendor"
    sources.mkdir()
    (sources / "build.sh").write_text(FAKE_BUILD)
    monkeypatch.setenv(engine.SOURCES_ENV, str(sources))
    with pytest.raises(pytest.skip.Exception, match=r"not built yet: run python -m tests\.support\.prepare"):
        engine.lemon_mlx_engine_zip()
    said: list[str] = []
    built = engine.build_lemon_mlx_engine(said.append)
    assert built == cache / "lemon-mlx-engine-b1050-stable" / engine.ASSET and built.read_text() == "fake\n"
    assert engine.lemon_mlx_engine_zip() == built
    monkeypatch.setenv(engine.SOURCES_ENV, str(tmp_path / "gone"))  # built before: still used
    assert engine.build_lemon_mlx_engine(said.append) == built


def test_a_failed_build_is_said_with_its_last_lines(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = tmp_path / "vendor"
    sources.mkdir()
    (sources / "build.sh").write_text("echo 'cmake: no compiler' >&2\nexit 3\n")
    monkeypatch.setenv(engine.SOURCES_ENV, str(sources))
    with pytest.raises(BuildFailed) as failed:
        engine.build_lemon_mlx_engine(lambda _line: None)
    assert "failed (exit 3)" in str(failed.value) and str(failed.value).endswith("cmake: no compiler")
