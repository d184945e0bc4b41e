"""Damaged state files found by the chaos suite's fuzzer (tests/chaos/test_state_fuzz.py), one by one:
each is set aside, reported, and kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.store.files import set_aside
from app.store.model_options import model_options_path
from app.store.settings import load_settings, settings_path
from app.store.usermodels import load_user_models, user_models_path

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


def test_two_files_set_aside_within_a_second_are_both_kept(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text("first")
    first = set_aside(path)
    path.write_text("second")
    second = set_aside(path)
    assert first != second and first.read_text() == "first" and second.read_text() == "second"


def test_models_says_when_it_set_the_model_options_aside(
    lemon_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_options_path().parent.mkdir(parents=True, exist_ok=True)
    model_options_path().write_text("{not json")
    assert main(["models", "--json"]) == 0
    err = capsys.readouterr().err
    backups = list(lemon_home.glob("model_options.json.corrupt-*"))
    assert len(backups) == 1 and backups[0].name in err
