"""The router's policy and recovery against the stand-in engine (a real child process that answers like
llama-server and crashes or hangs on command): LRU by touch, caps, pins, idle unload, restart and replay,
giving up, the fit refusal and settings applied live. Seconds, not minutes."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from app.core.engine_state import EngineState
from app.core.errors import ConfigError, EngineError, FitError, PolicyError
from app.core.lemon_mlx import DeviceType
from app.core.policy import Caps, LoadedModel, over_caps, parse_caps, plan_evictions
from app.core.status import Status
from app.store.model_options import ModelOptions
from app.store.settings import Settings
from app.supervisor.router import EngineRecovery, Router, RouterEvent
from app.supervisor.router import recovery as router_module
from tests.support.standin import control, make_standin_model

SYSTEM = ModelOptions(backend="system")
T = TypeVar("T")
GPU, CPU = DeviceType.GPU, DeviceType.CPU


def run(settings: Settings, body: Callable[[Router], Awaitable[T]], **router_kw: Any) -> T:
    async def go() -> T:
        async with Router(settings, **router_kw) as router:
            return await body(router)

    return asyncio.run(go())


def models(router: Router, tmp_path: Path, *names: str, **behaviour: Any) -> list[str]:
    """Stand-in models imported into the library, each loading on the `system` backend."""
    out = []
    for name in names:
        model = router.library.import_path(make_standin_model(tmp_path, name, **behaviour))
        router.save_options(model.name, SYSTEM)
        out.append(model.name)
    return out


def ready(router: Router) -> set[str]:
    return set(router.loaded())


# --- the pure policy ----------------------------------------------------------------------------------


def test_caps_parse_a_number_or_per_device_json_and_refuse_the_rest() -> None:
    assert parse_caps(2) == Caps(2)
    assert parse_caps('{"gpu": 1, "cpu": 2, "total": 3}').to_json() == {"gpu": 1, "cpu": 2, "total": 3}
    for bad in (0, "x", '{"tpu": 1}', '{"gpu": 0}', True, {}, "[" * 100_000 + "]" * 100_000):
        with pytest.raises(ConfigError, match="max_loaded_models"):
            parse_caps(bad)


def test_evictions_take_the_least_recently_used_unpinned_model_counted_against_the_cap() -> None:
    loaded = [
        LoadedModel("old-gpu", GPU, False, 1.0),
        LoadedModel("cpu", CPU, False, 0.5),
        LoadedModel("new-gpu", GPU, False, 3.0),
    ]
    assert plan_evictions(loaded, "x", GPU, Caps(3)) == ["cpu"]  # total: the oldest of all
    assert plan_evictions(loaded, "x", GPU, parse_caps({"gpu": 2, "total": 4})) == ["old-gpu"]
    assert plan_evictions(loaded, "x", CPU, parse_caps({"gpu": 2, "cpu": 1})) == ["cpu"]
    assert plan_evictions(loaded, "cpu", CPU, parse_caps({"cpu": 1, "total": 3})) == []  # a reload in place
    pinned = [dataclasses.replace(m, pinned=m.device is GPU) for m in loaded]
    with pytest.raises(PolicyError) as refused:
        plan_evictions(pinned, "x", GPU, parse_caps({"gpu": 2}))
    assert refused.value.pinned == ("old-gpu", "new-gpu") and "pinned: old-gpu, new-gpu" in str(refused.value)
    assert over_caps(loaded, Caps(1)) == ["cpu", "old-gpu"]
    assert over_caps(pinned, Caps(1)) == ["cpu"]  # pinned models stay, even over the cap


# --- the router on real processes ---------------------------------------------------------------------


def test_lru_is_by_last_request_not_by_load_order(standin_settings: Settings, tmp_path: Path) -> None:
    settings = dataclasses.replace(standin_settings, max_loaded_models=2)

    async def body(router: Router) -> tuple[set[str], set[str]]:
        a, b, c = models(router, tmp_path, "a", "b", "c")
        await router.load(a)
        await router.load(b)
        reply = await router.chat(a, [{"role": "user", "content": "hi"}])  # a is now the recent one
        assert reply.content
        first = ready(router)
        await router.load(c)
        return first, ready(router)

    first, after = run(settings, body)
    assert first == {"user.a", "user.b"}
    assert after == {"user.a", "user.c"}, "b was loaded after a, but a was used last"


@pytest.mark.parametrize(
    ("caps", "left"), [({"cpu": 1, "total": 3}, {"user.b"}), ({"gpu": 1, "total": 3}, {"user.a", "user.b"})]
)
def test_a_per_device_cap_evicts_within_the_device(
    standin_settings: Settings, tmp_path: Path, caps: dict[str, int], left: set[str]
) -> None:
    settings = dataclasses.replace(standin_settings, max_loaded_models=caps)

    async def body(router: Router) -> set[str]:
        a, b = models(router, tmp_path, "a", "b")
        await router.load(a)
        # The system llama-server, on a machine without a GPU, computes on the CPU: one at a time there,
        # and a cap on the GPU leaves it be.
        await router.load(b)
        return ready(router)

    assert run(settings, body) == left


def test_a_load_blocked_only_by_pinned_models_names_them(standin_settings: Settings, tmp_path: Path) -> None:
    async def body(router: Router) -> tuple[PolicyError, set[str], Status]:
        a, b = models(router, tmp_path, "a", "b")
        router.set_pinned(a, True)
        await router.load(a)
        with pytest.raises(PolicyError) as refused:
            await router.load(b)
        return refused.value, ready(router), router.status(b).status.status

    error, loaded, b_status = run(standin_settings, body)
    assert "user.b cannot load" in str(error) and "pinned: user.a" in str(error)
    assert "Unpin or unload" in str(error)
    assert loaded == {"user.a"} and b_status is Status.FAILED


def test_idle_models_are_unloaded_unless_pinned(standin_settings: Settings, tmp_path: Path) -> None:
    settings = dataclasses.replace(standin_settings, max_loaded_models=3, idle_unload_minutes=1)
    now = [1000.0]

    async def body(router: Router) -> tuple[list[str], list[str], set[str]]:
        a, b, c = models(router, tmp_path, "a", "b", "c")
        router.set_pinned(c, True)
        for name in (a, b, c):
            await router.load(name)
        now[0] += 50
        await router.chat(b, [{"role": "user", "content": "hi"}])  # b was used 10 s before the check
        now[0] += 10
        early = await router.unload_idle()
        now[0] += 60
        late = await router.unload_idle()
        return early, late, ready(router)

    early, late, left = run(settings, body, clock=lambda: now[0])
    assert early == ["user.a"]
    assert late == ["user.b"]
    assert left == {"user.c"}, "a pinned model is never unloaded for idling"


def test_a_crash_restarts_the_engine_and_replays_the_request(
    standin_settings: Settings, tmp_path: Path
) -> None:
    events: list[RouterEvent] = []

    async def body(router: Router) -> tuple[str, int, int]:
        router.subscribe(events.append)
        (name,) = models(router, tmp_path, "slow", tokens=40, token_delay_s=0.05)
        engine = await router.load(name)
        first = engine.pid
        assert first is not None
        request = asyncio.ensure_future(router.chat(name, [{"role": "user", "content": "hi"}]))
        while not engine.watch.in_flight:
            await asyncio.sleep(0.01)
        await control(engine.base_url, "crash")
        reply = await request  # broken by the crash, sent again once the engine is back
        again = router.supervisor.engine(name).pid
        assert again is not None
        return reply.content, first, again

    content, first, again = run(standin_settings, body)
    assert content.count("tok") == 40 and again != first
    assert not psutil.pid_exists(first) or psutil.Process(first).status() == psutil.STATUS_ZOMBIE
    recovery = [e for e in events if isinstance(e, EngineRecovery)]
    assert [e.gave_up for e in recovery] == [False, False]
    assert "restarting it in 1 s" in recovery[0].message and "simulated crash" in recovery[0].message


def test_a_stream_broken_by_a_crash_ends_with_an_error_naming_the_cause(
    standin_settings: Settings, tmp_path: Path
) -> None:
    async def body(router: Router) -> tuple[EngineError, bool]:
        (name,) = models(router, tmp_path, "chatty", tokens=200, token_delay_s=0.02)
        engine = await router.load(name)
        with pytest.raises(EngineError) as broken:
            async for _ in router.stream_chat(name, [{"role": "user", "content": "hi"}]):
                if engine.state is EngineState.READY and engine.watch.in_flight:
                    await control(engine.base_url, "crash")
        restart = router._restarts.get(name)
        assert restart is not None, "the engine restarts behind the failed stream"
        again = await restart
        return broken.value, again.state is EngineState.READY and again.pid != engine.pid

    error, restarted = run(standin_settings, body)
    assert "stopped unexpectedly" in str(error) and "fatal: simulated crash" in error.last_output
    assert restarted


def test_three_crashes_in_five_minutes_and_it_gives_up_with_last_words(
    standin_settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(router_module, "RESTART_BACKOFF_S", (0.05, 0.05, 0.05))
    events: list[RouterEvent] = []

    async def body(router: Router) -> tuple[Status, str]:
        router.subscribe(events.append)
        (name,) = models(router, tmp_path, "fragile")
        await router.load(name)
        for _ in range(3):
            engine = await router.ensure_loaded(name)
            await control(engine.base_url, "crash")
            await engine.wait_for_state(EngineState.CRASHED)
        await asyncio.sleep(0.3)  # no fourth start comes
        view = router.status(name)
        return view.status.status, view.status.message

    status, message = run(standin_settings, body)
    recovery = [e for e in events if isinstance(e, EngineRecovery)]
    assert [e.gave_up for e in recovery] == [False, False, False, False, True]
    assert status is Status.CRASHED
    assert "crashed 3 times in 5 minutes" in message and "fatal: simulated crash" in message


def test_the_fit_check_refuses_with_numbers_unless_forced(standin_settings: Settings, tmp_path: Path) -> None:
    huge = dataclasses.replace(SYSTEM, ctx_size=400_000_000)  # a KV cache of about 100 GB

    async def body(router: Router) -> tuple[FitError, Status, EngineState]:
        (name,) = models(router, tmp_path, "tiny")
        with pytest.raises(FitError) as refused:
            await router.load(name, huge)
        status = router.status(name).status.status
        engine = await router.load(name, huge, force=True)
        return refused.value, status, engine.state

    error, status, forced = run(standin_settings, body)
    text = str(error)
    assert "user.tiny needs" in text and "GB" in text and "of RAM is free now" in text
    assert "a context of" in text and "load it anyway" in text
    assert status is Status.FAILED and forced is EngineState.READY


def test_settings_apply_live_and_a_lower_cap_evicts_the_least_recent(
    standin_settings: Settings, tmp_path: Path
) -> None:
    settings = dataclasses.replace(standin_settings, max_loaded_models=3)

    async def body(router: Router) -> tuple[set[str], float]:
        a, b, c = models(router, tmp_path, "a", "b", "c")
        for name in (a, b, c):
            await router.load(name)
        await router.chat(a, [{"role": "user", "content": "hi"}])
        router.apply_settings(dataclasses.replace(settings, max_loaded_models=1, hang_grace_s=7.0))
        while len(router.loaded()) > 1:
            await asyncio.sleep(0.02)
        return ready(router), router.supervisor.engine(a).hang_grace_s

    left, grace = run(settings, body)
    assert left == {"user.a"} and grace == 7.0
