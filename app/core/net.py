"""Addresses: whether a host is this machine only (what the app binds to unless told otherwise)."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
