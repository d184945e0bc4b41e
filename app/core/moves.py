"""The one check every lifecycle's transition table goes through (a model's load, a download).

A move the table does not allow is a bug in the caller, not something a user can fix, so it raises
``IllegalMove`` (outside the ``LemonDeskError`` tree) with both states named.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TypeVar

State = TypeVar("State", bound=Enum)


class IllegalMove(RuntimeError):
    """A lifecycle was asked for a move its transition table does not allow."""


def check_move(what: str, table: Mapping[State, frozenset[State]], old: State, new: State) -> None:
    if new not in table[old]:
        raise IllegalMove(f"{what}: {old.value} -> {new.value} is not a legal move")
