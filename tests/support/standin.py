"""The stand-in engine for tests: an executable that takes llama-server's command line (see
``standin_engine.py`` for what it serves and how it is controlled), tiny valid GGUF files that tell it
how to behave, and a client for its control routes.

    binary = standin_binary(tmp_path)                      # use as Settings(llama_server_path=...)
    model = make_standin_model(tmp_path, "flaky", load_delay_s=0.5, tokens=50)
    await control(engine.base_url, "crash")               # or "hang", "ignore_sigterm", "slow"
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from gguf import GGUFWriter

ENGINE = Path(__file__).with_name("standin_engine.py")
SIDECAR_SUFFIX = ".standin.json"
BEHAVIOUR_KEYS = frozenset(
    {
        "load_delay_s",
        "crash_on_load",
        "reasoning",
        "tokens",
        "token_delay_s",
        "prompt_delay_s",
        "reply",
        "http10",
        "tool_call",
        "tool_rounds",
        "template_caps",
        "calls_at_once",
    }
)
CONTROLS = frozenset({"crash", "hang", "ignore_sigterm", "slow"})

# The shape written into a stand-in model: small, and enough for the import check and the fit estimate.
LAYERS, EMBD, HEADS, KV_HEADS, CONTEXT = 2, 64, 4, 2, 2048


def standin_binary(directory: Path, name: str = "llama-server") -> Path:
    """Write an executable ``directory/name`` that runs the stand-in engine under this interpreter."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    shebang = f"#!{sys.executable} -I"  # -I: the child's environment cannot change what runs
    if len(shebang) > 250:
        raise RuntimeError(f"{sys.executable} is too long a path for a #! line")
    path.write_text(
        f"{shebang}\n"
        "# A stand-in for llama-server, written by tests/support/standin.py.\n"
        "import runpy\n"
        f"runpy.run_path({str(ENGINE)!r}, run_name='__main__')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def make_standin_model(directory: Path, name: str, **behaviour: Any) -> Path:
    """A tiny valid llama GGUF ``directory/name.gguf`` and its sidecar ``<path>.standin.json`` with
    ``behaviour`` (keys: load_delay_s, crash_on_load, tokens, token_delay_s, prompt_delay_s, reply, http10,
    tool_call, tool_rounds, calls_at_once, template_caps, reasoning)."""
    unknown = set(behaviour) - BEHAVIOUR_KEYS
    if unknown:
        raise TypeError(f"unknown stand-in behaviour {sorted(unknown)}; known: {sorted(BEHAVIOUR_KEYS)}")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / (name if name.endswith(".gguf") else f"{name}.gguf")
    writer = GGUFWriter(path, "llama")
    writer.add_name(path.stem)
    writer.add_block_count(LAYERS)
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(EMBD)
    writer.add_feed_forward_length(2 * EMBD)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_file_type(0)  # all F32
    writer.add_tensor("token_embd.weight", np.zeros((16, EMBD), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    set_behaviour(path, **behaviour)
    return path


def set_behaviour(model: Path, **behaviour: Any) -> None:
    """Replace a stand-in model's sidecar: the next engine started on it behaves so."""
    Path(f"{model}{SIDECAR_SUFFIX}").write_text(json.dumps(behaviour))


async def control(base_url: str, action: str, **body: Any) -> None:
    """Flip a running stand-in's switch (``crash`` may lose its answer as the process dies)."""
    if action not in CONTROLS:
        raise ValueError(f"unknown stand-in control {action!r}; known: {sorted(CONTROLS)}")
    async with httpx.AsyncClient(base_url=base_url, trust_env=False) as client:
        try:
            response = await client.post(f"/__standin__/{action}", json=body, timeout=5.0)
        except httpx.TransportError:
            if action == "crash":
                return
            raise
        response.raise_for_status()
