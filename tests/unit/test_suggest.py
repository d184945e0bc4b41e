"""The first-run suggestion: which catalog model a new user is offered on each kind of machine."""

from __future__ import annotations

import dataclasses
import json

import pytest

from app.core.fit import Verdict
from app.core.hardware import Hardware, hardware_from_json
from app.core.models import Model, catalog_from_json
from app.core.suggest import suggest
from app.store.catalog import load_catalog_json
from tests.conftest import profile_path

BOTH = {"llamacpp", "lemon-mlx"}


def hw(name: str) -> Hardware:
    return hardware_from_json(json.loads(profile_path(name).read_text()))


def catalog() -> list[Model]:
    return list(catalog_from_json(load_catalog_json()).values())


@pytest.mark.parametrize(
    ("profile", "runnable", "expected", "why"),
    [
        ("cpu_only_x86", BOTH, "Qwen3-0.6B-GGUF", "runs on the CPU"),  # smallest: speed on a CPU
        ("apple_silicon", BOTH, "Qwen3-0.6B-MLX", "MLX"),  # MLX first on a Mac
        ("strix_halo", BOTH, "Qwen3-1.7B-GGUF", "unified memory"),  # the largest suggested GGUF
        ("nvidia", {"llamacpp"}, "Qwen3-1.7B-GGUF", "VRAM"),
    ],
)
def test_the_suggestion_suits_the_machine(profile: str, runnable: set[str], expected: str, why: str) -> None:
    choice = suggest(catalog(), runnable, hw(profile), 4096)
    assert choice is not None
    assert choice.model.name == expected and why in choice.reason
    assert choice.fit.verdict is Verdict.FITS


def test_only_suggested_catalog_models_that_fit_and_can_run_are_offered() -> None:
    tiny = dataclasses.replace(hw("cpu_only_x86"), memory_gb=0.2)
    assert suggest(catalog(), BOTH, tiny, 4096) is None
    assert suggest(catalog(), set(), hw("cpu_only_x86"), 4096) is None
    mlx_only = suggest(catalog(), {"lemon-mlx"}, hw("cpu_only_x86"), 4096)
    assert mlx_only is not None and mlx_only.model.name == "Qwen3-0.6B-MLX"
    users = [dataclasses.replace(m, user=True) for m in catalog()]
    assert suggest(users, BOTH, hw("cpu_only_x86"), 4096) is None
