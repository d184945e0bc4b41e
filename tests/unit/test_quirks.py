"""The quirk table (resources/quirks.json): GLM-4 GGUFs lose the MTP label and refuse MTP speculative
decoding arguments, in the pure launch plan and through the supervisor's dry run of a real GGUF file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from app.core.errors import ConfigError
from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest, plan_launch
from app.core.models import Model
from app.core.quirks import effective_labels, parse_quirks
from app.store.quirks import load_quirks
from app.store.settings import Settings
from app.supervisor.router import Router
from app.supervisor.supervisor import LoadOptions
from tests.conftest import profile_path

MTP_ARGS = "--spec-type draft-mtp --spec-draft-n-max 3 --spec-draft-p-min 0.75"  # Lemonade's mtp defaults


def gguf(path: Path, architecture: str) -> Path:
    writer = GGUFWriter(path, architecture)
    writer.add_block_count(2)
    writer.add_context_length(2048)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(256)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_tensor("blk.0.ffn_up.weight", np.zeros((4, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def request(architecture: str, *args: str) -> LaunchRequest:
    return LaunchRequest(
        "llamacpp", "cpu", "/bin/llama-server", "", "/m.gguf", user_args=args,
        architecture=architecture, quirks=load_quirks(),
    )  # fmt: skip


def test_the_shipped_table_strips_mtp_from_glm4_ggufs_only() -> None:
    quirks = load_quirks()
    assert [q.id for q in quirks] == ["glm4-no-mtp"]
    labels = ("chat", "mtp", "reasoning")
    for arch in ("glm4", "glm4moe", "GLM4"):
        assert effective_labels(labels, quirks, "llamacpp", arch) == ("chat", "reasoning")
    assert effective_labels(labels, quirks, "llamacpp", "llama") == labels
    assert effective_labels(labels, quirks, "llamacpp", "") == labels  # unknown: nothing stripped
    assert effective_labels(labels, quirks, "lemon-mlx", "glm4") == labels  # a GGUF rule


def test_mtp_arguments_are_refused_for_glm4_and_kept_for_others() -> None:
    hw = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    for args in (MTP_ARGS.split(), ["--spec-type=draft-mtp"]):
        with pytest.raises(ConfigError, match="--spec-type draft-mtp cannot be used with this glm4moe model"):
            plan_launch(request("glm4moe", *args), hw, "1", "k", {})
    plan = plan_launch(request("llama", *MTP_ARGS.split()), hw, "1", "k", {})
    assert "draft-mtp" in plan.argv
    plan = plan_launch(request("glm4", "--spec-type", "draft-simple"), hw, "1", "k", {})  # not MTP
    assert "draft-simple" in plan.argv


def test_a_malformed_table_is_refused() -> None:
    for bad in (
        {},
        {"quirks": [{"id": "x"}]},
        {"quirks": [{"id": "x", "recipe": "r", "architecture_contains": ""}]},
    ):
        with pytest.raises(ConfigError):
            parse_quirks(bad)


def test_a_real_glm4_gguf_loses_the_label_and_its_dry_run_refuses_mtp(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))
    glm = Model(
        "user.glm", "llamacpp", str(gguf(tmp_path / "glm.gguf", "glm4moe")), ("chat", "mtp"), user=True
    )
    llama = Model("user.llama", "llamacpp", str(gguf(tmp_path / "llama.gguf", "llama")), ("mtp",), user=True)

    async def go() -> None:
        async with Router(standin_settings) as router:
            assert router.labels(glm) == ("chat",)
            assert router.labels(llama) == ("mtp",)
            with pytest.raises(ConfigError, match="cannot be used with this glm4moe model"):
                await router.supervisor.dry_run(glm, LoadOptions("system", None, MTP_ARGS), {})
            plan = await router.supervisor.dry_run(llama, LoadOptions("system", None, MTP_ARGS), {})
            assert "draft-mtp" in plan.argv

    asyncio.run(go())
