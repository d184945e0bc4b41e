"""Parameter counts of the real SmolLM2-135M GGUF: from the file, and through HTTP Range reads of it on
a loopback Hub, agreeing with the ``gguf`` package's own reader."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from gguf import GGUFReader

from app.core.params import format_params
from app.core.refs import parse_ref, select
from app.store.model_paths import local_parameter_count
from app.supervisor.hub import HubClient
from app.supervisor.modelmeta import remote_parameter_count
from tests.support.hubserver import HubRepo, LoopbackHub

pytestmark = pytest.mark.integration


def test_smollm2_has_about_135_million_parameters_read_locally_and_remotely(
    smol_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    local = local_parameter_count("llamacpp", smol_gguf)
    reader = GGUFReader(smol_gguf)
    assert local == sum(int(t.n_elements) for t in reader.tensors)
    assert 134_000_000 < local < 135_000_000, local
    assert format_params(local) == "134.5M"

    hub = LoopbackHub()
    hub.add(HubRepo("HuggingFaceTB/SmolLM2-GGUF", {smol_gguf.name: smol_gguf.read_bytes()}, tags=("gguf",)))
    with hub.running() as base:
        monkeypatch.setenv("HF_ENDPOINT", base)

        async def remote() -> int:
            async with httpx.AsyncClient() as client:
                hub_client = HubClient(client)
                ref = parse_ref("HuggingFaceTB/SmolLM2-GGUF")
                return await remote_parameter_count(
                    hub_client, select(await hub_client.listing(ref.repo_id), ref)
                )

        assert asyncio.run(remote()) == local
    # Only the header was read: ranges, never the whole file.
    ranges = [r for p, r in hub.served.log if "/resolve/" in p]
    assert ranges and all(r is not None and not r.endswith("-") for r in ranges)
