"""Terminal output shared by the subcommands: JSON, tables, a download progress bar, telemetry lines."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from app.core.rpc import workers_for
from app.core.status import LoadState
from app.core.telemetry import Telemetry
from app.store.settings import Settings, load_settings
from app.supervisor.installer import InstallPhase
from app.supervisor.router import LoadProgress
from app.supervisor.supervisor import InstallProgress, SupervisorEvent

MB = 1_000_000


def add_rpc_argument(parser: argparse.ArgumentParser) -> None:
    """``--rpc``, the same on ``run``, ``serve`` and ``bench`` (``checked_rpc`` reads it)."""
    parser.add_argument(
        "--rpc",
        metavar="HOST:PORT,...",
        help="spread llama.cpp models over these RPC workers (`lemon-desk worker`); `local`: none",
    )


def checked_rpc(args: argparse.Namespace) -> str:
    """The ``--rpc`` value ("" when not given); a bad list is refused before anything starts."""
    text: str = args.rpc or ""
    if text:
        workers_for(text, "", "")
    return text


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2))


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def telemetry_line(t: Telemetry) -> str:
    return (
        f"time to first token {t.ttft_s:.2f} s · prompt {t.prompt_tokens} tokens at {t.prompt_tps:.1f} tok/s"
        f" · reply {t.completion_tokens} tokens at {t.decode_tps:.1f} tok/s"
    )


class ProgressBar:
    """Install progress on a terminal: a bar redrawn in place; on a pipe, one line per phase."""

    WIDTH = 30
    DETAIL_WIDTH = 60  # pip's latest step, redrawn in place

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr  # looked up now: a test may have replaced it since import
        self.live = self.stream.isatty()
        self.phase: InstallPhase | None = None
        self.drawn = False

    def on_event(self, event: SupervisorEvent) -> None:
        if not isinstance(event, InstallProgress):
            return
        if event.phase is not self.phase:
            self.phase = event.phase
            self._end_line()
            if not self.live:
                print(f"{event.key}: {event.phase.value}", file=self.stream, flush=True)
        if self.live and event.phase is InstallPhase.DOWNLOADING and event.total:
            self._draw(event)
        elif self.live and event.phase is InstallPhase.UNPACKING:
            print(f"{event.key}: unpacking", file=self.stream, flush=True)
        elif self.live and event.detail:
            self.stream.write(f"\r{event.key}: {event.detail[: self.DETAIL_WIDTH]:<{self.DETAIL_WIDTH}}")
            self.stream.flush()
            self.drawn = True

    def _draw(self, p: InstallProgress) -> None:
        fraction = p.done / p.total if p.total else 0.0
        filled = int(fraction * self.WIDTH)
        eta = f"ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
        self.stream.write(
            f"\r{p.key} [{'#' * filled}{'-' * (self.WIDTH - filled)}] {fraction:4.0%} "
            f"{p.done / MB:.1f}/{p.total / MB if p.total else 0:.1f} MB {p.speed_bps / MB:.1f} MB/s {eta}  "
        )
        self.stream.flush()
        self.drawn = True

    def _end_line(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.drawn = False

    def close(self) -> None:
        self._end_line()


def load_settings_noting_problems() -> Settings:
    """The settings; a problem reading them is a warning on stderr, not a failure."""
    loaded = load_settings()
    if loaded.warning:
        print(f"warning: {loaded.warning}", file=sys.stderr)
    return loaded.settings


class LoadLines:
    """A one-click load on the terminal: one line per phase (downloading, installing, loading), redrawn
    in place with its percentage on a terminal; on a pipe, the line alone."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.phase: LoadState | None = None
        self.shown = -1

    def __call__(self, event: object) -> None:
        if not isinstance(event, LoadProgress):
            return
        percent = 100 * event.done // event.total if event.total else -1
        if event.phase is self.phase and (not self.live or percent == self.shown):
            return
        detail = f" {event.detail}" if event.detail and event.phase is LoadState.INSTALLING else ""
        line = f"{event.model}: {event.phase.value}{detail}" + (f" {percent}%" if percent >= 0 else "")
        if self.live:
            end = "\n" if event.phase is not self.phase and self.phase is not None else ""
            last = "\n" if event.phase is LoadState.LOADING else ""  # the reply follows on stdout
            self.stream.write(f"{end}\r{line}\033[K{last}")
        else:
            self.stream.write(f"{line}\n")
        self.stream.flush()
        self.phase, self.shown = event.phase, percent
