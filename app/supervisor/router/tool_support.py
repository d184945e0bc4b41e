"""Whether a model can call tools, asked of what knows: llama-server says how it reads the chat template it
runs (``/props``'s ``chat_template_caps``); an MLX engine says nothing, so its model's labels and its own
chat template (``tokenizer_config.json``'s ``chat_template``, or ``chat_template.jinja``, in its folder)
are read; a remote's model is offered tools. The rule itself is ``app.core.tools.tool_support``.

The model is loaded first when it is not (its reply would load it anyway): only its running engine knows.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from pathlib import Path

from app.core.errors import LemonDeskError
from app.core.models import Model
from app.core.refs import GGUF_RECIPE
from app.core.tools import ToolSupport, tool_support
from app.store.library import Library
from app.supervisor.router.requests import Requests, is_remote
from app.supervisor.router.runtime import Runtime

log = logging.getLogger(__name__)


def chat_template(folder: Path) -> str | None:
    """The chat template an MLX model's folder holds, None when it holds none (or is no folder)."""
    try:
        return (folder / "chat_template.jinja").read_text(errors="replace")
    except OSError:
        pass
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # several named templates: [{"name": ..., "template": ...}]
        template = " ".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return template if isinstance(template, str) else None


class ToolSupportCheck:
    def __init__(self, requests: Requests, runtime: Runtime, library: Callable[[], Library]) -> None:
        self._requests = requests
        self._runtime = runtime
        self._library = library

    def _template(self, model: Model | None, launched: str) -> str | None:
        """The chat template of an MLX model's folder: the library's (its engine may have been given
        a repo id), else what the engine was given."""
        local = self._library().local_files(model) if model is not None else None
        return chat_template(local.main if local is not None else Path(launched))

    async def __call__(self, name: str) -> ToolSupport:
        if is_remote(name):
            return tool_support(name, remote=True)
        engine = await self._requests.ensure_loaded(name)
        record = self._runtime.get(name)
        model = record.model if record is not None else None
        labels = model.labels if model is not None else ()
        if engine.request.recipe == GGUF_RECIPE:
            caps = None
            try:
                async with self._requests.client(name) as client:
                    props = await client.get_json("/props")
                found = props.get("chat_template_caps") if isinstance(props, dict) else None
                caps = found if isinstance(found, dict) else None
            except LemonDeskError as err:  # a build without /props: the labels decide
                log.info("%s's engine did not say whether it takes tools (%s)", name, err)
            return tool_support(name, caps=caps, labels=labels)
        template = await asyncio.to_thread(self._template, model, engine.request.model)
        return tool_support(name, template=template, labels=labels)
