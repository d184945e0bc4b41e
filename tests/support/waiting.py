"""Waiting for a state in async tests: looked at every few milliseconds, with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Wait for a state, looking each few milliseconds; fail after ``timeout_s``: a deadline, not a
    timing, long enough for a state that comes in a few seconds here to come on a machine ten times
    slower."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the state waited for did not come")
        await asyncio.sleep(0.005)
