"""The transition tables of a model's load (``LoadState``) and of a download (``DownloadState``): every
move drawn below is allowed, every other raises ``IllegalMove`` naming both states, and the record that
moves is left as it was. The moves are written out here, apart from the tables, so that a table that
changes is a decision this test is changed for."""

from __future__ import annotations

import itertools

import pytest

from app.core.downloads import DownloadRecord, DownloadState
from app.core.moves import IllegalMove
from app.core.refs import FileSet
from app.core.status import LoadState, check_load_move
from app.supervisor.router.runtime import ModelRuntime

L, D = LoadState, DownloadState
PHASES = {L.DOWNLOADING, L.INSTALLING, L.LOADING}
CRASH = {L.RESTARTING, L.GAVE_UP}
LOAD_MOVES = {
    L.IDLE: PHASES | CRASH | {L.FAILED},
    L.DOWNLOADING: {L.IDLE, L.INSTALLING, L.LOADING, L.FAILED},
    L.INSTALLING: CRASH | {L.IDLE, L.LOADING, L.FAILED},
    L.LOADING: CRASH | {L.IDLE, L.RUNNING, L.FAILED},
    L.RUNNING: CRASH | {L.IDLE},
    L.RESTARTING: CRASH | {L.IDLE, L.RUNNING, L.FAILED},
    L.GAVE_UP: {L.IDLE, L.FAILED},
    L.FAILED: CRASH | {L.IDLE},
}
DOWNLOAD_MOVES = {
    D.QUEUED: {D.RUNNING, D.PAUSED, D.FAILED, D.CANCELLED},
    D.RUNNING: {D.DONE, D.PAUSED, D.FAILED, D.CANCELLED},
    D.PAUSED: {D.QUEUED, D.CANCELLED},
    D.DONE: set(),
    D.FAILED: {D.QUEUED, D.CANCELLED},
    D.CANCELLED: {D.QUEUED, D.CANCELLED},
}


def record(state: DownloadState) -> DownloadRecord:
    return DownloadRecord(
        "org/Repo-GGUF:Q4_0", "user.repo", FileSet("org/Repo-GGUF", "main", "llamacpp", "Q4_0", ()), state
    )


def test_every_state_has_its_moves_written_out() -> None:
    assert set(LOAD_MOVES) == set(LoadState)
    assert set(DOWNLOAD_MOVES) == set(DownloadState)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(LoadState, LoadState)))
def test_a_load_moves_as_drawn_and_no_other_way(old: LoadState, new: LoadState) -> None:
    model = ModelRuntime("user.tiny", state=old, error="why")
    if new in LOAD_MOVES[old] or new is old:  # staying put is not a move
        model.move(new, "now")
        assert (model.state, model.error) == (new, "now")
        return
    with pytest.raises(IllegalMove) as illegal:
        model.move(new, "now")
    assert str(illegal.value) == f"the load of user.tiny: {old.value} -> {new.value} is not a legal move"
    assert (model.state, model.error) == (old, "why"), "an illegal move changes nothing"


def test_the_load_check_names_the_model_and_both_states() -> None:
    with pytest.raises(IllegalMove, match=r"the load of m: gave up -> running is not a legal move"):
        check_load_move("m", L.GAVE_UP, L.RUNNING)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(DownloadState, DownloadState)))
def test_a_download_moves_as_drawn_and_no_other_way(old: DownloadState, new: DownloadState) -> None:
    before = record(old)
    if new in DOWNLOAD_MOVES[old]:
        moved = before.with_state(new, "said", 7)
        assert (moved.state, moved.message, moved.done_bytes) == (new, "said", 7)
        return
    with pytest.raises(IllegalMove) as illegal:
        before.with_state(new)
    assert (
        str(illegal.value) == f"download org/Repo-GGUF:Q4_0: {old.value} -> {new.value} is not a legal move"
    )
