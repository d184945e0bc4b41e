"""The chaos suite's one table: every scenario records its trials, outcomes and losses here, and the
terminal summary prints them together at the end of the run (``CHAOS_SEED`` picks the randomness)."""

from __future__ import annotations

import os
import random
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

SEED = int(os.environ.get("CHAOS_SEED", "14"))


@dataclass
class Row:
    scenario: str
    trials: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    lost: str = "nothing"
    seed: int | str = SEED
    worst: str = ""  # the slowest reaction or the largest loss seen, where it is measured

    def add(self, outcome: str) -> None:
        self.trials += 1
        self.outcomes[outcome] += 1


ROWS: list[Row] = []


def rng(scenario: str) -> random.Random:
    """One seeded generator per scenario, so a scenario's trials do not depend on the others run."""
    return random.Random(f"{SEED}:{scenario}")


@pytest.fixture
def chaos_row(request: pytest.FixtureRequest) -> Iterator[Row]:
    """A row of the table, named by the test's ``chaos`` marker text or its name."""
    marker = request.node.get_closest_marker("chaos")
    row = Row(marker.args[0] if marker else request.node.name)
    ROWS.append(row)
    yield row
    if getattr(request.node, "rep_call_failed", False):
        row.outcomes["TEST FAILED"] += 1


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos(scenario): the chaos table row a test fills")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.when == "call" and report.failed:
        item.rep_call_failed = True  # type: ignore[attr-defined]
    return report


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ROWS:
        return
    write = terminalreporter.write_line
    terminalreporter.section(f"chaos table (CHAOS_SEED={SEED})")
    write(f"{'scenario':<46} {'seed':>5} {'trials':>6}  {'worst':<22} outcomes | lost")
    write("-" * 120)
    for row in ROWS:
        outcomes = ", ".join(f"{k} {v}" for k, v in row.outcomes.items()) or "-"
        head = f"{row.scenario:<46} {row.seed!s:>5} {row.trials:>6}  {row.worst or '-':<22}"
        write(f"{head} {outcomes} | {row.lost}")


# The release mirror and the real llama.cpp tarball it serves (cached across runs: tests/support/llama.py).
from tests.gui.conftest import desktop, qt_loop  # noqa: E402, F401
from tests.integration.conftest import llama_dir, mirror, release_tarball  # noqa: E402, F401
