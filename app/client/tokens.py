"""A chat's prompt counted by the engine's own tokenizer: llama-server applies its chat template
(``/apply-template``) and tokenizes the result (``/tokenize``) as its chat path does, with the special
tokens parsed and added, so the count is the ``prompt_tokens`` the reply's usage will report."""

from __future__ import annotations

from typing import Any

from app.client.chat import ChatClient
from app.core.errors import RequestError


async def count_prompt(client: ChatClient, chat: dict[str, Any]) -> int:
    """The tokens of the prompt ``chat`` (a chat completion's body: ``messages`` and the rest) makes."""
    templated = await client.post_json("/apply-template", chat)
    prompt = templated.get("prompt") if isinstance(templated, dict) else None
    if not isinstance(prompt, str):
        raise RequestError("The engine did not apply its chat template.")
    tokens = await client.post_json(
        "/tokenize", {"content": prompt, "add_special": True, "parse_special": True}
    )
    counted = tokens.get("tokens") if isinstance(tokens, dict) else None
    if not isinstance(counted, list):
        raise RequestError("The engine did not tokenize the prompt.")
    return len(counted)


async def context_size(client: ChatClient) -> int:
    """The context each of the engine's slots holds (llama-server's ``/props``)."""
    props = await client.get_json("/props")
    try:
        return int(props["default_generation_settings"]["n_ctx"])
    except (KeyError, TypeError, ValueError):
        raise RequestError("The engine did not say its context size.") from None
