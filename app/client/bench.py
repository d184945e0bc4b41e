"""A benchmark client for one engine: llama-server's native routes, used as llama-bench measures.

- ``exact_prompt``: a synthetic prompt of exactly N tokens, made with the engine's own ``/tokenize``;
  its tokens must survive a round trip (detokenize, tokenize again) so that the text and the token list
  are the same prompt.
- ``measure``: one ``/completion`` of those tokens with the prompt cache off, a fixed seed, greedy
  sampling and exactly M generated tokens (``ignore_eos``), read back as the engine's ``timings``.
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import TYPE_CHECKING, Any

from app.client.chat import read_answer
from app.core.bench import BENCH_SEED, Sample
from app.core.errors import RequestError

if TYPE_CHECKING:
    import httpx

# Plain words that tokenize the same wherever they are cut between (space-led words).
FILLER = (
    " The quick brown fox jumps over the lazy dog while the old lighthouse keeper writes his daily log"
    " about ships, storms, gulls and the long grey sea that rolls toward the harbour every evening."
)
TIMEOUT_S = 600.0  # a long prompt on a slow machine


class BenchClient:
    def __init__(self, base_url: str, api_key: str | None) -> None:
        import httpx

        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=headers, trust_env=False, timeout=httpx.Timeout(TIMEOUT_S)
        )

    async def __aenter__(self) -> BenchClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._http.aclose()

    async def _ask(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, bytes]:
        """The engine's answer and its body, read as ``read_answer`` reads a whole reply: a broken
        engine's answer without end is not held in memory."""
        async with self._http.stream(method, path, **kwargs) as response:
            return response, await read_answer(response)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        try:
            response, answer = await self._ask("POST", path, json=body)
        except httpx.TransportError as err:
            raise RequestError(f"The engine did not answer {path} ({type(err).__name__}).") from None
        except httpx.HTTPError as err:  # it answered, with a body that does not decode (say)
            raise RequestError(
                f"The engine's answer to {path} could not be read ({type(err).__name__})."
            ) from None
        if response.status_code != 200:
            said = answer[:300].decode("utf-8", "replace")
            raise RequestError(f"The engine refused {path} (HTTP {response.status_code}): {said}")
        try:
            data = json.loads(answer)
        except (ValueError, RecursionError):
            data = None
        if not isinstance(data, dict):
            raise RequestError(f"The engine sent an unreadable answer to {path}.")
        return data

    async def context_size(self) -> int | None:
        """The context one request can hold (llama-server's ``n_ctx`` per slot, which it keeps within
        the model's trained context), or None when the engine does not say."""
        import httpx

        try:
            response, answer = await self._ask("GET", "/props")
            data = json.loads(answer) if response.status_code == 200 else {}
        except (httpx.HTTPError, RequestError, ValueError, RecursionError):
            return None
        settings = data.get("default_generation_settings") if isinstance(data, dict) else None
        n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
        return n_ctx if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0 else None

    async def tokenize(self, text: str) -> list[int]:
        data = await self._post("/tokenize", {"content": text, "add_special": False})
        tokens = data.get("tokens", [])
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise RequestError("The engine sent an unreadable answer to /tokenize.")
        return tokens

    async def detokenize(self, tokens: list[int]) -> str:
        return str((await self._post("/detokenize", {"tokens": tokens})).get("content", ""))

    async def exact_prompt(self, count: int) -> list[int]:
        """``count`` tokens of plain text that round-trip through the engine's tokenizer."""
        text = FILLER
        tokens = await self.tokenize(text)
        if not tokens:
            raise RequestError("The engine's tokenizer gave no tokens for plain English text.")
        text *= count // len(tokens) + 2
        tokens = (await self.tokenize(text))[:count]
        for _ in range(8):  # a cut inside a word may not round-trip: drop a token and pad with another
            again = await self.tokenize(await self.detokenize(tokens))
            if again == tokens:
                return tokens
            tokens = tokens[:-2] + tokens[1:3]
        raise RequestError(f"Could not make a {count}-token prompt that round-trips through the tokenizer.")

    async def measure(self, prompt: list[int], gen_tokens: int) -> Sample:
        body = {
            "prompt": prompt,
            "n_predict": gen_tokens,
            "ignore_eos": True,
            "cache_prompt": False,
            "seed": BENCH_SEED,
            "temperature": 0.0,
            "top_k": 1,
            "stream": False,
        }
        timings = (await self._post("/completion", body)).get("timings") or {}
        try:
            prompt_n, prompt_ms = int(timings["prompt_n"]), float(timings["prompt_ms"])
            predicted_n, predicted_ms = int(timings["predicted_n"]), float(timings["predicted_ms"])
        except (KeyError, TypeError, ValueError, OverflowError):
            raise RequestError("The engine's answer had no timings to measure with.") from None
        if prompt_n != len(prompt) or predicted_n != gen_tokens:
            raise RequestError(
                f"The engine processed {prompt_n} prompt tokens and generated {predicted_n}; the bench asked "
                f"for {len(prompt)} and {gen_tokens}."
            )
        first_token_ms = predicted_ms / predicted_n if predicted_n else 0.0
        return Sample(
            pp_tps=prompt_n / (prompt_ms / 1000) if prompt_ms > 0 else 0.0,
            tg_tps=predicted_n / (predicted_ms / 1000) if predicted_ms > 0 else 0.0,
            ttft_s=(prompt_ms + first_token_ms) / 1000,
        )
