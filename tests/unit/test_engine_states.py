"""The engine's state machine: exactly these moves are legal, and an illegal one is refused."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from app.core.engine_state import EngineState, can_transition
from app.core.errors import ConfigError, EngineError
from app.core.hardware import hardware_from_json
from app.core.launch import LaunchRequest
from app.supervisor.engine import Engine
from tests.conftest import profile_path

S = EngineState
LEGAL = {
    (S.STOPPED, S.STARTING),
    (S.STARTING, S.READY),
    (S.STARTING, S.FAILED),
    (S.STARTING, S.STOPPING),
    (S.READY, S.STOPPING),
    (S.READY, S.CRASHED),
    (S.STOPPING, S.STOPPED),
    (S.FAILED, S.STARTING),
    (S.CRASHED, S.STARTING),
}


def test_exactly_the_legal_moves() -> None:
    for old, new in itertools.product(S, S):
        assert can_transition(old, new) == ((old, new) in LEGAL), f"{old.value} -> {new.value}"


def engine() -> Engine:
    hw = hardware_from_json(json.loads(profile_path("cpu_only_x86").read_text()))
    req = LaunchRequest("llamacpp", "cpu", "/nonexistent/llama-server", "", "/nonexistent/m.gguf")
    return Engine("m", req, hw)


def test_a_binary_that_cannot_run_fails_cleanly() -> None:
    e = engine()
    seen: list[EngineState] = []
    e.add_state_listener(seen.append)
    with pytest.raises(EngineError, match=r"Could not run /nonexistent/llama-server: No such file"):
        asyncio.run(e.start())
    assert seen == [S.STARTING, S.FAILED]
    assert e.error is not None and e.error.hint == "Reinstall the backend and try again."


def test_stop_is_a_no_op_when_nothing_runs() -> None:
    e = engine()
    asyncio.run(e.stop())
    assert e.state is S.STOPPED


def test_reserved_flag_is_refused_before_any_state_change() -> None:
    e = engine()
    e.request = LaunchRequest("llamacpp", "cpu", "/x/llama-server", "", "/m.gguf", user_args=("--port", "1"))
    with pytest.raises(ConfigError, match="--port is set by Lemon Desk"):
        asyncio.run(e.start())
    assert e.state is S.STOPPED


def test_an_illegal_move_is_a_bug_not_a_state() -> None:
    e = engine()
    with pytest.raises(RuntimeError, match="stopped -> ready is not a legal move"):
        e._set_state(S.READY)
    assert e.state is S.STOPPED
