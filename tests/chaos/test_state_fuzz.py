"""Every state file the app reads, fuzzed with a seeded generator (truncated, garbage, wrong types,
deep nesting, a folder in its place): the CLI (``models``, ``backends``), the router and the window
start, say what they set aside, and keep the original bytes."""

from __future__ import annotations

import asyncio
import json
import random as random_module
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from app.cli import main
from app.core.downloads import DownloadRecord
from app.core.refs import FileSet, RepoFile
from app.store.downloads import downloads_path, save_downloads
from app.store.history import History, history_path
from app.store.installs import MANIFEST, InstallManifest, install_dir, write_manifest
from app.store.model_options import ModelOptions, model_options_path, save_model_options
from app.store.settings import Settings, load_settings, save_settings, settings_path
from app.store.usermodels import user_models_path
from app.supervisor.router import Router
from app.ui.desktop import DesktopApp
from tests.chaos.conftest import Row, rng
from tests.support.standin import make_standin_model

TRIALS_PER_FILE = 6
WINDOW_TRIALS_PER_FILE = 1  # the window costs a second or two each: one fuzzed start per file


def seed_files(tmp_path: Path) -> dict[str, Path]:
    """A valid example of every state file, written through the app's own code."""
    save_settings(Settings(max_loaded_models=2))
    save_model_options({"user.tiny": ModelOptions(backend="system", ctx_size=1024)})
    from app.store.library import Library

    Library(Settings()).import_path(make_standin_model(tmp_path / "models", "tiny"))
    folder = install_dir("llamacpp", "cpu")
    folder.mkdir(parents=True)
    write_manifest(folder, InstallManifest("b1", "llama-b1-bin-ubuntu-x64.tar.gz", "0" * 64))
    files = FileSet(
        "org/Repo-GGUF", "a" * 40, "llamacpp", "Q4_K_M", (RepoFile("x-Q4_K_M.gguf", 10, "b" * 64),)
    )
    save_downloads({"org/Repo-GGUF:Q4_K_M": DownloadRecord("org/Repo-GGUF:Q4_K_M", "user.x", files)})
    history = History()
    history.create_conversation("kept")
    history.append_message("kept", "user", "hello")
    history.close()
    return {
        "settings.json": settings_path(),
        "model_options.json": model_options_path(),
        "user_models.json": user_models_path(),
        "install manifest": folder / MANIFEST,
        "downloads.json": downloads_path(),
        "history.sqlite3": history_path(),
    }


def _wrong(random: random_module.Random) -> object:
    return random.choice(
        [None, True, -1, 10**30, 1.5e308, "", "x" * 1000, "../../etc/passwd", [], [1, "a"], {}, {"a": None}]
    )


def _retyped(value: object, random: random_module.Random) -> object:
    """The same shape with some leaves (or whole branches) swapped for values of another type."""
    if random.random() < 0.25:
        return _wrong(random)
    if isinstance(value, dict):
        return {k: _retyped(v, random) for k, v in value.items()}
    if isinstance(value, list):
        return [_retyped(v, random) for v in value]
    return value


def fuzz(original: bytes, random: random_module.Random, is_json: bool) -> tuple[str, bytes]:
    """One damaged version of a file, and how it was damaged."""
    kinds = ["truncated", "garbage", "empty", "bit flips", "deep nesting", "non-UTF-8"]
    if is_json:
        kinds += ["wrong types", "wrong types", "not an object"]
    kind = random.choice(kinds)
    if kind == "truncated":
        return kind, original[: random.randrange(len(original))]
    if kind == "garbage":
        return kind, random.randbytes(random.randrange(1, 4096))
    if kind == "empty":
        return kind, b""
    if kind == "bit flips":
        data = bytearray(original)
        for _ in range(random.randrange(1, 16)):
            data[random.randrange(len(data))] ^= 1 << random.randrange(8)
        return kind, bytes(data)
    if kind == "deep nesting":
        return kind, b"[" * 100_000 + b"]" * 100_000
    if kind == "non-UTF-8":
        return kind, b'{"schema": 1, "\xff\xfe": "\xc3"}'
    if kind == "not an object":
        return kind, json.dumps(_wrong(random)).encode()
    return kind, json.dumps(_retyped(json.loads(original), random)).encode()


def kept(path: Path, data: bytes, kind: str) -> str:
    """Where the original bytes are now: in place, or in a set-aside copy beside it."""
    if not data:
        return "in place"  # an empty file holds nothing to keep
    if path.is_file() and path.read_bytes() == data:
        return "in place"
    for copy in path.parent.glob(f"{path.name}.corrupt-*"):
        if copy.is_file() and copy.read_bytes() == data:
            return copy.name
    raise AssertionError(f"the original {path.name} ({kind}) is gone (neither in place nor set aside)")


def start_cli_and_router(capsys: pytest.CaptureFixture[str]) -> str:
    """``lemon-desk models`` and ``backends``, then the router; returns what they told the user."""
    said = []
    for command in (["models", "--json"], ["backends", "--json"]):
        code = main(command)
        out, err = capsys.readouterr()
        assert code == 0, f"lemon-desk {command[0]} failed: {err}"
        json.loads(out)
        said.append(err)

    async def construct() -> list[str]:
        async with Router(load_settings().settings) as router:
            return list(router.warnings)

    said += asyncio.run(construct())
    return "\n".join(said)


@pytest.fixture
def fresh_home(
    lemon_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[int], Path]]:
    """A new LEMON_DESK_HOME per trial."""

    def make(trial: int) -> Path:
        path = tmp_path / f"home-{trial}"
        monkeypatch.setenv("LEMON_DESK_HOME", str(path))
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setenv(
            "LEMON_DESK_MOCK_HARDWARE", str(Path(__file__).parents[1] / "profiles" / "cpu_only_x86.json")
        )
        return path

    yield make


@pytest.mark.chaos("state files fuzzed (CLI, router)")
def test_fuzzed_state_files_are_set_aside_and_kept(
    chaos_row: Row, fresh_home: Callable[[int], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    random = rng("state-fuzz")
    trial = 0
    for name in (
        "settings.json",
        "model_options.json",
        "user_models.json",
        "install manifest",
        "downloads.json",
        "history.sqlite3",
    ):
        for _ in range(TRIALS_PER_FILE):
            fresh_home(trial)
            trial += 1
            path = seed_files(tmp_path / f"seed-{trial}")[name]
            kind, data = fuzz(path.read_bytes(), random, name != "history.sqlite3")
            path.write_bytes(data)
            said = start_cli_and_router(capsys)
            if name == "history.sqlite3":
                history = History()
                said += history.warning
                history.close()
            where = kept(path, data, kind)
            if where != "in place":
                assert where in said, f"{name} was set aside as {where} without a word: {said!r}"
            chaos_row.add("set aside, said so" if where != "in place" else "read or ignored")
    chaos_row.lost = "nothing: every original kept"


@pytest.mark.chaos("state files fuzzed (window)")
def test_the_window_starts_over_fuzzed_state_files(
    chaos_row: Row, fresh_home: Callable[[int], Path], tmp_path: Path, desktop: Callable[[], DesktopApp]
) -> None:
    random = rng("state-fuzz-window")
    for trial, name in enumerate(
        ("settings.json", "model_options.json", "user_models.json", "downloads.json", "history.sqlite3")
    ):
        fresh_home(100 + trial)
        path = seed_files(tmp_path / f"seed-{trial}")[name]
        kind, data = fuzz(path.read_bytes(), random, name != "history.sqlite3")
        path.write_bytes(data)
        app = desktop()
        assert app.window.isVisible()
        kept(path, data, kind)
        chaos_row.add("window up, original kept")
    chaos_row.lost = "nothing"
