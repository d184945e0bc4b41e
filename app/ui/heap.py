"""Keep the cyclic garbage collector's full passes short, so that none of them stalls a frame.

A full collection walks every object the collector tracks, and CPython starts one by itself whenever a
quarter more long-lived objects have built up: in the middle of a streaming reply as likely as anywhere.
The window's modules hold about 30,000 such objects and pyqtgraph with numpy (the Telemetry tab) about
40,000 more; walking 80,000 took 17-21 ms here, twice the longest stall a reply may cause.

``settle()`` collects once and then freezes what is left (``gc.freeze``): modules, classes and the
window live as long as the app, and no later pass walks them again, so a full pass walks only what came
after (well under a millisecond at first). The launcher settles once the window is up; a large module
imported later (the charts' pyqtgraph) calls ``after_import()``, which settles again in a process that
has settled before. Tests never settle: their objects must stay collectable. The price is that garbage
cycles among frozen objects are never freed; the few made at start-up are collected just before.
markdown-it and Pygments (imported by the first reply) add about 5,000 objects and are left unfrozen.
"""

from __future__ import annotations

import gc

_settled = False


def settle() -> None:
    """Collect, then leave every object alive now out of later collections (a pause of tens of ms:
    call it when the app has just started, not while it is showing something that moves)."""
    global _settled
    gc.collect()
    gc.freeze()
    _settled = True


def after_import() -> None:
    """A large module was just imported: settle its objects too, if this process settles."""
    if _settled:
        settle()
