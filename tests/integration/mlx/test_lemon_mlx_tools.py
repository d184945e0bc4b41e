"""Tools are offered to an MLX model only when it can call them, on the REAL lemon-mlx engine (built from
pinned sources, installed from the loopback mirror: test_lemon_mlx_real.py) and two user MLX folders of
the tiny Qwen3 (tests/support/qwen3_model.py), neither with the ``tool-calling`` label: one whose chat
template takes ``tools`` (a copy with a system turn listing them), one with the model's own template,
which names none. lemon-mlx-engine has no ``/props``, so the router reads each folder's
``tokenizer_config.json``. The first gets the tools of a real MCP server: the engine renders them into
its prompt, which is longer by them; the second gets none, the stream says why (``ToolsWithheld``) and
its prompt is the plain one."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from app.client.events import ChatDone
from app.core.tools import Permission, ToolRequest, ToolsWithheld
from app.store.library import Library
from app.store.mcp_servers import save_mcp_servers
from app.store.model_options import ModelOptions, save_model_options
from app.store.settings import Settings
from app.supervisor.router import Router
from tests.integration.mlx.test_lemon_mlx_real import (  # noqa: F401
    HELLO,
    Qwen3,
    engine_zip,
    engines_running,
    hf_home,
    mirror,
    qwen3,
    server,
)
from tests.support.mcp_servers import stdio_spec
from tests.support.qwen3_model import CHAT_TEMPLATE

pytestmark = pytest.mark.integration

# The model's own ChatML, after a system turn naming the offered tools (when there are any).
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\\nTools:' }}"
    "{% for tool in tools %}{{ ' ' + tool['function']['name'] }}{% endfor %}"
    "{{ '<|im_end|>\\n' }}{% endif %}" + CHAT_TEMPLATE
)
TAKES = "user.qwen3-tools"
PLAIN = "user.qwen3-plain"


def copy_with_template(source: Path, to: Path, template: str | None) -> Path:
    """A copy of the model's folder (the cached one is never written), with ``template`` as its chat
    template when given."""
    shutil.copytree(source, to)
    if template is not None:
        config_file = to / "tokenizer_config.json"
        config = json.loads(config_file.read_text())
        config_file.write_text(json.dumps({**config, "chat_template": template}))
    return to


def test_the_model_whose_template_takes_tools_gets_them_and_the_other_is_told_why_not(
    server: Path,  # noqa: F811
    qwen3: Qwen3,  # noqa: F811
    tmp_path: Path,
) -> None:
    settings = Settings()
    library = Library(settings)
    library.import_path(copy_with_template(qwen3.folder, tmp_path / "takes", TOOLS_TEMPLATE), name=TAKES)
    library.import_path(copy_with_template(qwen3.folder, tmp_path / "plain", None), name=PLAIN)
    save_model_options({name: ModelOptions(backend="cpu", ctx_size=1024) for name in (TAKES, PLAIN)})
    save_mcp_servers({"weather": stdio_spec("weather", calls=tmp_path / "calls.jsonl")})
    asked: list[ToolRequest] = []

    async def ask(request: ToolRequest) -> Permission:
        asked.append(request)
        return Permission.DENY

    async def go() -> dict[str, list[Any]]:
        async with Router(settings) as router:
            router.mcp.start()
            assert await router.mcp.wait_ready(["weather"], 120)
            return {
                name: [e async for e in router.chat_with_tools(name, HELLO, ask=ask, max_tokens=64)]
                for name in (TAKES, PLAIN)
            }

    events = asyncio.run(go())
    takes, plain = events[TAKES], events[PLAIN]
    assert not [e for e in takes if isinstance(e, ToolsWithheld)]
    withheld = [e for e in plain if isinstance(e, ToolsWithheld)]
    assert [w.why for w in withheld] == [
        f"No tools for {PLAIN}: it is not known to call tools (its chat template names no tools, and it "
        "has no tool-calling label). Choose a model that calls tools for this chat."
    ]
    done_takes, done_plain = takes[-1], plain[-1]
    assert isinstance(done_takes, ChatDone) and isinstance(done_plain, ChatDone)
    # The engine's own prompt count: the tools' system turn was in the first prompt, not in the second.
    assert done_takes.telemetry.prompt_tokens > done_plain.telemetry.prompt_tokens > 0
    assert asked == [] and not (tmp_path / "calls.jsonl").exists()  # the model called nothing
    assert engines_running(server) == []
