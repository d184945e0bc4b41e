"""litellm as another app uses it, in a process of its own (its logging threads live as long as the
process that imported it): ``python -m tests.support.litellm_client URL KEY MODEL`` asks the model
through each dialect, whole, streamed and with a wrong key, and prints one JSON line per dialect."""

from __future__ import annotations

import json
import os
import sys

RESULT = "litellm-client:"
QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def main(url: str, key: str, model: str) -> None:
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # its price list from the package, not the net
    import litellm

    for provider, base in (("openai", f"{url}/v1"), ("anthropic", url), ("ollama_chat", url)):
        asked = {
            "model": f"{provider}/{model}",
            "api_base": base,
            "api_key": key,
            "messages": QUESTION,
            "max_tokens": 16,
            "temperature": 0,
        }
        whole = litellm.completion(**asked)
        pieces = [c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **asked)]
        try:
            litellm.completion(**{**asked, "api_key": "wrong"})
            refused = ""
        except litellm.AuthenticationError as err:
            refused = type(err).__name__
        said = {
            "provider": provider,
            "text": whole.choices[0].message.content,
            "usage": [whole.usage.prompt_tokens, whole.usage.completion_tokens],
            "pieces": pieces,
            "wrong key": refused,
        }
        print(RESULT, json.dumps(said), flush=True)  # litellm prints its own lines to stdout too


if __name__ == "__main__":
    main(*sys.argv[1:4])
