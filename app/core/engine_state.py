"""An engine's states and the legal moves between them (the engine process itself is
``app.supervisor.engine``)::

    STOPPED -> STARTING -> READY -> STOPPING -> STOPPED
                  |          '---> CRASHED (exited, or hung and killed)
                  '---> FAILED (never became ready: bad model, port taken, timeout)
"""

from __future__ import annotations

from enum import Enum


class EngineState(Enum):
    STOPPED = "stopped"  # no process: not started yet, or stopped on request
    STARTING = "starting"  # process running, model loading: /health has not answered 200 yet
    READY = "ready"  # /health answered 200: serving requests
    STOPPING = "stopping"  # stop requested: SIGTERM sent, SIGKILL after the grace period
    FAILED = "failed"  # never became ready (bad model, port taken, timeout); ``error`` says why
    CRASHED = "crashed"  # died or hung after it was ready (a hung one is killed); ``error`` says why


_TRANSITIONS: dict[EngineState, frozenset[EngineState]] = {
    EngineState.STOPPED: frozenset({EngineState.STARTING}),
    EngineState.STARTING: frozenset({EngineState.READY, EngineState.FAILED, EngineState.STOPPING}),
    EngineState.READY: frozenset({EngineState.STOPPING, EngineState.CRASHED}),
    EngineState.STOPPING: frozenset({EngineState.STOPPED}),
    EngineState.FAILED: frozenset({EngineState.STARTING}),
    EngineState.CRASHED: frozenset({EngineState.STARTING}),
}


def can_transition(old: EngineState, new: EngineState) -> bool:
    return new in _TRANSITIONS[old]
