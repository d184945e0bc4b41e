"""Numbers read from JSON that something else wrote: an engine, a remote, the Hub, a model's header."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number; None for a bool, for anything that is no number,
    for NaN and the infinities (Python's JSON reader takes ``NaN``, ``Infinity`` and 1e999), and for an
    integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None
