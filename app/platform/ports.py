"""Who holds a port: the program listening on it, for a message that says why the app cannot."""

from __future__ import annotations

import psutil


def listener_of(port: int) -> str | None:
    """The program listening on TCP ``port`` here, as ``NAME (pid N)``; None when it cannot be told (no
    one listens, or the system does not say whose socket it is)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return f"{psutil.Process(conn.pid).name()} (pid {conn.pid})"
            except psutil.Error:
                return f"pid {conn.pid}"
    return None
