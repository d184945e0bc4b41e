"""Damaged state files found by the chaos suite's fuzzer (tests/chaos/test_state_fuzz.py), one by one:
each is set aside, reported, and kept; in the hand-editable model options, only the odd values go."""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.store.bench_results import bench_path, load_runs
from app.store.downloads import downloads_path, load_downloads
from app.store.files import set_aside
from app.store.model_options import ModelOptions, load_model_options, model_options_path
from app.store.run_records import load_run_records, record_path
from app.store.settings import load_settings, settings_path
from app.store.usermodels import load_user_models, user_models_path
from app.supervisor.orphans import stop_orphans

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_json_file_nested_too_deeply_is_set_aside_not_a_crash(lemon_home: Path) -> None:
    settings_path().parent.mkdir(parents=True, exist_ok=True)
    settings_path().write_text(DEEP)
    loaded = load_settings()
    assert "nested too deeply" in loaded.warning
    assert [p.read_text() for p in lemon_home.glob("settings.json.corrupt-*")] == [DEEP]


@pytest.mark.parametrize("field,value", [("size_gb", 1e308 * 10), ("size_gb", None), ("labels", 3)])
def test_a_user_model_with_a_wrong_type_is_set_aside(lemon_home: Path, field: str, value: object) -> None:
    entry = {"recipe": "llamacpp", "checkpoint": "/models/x.gguf", field: value}
    user_models_path().parent.mkdir(parents=True, exist_ok=True)
    user_models_path().write_text(json.dumps({"schema": 1, "models": {"user.x": entry}}))
    loaded = load_user_models()
    assert loaded.items == {} and "user models file was unreadable" in loaded.warning


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize("size,done_bytes", [(float("inf"), 1), (1, float("inf"))])
def test_a_download_with_an_infinite_count_is_set_aside(
    lemon_home: Path, size: float, done_bytes: float
) -> None:
    record = {
        "model": "user.x",
        "state": "done",
        "repo_id": "org/repo",
        "revision": "a" * 40,
        "recipe": "llamacpp",
        "label": "Q4_0",
        "main": "x.gguf",
        "files": [{"path": "x.gguf", "size": size, "sha256": None, "blob_id": None}],
        "done_bytes": done_bytes,
    }
    write(downloads_path(), json.dumps({"schema": 1, "downloads": {"d1": record}}))  # writes Infinity
    loaded = load_downloads()
    assert loaded.items == {} and "downloads file was unreadable" in loaded.warning
    assert len(list(lemon_home.glob("downloads.json.corrupt-*"))) == 1


@pytest.mark.parametrize(
    "pids",
    [{"pid": float("inf"), "app_pid": 1}, {"pid": 4242, "app_pid": -5}, {"pid": 0, "app_pid": 1}],
)
def test_an_engine_run_record_with_an_impossible_pid_is_set_aside(
    lemon_home: Path, pids: dict[str, float]
) -> None:
    """Start-up reads the run records to stop engines an earlier run left (stop_orphans)."""
    path = record_path(4242)
    record = {"engine_id": "e", "binary": "b", "started": 1.0, "exe": "x", "app_started": 1.0}
    text = json.dumps({**record, **pids})  # float("inf") is written as Infinity
    write(path, text)
    assert stop_orphans() == [] and load_run_records() == []
    assert [p.read_text() for p in path.parent.glob(f"{path.name}.corrupt-*")] == [text]


def test_bench_results_nested_too_deeply_are_set_aside(lemon_home: Path) -> None:
    write(bench_path(), DEEP)
    loaded = load_runs()
    assert loaded.runs == [] and "nested too deeply" in loaded.warning
    assert [p.read_text() for p in lemon_home.glob("bench.json.corrupt-*")] == [DEEP]


def test_two_files_set_aside_within_a_second_are_both_kept(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("first")
    first = set_aside(path)
    path.write_text("second")
    second = set_aside(path)
    assert first != second and first.read_text() == "first" and second.read_text() == "second"


@pytest.mark.parametrize("text", ["{not json", "[]", '{"schema": 1, "models": [{}]}'])
def test_models_says_when_it_set_the_model_options_aside(
    lemon_home: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    write(model_options_path(), text)
    assert main(["models", "--json"]) == 0
    err = capsys.readouterr().err
    backups = list(lemon_home.glob("model_options.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].name in err


def test_model_options_of_the_wrong_type_are_left_out_and_the_rest_kept(
    lemon_home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good: dict[str, Any] = {
        "backend": "system",
        "ctx_size": 2048,
        "args": "--no-mmap",
        "temperature": 0.5,
        "top_p": 1,
        "max_tokens": 64,
        "pinned": True,
        "rpc": "local",
        "reasoning_format": "hidden",
    }
    assert set(good) == {f.name for f in fields(ModelOptions)}  # every field is read back
    bad = {
        "backend": 5,
        "ctx_size": "big",
        "args": 5,
        "temperature": "hot",
        "top_p": float("inf"),  # written as Infinity
        "max_tokens": {"a": [[1]]},
        "pinned": "yes",
        "rpc": ["x"],
        "reasoning_format": "loud",
    }
    mixed = {**good, "ctx_size": True, "flash": "from a later version"}
    models = {"user.good": good, "user.bad": bad, "user.list": [good], "user.mixed": mixed}
    write(model_options_path(), json.dumps({"schema": 1, "models": models}))
    with caplog.at_level(logging.WARNING, "app.store.model_options"):
        loaded = load_model_options()
    assert loaded.warning == "" and not list(lemon_home.glob("model_options.json.corrupt-*"))
    assert loaded.items == {
        "user.good": ModelOptions(**good),
        "user.bad": ModelOptions(),
        "user.mixed": ModelOptions(**{**good, "ctx_size": None}),
    }
    assert len(caplog.records) == len(bad) + 2  # each bad value, the list, the mixed ctx_size
    assert "Ignored the saved ctx_size of user.bad: not a number of tokens (str)." in caplog.messages
