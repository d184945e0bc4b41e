"""The saved KV caches' folder: names made by the app, sidecars checked before use, the disk budget.
(The engine side, saving and restoring real slots, is tests/integration/test_resume.py.)"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from pathlib import Path

import pytest

from app.store.kvcache import DEFAULT_BUDGET_GB, STALE_PART_S, SlotFiles, SlotKey
from app.store.settings import load_settings

KEY = SlotKey(
    model="/models/smol.gguf",
    model_size=98_000_000,
    model_mtime_ns=1_700_000_000_000_000_000,
    ctx_size=4096,
    backend="llamacpp:cpu",
    engine_args=("-t", "2"),
    conversation="3f2a9c",
)
# What llama-server's fs_validate_filename refuses, besides control characters.
REFUSED_BY_THE_ENGINE = re.compile(r'[/\\:*?"<>|]|\.\.|^ | $|\.$')


def engine_save(files: SlotFiles, key: SlotKey, data: bytes) -> str:
    """Write ``data`` as llama-server does for a save under the store's temporary name."""
    temporary = files.temporary_name(key)
    (files.root / temporary).write_bytes(data)
    return temporary


def saved(files: SlotFiles, key: SlotKey, data: bytes, tokens: int = 300) -> None:
    assert files.commit(key, engine_save(files, key, data), tokens, len(data)) is not None


def test_a_committed_slot_is_found_by_its_key_and_named_by_a_hash(tmp_path: Path) -> None:
    files = SlotFiles(tmp_path)
    temporary = engine_save(files, KEY, b"kv" * 1000)
    assert not REFUSED_BY_THE_ENGINE.search(temporary) and len(temporary) < 255
    committed = files.commit(KEY, temporary, 300, 2000)
    assert committed is not None and committed.filename == f"{KEY.digest}.bin"
    assert re.fullmatch(r"[0-9a-f]{40}", KEY.digest) and KEY.conversation not in committed.filename
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{KEY.digest}.bin", f"{KEY.digest}.json"]
    found = files.lookup(KEY)
    assert found is not None and (found.tokens, found.size, found.key) == (300, 2000, KEY)
    sidecar = json.loads((tmp_path / f"{KEY.digest}.json").read_text())
    assert sidecar["key"]["conversation"] == "3f2a9c" and sidecar["key"]["ctx_size"] == 4096


@pytest.mark.parametrize(
    "other",
    [
        {"model": "/models/other.gguf"},
        {"model_size": 97_000_000},  # the same path, another file
        {"model_mtime_ns": 1},
        {"ctx_size": 8192},
        {"backend": "llamacpp:vulkan"},
        {"engine_args": ("-ctk", "q8_0")},
        {"conversation": "another chat"},
    ],
)
def test_a_slot_saved_for_another_model_context_or_backend_is_never_used(
    tmp_path: Path, other: dict[str, object]
) -> None:
    files = SlotFiles(tmp_path)
    saved(files, KEY, b"kv" * 100)
    asked = dataclasses.replace(KEY, **other)  # type: ignore[arg-type]
    assert asked.digest != KEY.digest and files.lookup(asked) is None
    # Even under the asked key's names (a file copied or renamed by hand), its sidecar gives it away.
    for suffix in (".bin", ".json"):
        os.replace(tmp_path / f"{KEY.digest}{suffix}", tmp_path / f"{asked.digest}{suffix}")
    assert files.lookup(asked) is None
    assert list(tmp_path.iterdir()) == []  # dropped: it can never be used


def test_a_truncated_or_damaged_file_is_dropped_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    files = SlotFiles(tmp_path)
    caplog.set_level(logging.WARNING, "app.store.kvcache")
    saved(files, KEY, b"kv" * 1000)
    data = tmp_path / f"{KEY.digest}.bin"
    data.write_bytes(data.read_bytes()[:1500])
    assert files.lookup(KEY) is None
    assert "not the 2000 saved (truncated or damaged)" in caplog.text and not data.exists()

    saved(files, KEY, b"kv" * 1000)
    data.write_bytes(b"KV" + data.read_bytes()[2:])  # the same size, other bytes
    assert files.lookup(KEY) is None
    assert "does not match its checksum" in caplog.text and list(tmp_path.iterdir()) == []

    saved(files, KEY, b"kv" * 1000)
    (tmp_path / f"{KEY.digest}.json").write_text("{not json")
    assert files.lookup(KEY) is None and "its sidecar is unreadable" in caplog.text


def test_a_save_whose_size_is_not_what_the_engine_wrote_is_not_kept(tmp_path: Path) -> None:
    files = SlotFiles(tmp_path)
    temporary = engine_save(files, KEY, b"kv" * 10)
    assert files.commit(KEY, temporary, 300, 999) is None
    assert list(tmp_path.iterdir()) == [] and files.lookup(KEY) is None


def test_a_new_save_replaces_the_old_one(tmp_path: Path) -> None:
    files = SlotFiles(tmp_path)
    saved(files, KEY, b"a" * 10, tokens=10)
    saved(files, KEY, b"b" * 20, tokens=20)
    found = files.lookup(KEY)
    assert found is not None and found.tokens == 20 and len(list(tmp_path.iterdir())) == 2


def test_the_budget_drops_the_oldest_first(tmp_path: Path) -> None:
    times = iter([30.0, 10.0, 40.0, 20.0])
    files = SlotFiles(tmp_path, clock=lambda: next(times))
    saved_in_order = [dataclasses.replace(KEY, conversation=f"chat {n}") for n in range(4)]
    for key in saved_in_order:
        saved(files, key, b"x" * 1000)
    keys = [saved_in_order[n] for n in (1, 3, 0, 2)]  # oldest first
    each = 1000 + (tmp_path / f"{keys[0].digest}.json").stat().st_size
    assert files.enforce(4 * each + 100) == []
    assert files.enforce(2 * each + 100) == [keys[0].digest, keys[1].digest]
    assert [files.lookup(k) is not None for k in keys] == [False, False, True, True]
    assert files.enforce(0) == [keys[2].digest, keys[3].digest] and list(tmp_path.iterdir()) == []


def test_a_file_without_its_sidecar_counts_as_the_oldest(tmp_path: Path) -> None:
    files = SlotFiles(tmp_path)
    saved(files, KEY, b"x" * 1000)
    orphan = tmp_path / f"{'0' * 40}.bin"
    orphan.write_bytes(b"y" * 1000)
    assert files.enforce(1500) == ["0" * 40] and not orphan.exists() and files.lookup(KEY) is not None


def test_the_sweep_clears_stale_partial_saves_and_lone_sidecars(tmp_path: Path) -> None:
    files = SlotFiles(tmp_path)
    saved(files, KEY, b"x" * 10)
    stale, young = tmp_path / "a.part-00000000", tmp_path / "b.part-11111111"
    stale.write_bytes(b"old")
    young.write_bytes(b"under way")
    past = time.time() - STALE_PART_S - 60
    os.utime(stale, (past, past))
    lone = tmp_path / f"{'1' * 40}.json"
    lone.write_text("{}")
    files.sweep()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [young.name, f"{KEY.digest}.bin", f"{KEY.digest}.json"]
    )


@pytest.mark.parametrize(("value", "kept"), [(2, 2.0), (0.5, 0.5), (0, 0.0), (-1, None), ("4", None)])
def test_the_budget_setting_is_a_number_of_gb_zero_or_more(
    lemon_home: Path, value: object, kept: float | None
) -> None:
    (lemon_home / "settings.json").parent.mkdir(parents=True, exist_ok=True)
    (lemon_home / "settings.json").write_text(json.dumps({"kv_cache_budget_gb": value}))
    loaded = load_settings()
    assert loaded.settings.kv_cache_budget_gb == (DEFAULT_BUDGET_GB if kept is None else kept)
    assert bool(loaded.warning) == (kept is None)
