"""Addresses: whether a host is this machine only (what the app binds to unless told otherwise)."""

from __future__ import annotations

import ipaddress

OLLAMA_PORT = 11434  # Ollama's own, where its clients look by default


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
