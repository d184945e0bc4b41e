"""The Backends and Bench windows, made when first opened (their modules are not imported at start-up)
and wired to the bridge then. The Bench window's earlier runs are read in a worker thread."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from app.core.backends import BackendState
from app.store.files import atomic_write_bytes

if TYPE_CHECKING:
    from PySide6.QtWidgets import QWidget

    from app.bridge import Bridge
    from app.core.bench import BenchRun
    from app.ui.backends_dialog import BackendsDialog
    from app.ui.bench_view import BenchView


class ToolWindows:
    def __init__(self, parent: QWidget, warn: Callable[[str], None]) -> None:
        self._parent = parent
        self._warn = warn
        self.backends: BackendsDialog | None = None
        self.bench: BenchView | None = None

    def open_backends(self, bridge: Bridge) -> None:
        if self.backends is None:
            from app.ui.backends_dialog import BackendsDialog

            self.backends = BackendsDialog(self._parent)
            self.backends.install_requested.connect(bridge.install)
            self.backends.cancel_requested.connect(bridge.cancel_install)
            self.backends.uninstall_requested.connect(bridge.uninstall)
            bridge.install_progress.connect(self.backends.set_progress)
            bridge.install_done.connect(self.backends.set_done)
            bridge.backends_changed.connect(self.backends.set_info)
        if bridge.info is not None:
            self.backends.set_info(bridge.info)
        self.backends.show()
        self.backends.raise_()

    def open_bench(self, bridge: Bridge) -> None:
        if self.bench is None:
            from app.ui.bench_view import BenchView

            self.bench = BenchView(self._parent)
            self.bench.run_requested.connect(bridge.run_bench)
            self.bench.cancel_requested.connect(bridge.cancel_bench)
            self.bench.export_requested.connect(self._export_bench)
            bridge.bench_progress.connect(self.bench.set_progress)
            bridge.bench_finished.connect(self.bench.set_finished)
            bridge.bench_failed.connect(self.bench.set_failed)
            bridge.spawn(self._load_bench_runs(self.bench))
        models = sorted(r.name for r in bridge.rows() if r.on_disk)
        info = bridge.info
        backends = [
            f"{recipe}:{name}"
            for recipe, support in (info.recipes.items() if info else ())
            for name, status in support.backends.items()
            if status.state is BackendState.INSTALLED
        ]
        self.bench.set_choices(models, backends)
        self.bench.show()
        self.bench.raise_()

    async def _load_bench_runs(self, bench: BenchView) -> None:
        import asyncio

        from app.store.bench_results import load_runs

        loaded = await asyncio.to_thread(load_runs)
        if loaded.warning:
            self._warn(loaded.warning)
        bench.set_runs(loaded.runs)

    def _export_bench(self, run: BenchRun, fmt: str, path: str) -> None:
        """Written at once (a small file the user just chose), so the file is there when the dialog ends."""
        from app.core.bench import to_markdown as bench_markdown

        data = json.dumps(run.to_json(), indent=2) + "\n" if fmt == "json" else bench_markdown(run)
        try:
            atomic_write_bytes(Path(path), data.encode())
        except OSError as err:
            self._warn(
                f"Could not export the bench results to {path}: {err.strerror}. Choose another folder."
            )
