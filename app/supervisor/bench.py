"""``bench``: an engine A/B on the user's machine, a client of the router (the CLI's and the window's
one bench, ``bench()``).

Each model is loaded on each backend through the router's one-click load (so the loading policy and
run's check against free memory hold, the latter skipped with ``force``), warmed up once, then measured
``repetitions`` times as llama-bench measures (``app.client.bench``), once the engine's context is
known to hold the prompt and the reply. A model the bench loaded is unloaded again when its measurement
ends, cancelled or not; one that was loaded before is left as it was. On engines without llama-server's
native routes (lemon-mlx, mlx-lm) a chat reply of ``gen_tokens`` tokens to a prompt of about
``prompt_tokens`` tokens stands in, read through the reply's telemetry; the result then carries the
token counts the engine reported. A remote model (``@NAME/MODEL``) is measured the same way through its
remote (recipe ``remote``, backend the remote's name), loaded there first and unloaded after when the
bench loaded it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.client.bench import FILLER, BenchClient
from app.core.backends import BackendKey
from app.core.bench import BenchResult, BenchRun, BenchSpec, Sample, summarize
from app.core.errors import ConfigError
from app.core.models import Model
from app.core.remotes import RemoteKind, is_remote_model, parse_remote_model
from app.store.bench_results import save_run
from app.store.model_options import ModelOptions
from app.store.saving import saving

if TYPE_CHECKING:
    from app.supervisor.engine import Engine
    from app.supervisor.router import Router

log = logging.getLogger(__name__)

REMOTE = "remote"  # the recipe a remote model's results carry
WARMUP_PROMPT = 16
WARMUP_GEN = 4


@dataclass(frozen=True)
class BenchProgress:
    """A bench moved on: ``done`` of ``total`` repetitions (warm-ups not counted)."""

    run_id: str
    done: int
    total: int
    model: str
    backend: str  # "recipe:backend", "" while the default is being found
    detail: str  # "loading", "warming up", "repetition 2 of 3", "done"
    result: BenchResult | None = None  # set when one model and backend is finished


Progress = Callable[[BenchProgress], None]


def plan(router: Router, spec: BenchSpec) -> list[tuple[Model, str | None]]:
    """Every (model, backend) pair: each backend given for the model's recipe, else its default."""
    spec.check()
    keys = [BackendKey.parse(b) for b in spec.backends]
    pairs: list[tuple[Model, str | None]] = []
    for name in spec.models:
        if is_remote_model(name):
            parse_remote_model(name)  # the shape is checked before anything runs
            pairs.append((Model(name, REMOTE, name), None))
            continue
        model = router.catalog.find(name)
        backends = [k.backend for k in keys if k.recipe == model.recipe]
        if keys and not backends:
            raise ConfigError(
                f"None of the backends given is a {model.recipe} backend, which {model.name} needs.",
                f"Add --backend {model.recipe}:BACKEND.",
            )
        pairs += [(model, b) for b in backends] if backends else [(model, None)]
    return pairs


async def bench(router: Router, spec: BenchSpec, progress: Progress, run_id: str = "") -> BenchRun:
    """Measure every model of ``spec`` on each of its backends (``progress`` hears each step). Cancelling
    it unloads what it loaded. The run is kept in the app's home with its hardware and versions
    (``app.store.bench_results``); a warning saving it is logged and added to the router's."""
    run = await run_bench(router, spec, progress, run_id)
    with saving("the bench results"):
        saved = await asyncio.to_thread(save_run, run)
    if saved.warning:
        log.warning("%s", saved.warning)
        router.warnings.append(saved.warning)
    return run


async def run_bench(router: Router, spec: BenchSpec, progress: Progress, run_id: str = "") -> BenchRun:
    run_id = run_id or uuid.uuid4().hex
    pairs = plan(router, spec)
    total = len(pairs) * spec.repetitions
    results: list[BenchResult] = []
    info = await router.backends.info()
    for index, (model, backend) in enumerate(pairs):
        done = index * spec.repetitions

        def say(
            detail: str, n: int, key: str, result: BenchResult | None = None, name: str = model.name
        ) -> None:
            progress(BenchProgress(run_id, n, total, name, key, detail, result))

        say("loading", done, f"{model.recipe}:{backend}" if backend else "")
        if model.recipe == REMOTE:
            result = await _bench_remote(router, model.name, spec, done, say)
            results.append(result)
            say("done", done + spec.repetitions, f"{result.recipe}:{result.backend}", result)
            continue
        was_loaded = model.name in router.loaded()
        options = ModelOptions(
            backend=backend,
            ctx_size=spec.context,
            args=spec.args,
            rpc=spec.rpc if model.recipe == "llamacpp" else "",
        )
        try:
            engine = await router.load(model, options, force=spec.force)
            key = f"{engine.request.recipe}:{engine.request.backend}"
            # The version `backends` and `system-info` show for this backend: one source for one binary.
            version = info.recipes[model.recipe].backends[engine.request.backend].version
            if model.recipe == "llamacpp":
                result = await _bench_llama(engine, spec, version, key, done, say)
            else:
                result = await _bench_chat(router, engine, spec, version, key, done, say)
        finally:
            if not was_loaded:
                await asyncio.shield(router.unload(model.name))
        results.append(result)
        say("done", done + spec.repetitions, key, result)
    return BenchRun(run_id, time.time(), info.hardware.to_json(), tuple(results))


async def _bench_llama(
    engine: Engine, spec: BenchSpec, version: str, key: str, done: int, say: Callable[..., None]
) -> BenchResult:
    async with BenchClient(engine.base_url, engine.api_key) as client:
        context = await client.context_size()
        needed = spec.prompt_tokens + spec.gen_tokens
        if context is not None and needed > context:
            raise ConfigError(
                f"{engine.id} runs with a context of {context:,} tokens on {key}; a prompt of "
                f"{spec.prompt_tokens:,} tokens and a reply of {spec.gen_tokens:,} need {needed:,}.",
                f"Give --prompt-tokens and --gen-tokens that add up to at most {context:,} (llama-server "
                "runs a model with at most the context it was trained for).",
            )
        say("warming up", done, key)
        await client.measure(await client.exact_prompt(WARMUP_PROMPT), WARMUP_GEN)
        prompt = await client.exact_prompt(spec.prompt_tokens)
        samples = []
        for rep in range(spec.repetitions):
            say(f"repetition {rep + 1} of {spec.repetitions}", done + rep, key)
            samples.append(await client.measure(prompt, spec.gen_tokens))
    name, recipe, backend = engine.id, engine.request.recipe, engine.request.backend
    return summarize(name, recipe, backend, version, spec.prompt_tokens, spec.gen_tokens, samples)


async def _bench_chat(
    router: Router,
    engine: Engine,
    spec: BenchSpec,
    version: str,
    key: str,
    done: int,
    say: Callable[..., None],
) -> BenchResult:
    samples, prompt_tokens, gen_tokens = await _chat_samples(router, engine.id, spec, key, done, say)
    recipe, backend = engine.request.recipe, engine.request.backend
    return summarize(engine.id, recipe, backend, version, prompt_tokens, gen_tokens, samples)


async def _chat_samples(
    router: Router,
    name: str,
    spec: BenchSpec,
    key: str,
    done: int,
    say: Callable[..., None],
    **extra: Any,
) -> tuple[list[Sample], int, int]:
    """Chat replies of ``gen_tokens`` to a prompt of about ``prompt_tokens``, through the router."""
    words = FILLER.split()
    text = " ".join(words[i % len(words)] for i in range(int(spec.prompt_tokens * 0.75)))
    params = {"max_tokens": spec.gen_tokens, "temperature": 0.0, "seed": 42, **extra}
    say("warming up", done, key)
    await router.chat(name, [{"role": "user", "content": "Hi"}], max_tokens=WARMUP_GEN)
    samples, prompt_tokens, gen_tokens = [], spec.prompt_tokens, spec.gen_tokens
    for rep in range(spec.repetitions):
        say(f"repetition {rep + 1} of {spec.repetitions}", done + rep, key)
        # A different first word each time: no engine-side prompt cache can serve a repetition.
        reply = await router.chat(name, [{"role": "user", "content": f"{rep} {text}"}], **params)
        t = reply.telemetry
        samples.append(Sample(t.prompt_tps, t.decode_tps, t.ttft_s))
        prompt_tokens, gen_tokens = t.prompt_tokens, t.completion_tokens
    return samples, prompt_tokens, gen_tokens


async def _bench_remote(
    router: Router, name: str, spec: BenchSpec, done: int, say: Callable[..., None]
) -> BenchResult:
    remote = parse_remote_model(name).remote
    key = f"{REMOTE}:{remote}"
    await router.remotes.refresh([remote])
    before = router.remotes.model(name)
    was_loaded = before is not None and before.info.loaded
    await router.remotes.load(name)
    snapshot = router.remotes.snapshot(remote)
    # Lemon Desk and Lemonade pass llama.cpp's own fields on: exactly gen_tokens, no prompt cache.
    lemonade = snapshot.kind in (RemoteKind.LEMON_DESK, RemoteKind.LEMONADE)
    extra: dict[str, Any] = {"ignore_eos": True, "cache_prompt": False} if lemonade else {}
    try:
        samples, prompt_tokens, gen_tokens = await _chat_samples(router, name, spec, key, done, say, **extra)
    finally:
        if not was_loaded:
            await asyncio.shield(router.remotes.unload(name))
    version = f"{snapshot.kind.value} {snapshot.version}".strip() if snapshot.kind else ""
    return summarize(name, REMOTE, remote, version, prompt_tokens, gen_tokens, samples)
