"""Stop strings the app applies for an engine that does not (lemon-mlx-engine b1050-stable)."""

from __future__ import annotations

from app.core.stops import StopCutter, cut_at_stop, stop_strings


def fed(cutter: StopCutter, *chunks: str) -> list[str]:
    return [cutter.feed(c) for c in chunks]


def test_a_stop_string_across_chunks_is_found_and_nothing_after_it_is_given() -> None:
    cutter = StopCutter(["END"])
    assert fed(cutter, "one E", "N", "D two", "three") == ["one ", "", "", ""]
    assert cutter.hit and cutter.flush() == ""


def test_a_held_tail_that_does_not_become_a_stop_is_given_later() -> None:
    cutter = StopCutter(["END", "\n\n"])
    assert fed(cutter, "a\n", "b EN", "Z") == ["a", "\nb ", "ENZ"]
    assert fed(cutter, "tail E") == ["tail "]
    assert not cutter.hit and cutter.flush() == "E"


def test_the_earliest_of_several_stops_cuts() -> None:
    assert cut_at_stop("x. y! z", [" z", "!"]) == ("x. y", True)
    assert cut_at_stop("no stop here", ["STOP", ""]) == ("no stop here", False)


def test_a_requests_stop_in_either_form() -> None:
    assert stop_strings("\n") == ("\n",)
    assert stop_strings(["a", 3, "b"]) == ("a", "b")
    assert stop_strings(None) == () and stop_strings({"x": 1}) == ()
