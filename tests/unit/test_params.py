"""Parameter counts from headers: a generated safetensors header, the test repos' GGUF shards and MLX
safetensors shards through HTTP Range reads, and the same counts from the downloaded files, as
`search`, `pull --dry-run` and `models` show them."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.core.errors import ModelError
from app.core.params import format_params, safetensors_header_length, safetensors_parameter_count
from app.store.model_paths import local_parameter_count
from tests.support.hubserver import LoopbackHub
from tests.support.testrepos import BIG, TINY_MLX
from tests.unit.test_cli_models import HUB_EARLY_BREAK

TENSOR = 1024 * 256  # elements in each of the test GGUFs' tensors (one per layer)
MLX_PARAMS = 512 * 64 + 64 + 512 * 64  # embed_tokens + norm + lm_head


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def safetensors_file(tensors: dict[str, list[int]]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in tensors.items():
        size = 2
        for d in shape:
            size *= d
        header[name] = {"dtype": "F16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def test_a_generated_safetensors_header_counts_every_tensor(tmp_path: Path) -> None:
    data = safetensors_file({"embed": [32000, 4096], "norm": [4096], "scalar": [], "empty": [0, 8]})
    length = safetensors_header_length(data[:8], len(data))
    assert safetensors_parameter_count(data[8 : 8 + length]) == 32000 * 4096 + 4096 + 1
    folder = tmp_path / "mlx"
    folder.mkdir()
    (folder / "model-00001-of-00002.safetensors").write_bytes(data)
    (folder / "model-00002-of-00002.safetensors").write_bytes(safetensors_file({"lm_head": [32000, 4096]}))
    assert local_parameter_count("lemon-mlx", folder) == 2 * 32000 * 4096 + 4096 + 1
    assert format_params(2 * 32000 * 4096 + 4097) == "262.1M" and format_params(7_615_616_512) == "7.62B"
    for bad in (b"\xff" * 8, struct.pack("<Q", 1)):
        with pytest.raises(ModelError, match="header length"):
            safetensors_header_length(bad, len(data))
    for header in (b"[1]", b"{not json", json.dumps({"w": {"shape": [-1]}}).encode()):
        with pytest.raises(ModelError):
            safetensors_parameter_count(header)


@HUB_EARLY_BREAK
def test_search_pull_and_models_show_parameter_counts(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str]
) -> None:
    q4 = run_json(capsys, "pull", f"{BIG}:Q4_K_M", "--dry-run")
    assert q4["params"] == 6 * TENSOR  # summed over the three shards, the projector left out
    q8 = run_json(capsys, "pull", f"{BIG}:Q8_0", "--dry-run")
    assert q8["params"] == 3 * TENSOR
    mlx = run_json(capsys, "pull", TINY_MLX, "--dry-run")
    assert mlx["params"] == MLX_PARAMS  # both safetensors shards' headers
    [found] = run_json(capsys, "search", "tiny")["results"]
    assert found["params"] == MLX_PARAMS
    code = main(["search", "tiny"])
    out, _ = capsys.readouterr()
    assert code == 0 and f"{format_params(MLX_PARAMS)} params" in out

    run_json(capsys, "pull", f"{BIG}:Q4_K_M")
    run_json(capsys, "pull", TINY_MLX)
    listed = {m["name"]: m for m in run_json(capsys, "models")["models"]}
    assert listed["user.Big-GGUF-Q4_K_M"]["params"] == 6 * TENSOR  # every local shard's tensor infos
    assert listed["user.Tiny-4bit"]["params"] == MLX_PARAMS
    assert all(m["params"] is None for m in listed.values() if not m["downloaded"])
    main(["models"])
    out, _ = capsys.readouterr()
    assert "params" in out.splitlines()[0] and format_params(6 * TENSOR) in out
