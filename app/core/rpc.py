"""llama.cpp's RPC backend, as far as the app needs it: worker addresses, the probe's wire format, and
where an engine put a model's memory. Pure: no sockets here (``app.supervisor.rpc`` talks to workers).

A worker is ``ggml-rpc-server`` on some machine; ``llama-server --rpc host:port,...`` puts layers and KV
cache on its devices. The protocol has no authentication and no encryption, so the app binds workers to
loopback unless told otherwise. A worker serves one client at a time: while an engine is connected, a
probe gets its TCP connection accepted by the kernel but no answer (the worker is *busy*).

Wire format (ggml-rpc): a request is ``cmd (u8) | size (u64) | data``; a reply is ``size (u64) | data``;
little-endian. Every connection starts with HELLO, answered with the version ``major, minor, patch``
first; protocol 7 adds a 24-byte capability block each way (older workers take an empty HELLO, and
close the connection on one of another size). ``DEVICE_COUNT`` answers a u32, and ``GET_DEVICE_MEMORY``
(a u32 device) answers ``free, total`` as two u64. The protocol's major version changes often (3 in
March 2026, 7 by December): the engine's own build says which one it speaks.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from dataclasses import dataclass

from app.core.errors import ConfigError
from app.core.net import is_loopback

DEFAULT_WORKER_PORT = 50052
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15
CAPS_SIZE = 24
LOCAL_ONLY = "local"  # a model's ``rpc`` option that keeps it off the Settings' workers

_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252})?")


@dataclass(frozen=True, order=True)
class Endpoint:
    """A worker's address."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)


def parse_endpoint(text: str) -> Endpoint:
    """``host:port`` (``[v6]:port`` for IPv6); ConfigError says what is wrong."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        valid = _is_ip(host)
    else:
        valid = bool(_HOST.fullmatch(host))
    # isascii too: str.isdigit() takes "²", which int() refuses.
    digits = port_text.isascii() and port_text.isdigit()
    if not sep or not valid or not digits or not 0 < int(port_text) < 65536:
        raise ConfigError(
            f"{text!r} is not a worker address.",
            "Write host:port, such as 192.168.1.20:50052, and separate workers with commas.",
        )
    return Endpoint(host, int(port_text))


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def worker_endpoint(host: str, port: int) -> Endpoint:
    """The address a worker is to listen on, checked as a worker list's entries are; a refusal names the
    part that is wrong (the list's own says how to write a list)."""
    if not 0 < port < 65536:
        raise ConfigError(f"Port {port} is not one a worker can listen on: give one from 1 to 65535.")
    try:
        return parse_endpoint(str(Endpoint(host.strip(), port)))
    except ConfigError:
        raise ConfigError(
            f"{host.strip()!r} is not a host a worker can listen on: give an IP address or a host name, "
            "such as 127.0.0.1."
        ) from None


def parse_workers(text: str) -> tuple[Endpoint, ...]:
    """A comma-separated worker list (empty: none); the same worker twice is refused."""
    workers = tuple(parse_endpoint(part) for part in text.split(",") if part.strip())
    twice = {str(w) for w in workers if workers.count(w) > 1}
    if twice:
        raise ConfigError(f"The worker {', '.join(sorted(twice))} is listed twice.", "List each worker once.")
    return workers


def workers_for(cli: str | None, option: str, settings: str) -> tuple[Endpoint, ...]:
    """The workers a llama.cpp load uses: ``--rpc`` when given, else the model's ``rpc`` option, else the
    Settings' list. ``local`` (in the option or on the command line) means none."""
    for text in (cli, option or None, settings):
        if text is None:
            continue
        return () if text.strip() == LOCAL_ONLY else parse_workers(text)
    return ()


def exposure_warning(endpoint: Endpoint, allow_network: bool) -> str:
    """The warning for a worker bound beyond loopback (refused unless ``allow_network``); "" on loopback."""
    if endpoint.loopback:
        return ""
    risk = (
        f"An RPC worker on {endpoint.host} can be used by anyone who reaches that address: llama.cpp's RPC "
        "protocol has no authentication and no encryption."
    )
    if not allow_network:
        raise ConfigError(
            risk,
            "Keep it on 127.0.0.1 and reach it through an SSH tunnel (ssh -L 50052:127.0.0.1:50052 HOST), "
            "or, on a private network you trust, allow it with --allow-network.",
        )
    return f"warning: {risk} Use it only on a private network you trust, or through an SSH tunnel."


# --- the probe's messages ---------------------------------------------------------------------------------


def request(cmd: int, data: bytes = b"") -> bytes:
    return struct.pack("<BQ", cmd, len(data)) + data


def hello_request() -> bytes:
    return request(CMD_HELLO, bytes(CAPS_SIZE))  # no transport upgrades offered


def device_memory_request(device: int) -> bytes:
    return request(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device))


def reply_size(header: bytes) -> int:
    (size,) = struct.unpack("<Q", header)
    return int(size)


def parse_version(data: bytes) -> tuple[int, int, int]:
    major, minor, patch = data[0], data[1], data[2]
    return major, minor, patch


def parse_device_count(data: bytes) -> int:
    (count,) = struct.unpack("<I", data)
    return int(count)


def parse_device_memory(data: bytes) -> tuple[int, int]:
    free, total = struct.unpack("<QQ", data)
    return int(free), int(total)


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker answered: its protocol version and each device's free and total bytes."""

    endpoint: Endpoint
    version: tuple[int, int, int]
    devices: tuple[tuple[int, int], ...]

    @property
    def free_bytes(self) -> int:
        return sum(free for free, _ in self.devices)

    @property
    def total_bytes(self) -> int:
        return sum(total for _, total in self.devices)

    def describe(self) -> str:
        gib = 1 << 30
        head = f"{self.endpoint}: RPC protocol {'.'.join(map(str, self.version))}"
        if not self.devices:
            return f"{head}, memory not reported"
        plural = "s" if len(self.devices) != 1 else ""
        return (
            f"{head}, {len(self.devices)} device{plural}, {self.free_bytes / gib:.1f} GiB free of "
            f"{self.total_bytes / gib:.1f} GiB"
        )

    def to_json(self) -> dict[str, object]:
        return {
            "endpoint": str(self.endpoint),
            "protocol": ".".join(map(str, self.version)),
            "devices": [{"free_bytes": f, "total_bytes": t} for f, t in self.devices],
        }


# --- where the engine put the model ------------------------------------------------------------------------

# llama.cpp's load log at verbosity 4 (``-lv 4``: ``app.core.launch.rpc_args``), after a time and level
# prefix: "load_tensors: RPC0[127.0.0.1:50052] model buffer size = 46.00 MiB", "llama_kv_cache:
# RPC0[127.0.0.1:50053] KV buffer size = 84.00 MiB", "load_tensors: CPU_Mapped model buffer size = ...".
# An RPC buffer names its worker in brackets (the RPCn before it is not the device's number). The size
# is a decimal number only: "1.2.3" or "." would be a ValueError from float().
_BUFFER = re.compile(
    r"\s(?P<device>[A-Za-z][\w]*(?:\[(?P<worker>[^\]]+)\])?)\s+(?P<kind>model|KV|compute|output) buffer size"
    r"\s*=\s*(?P<size>\d+(?:\.\d+)?) MiB"
)
_LOCAL_CPU = ("CPU", "CPU_Mapped", "CPU_REPACK")


@dataclass(frozen=True)
class Placement:
    """Bytes of one kind of buffer on one device."""

    device: str  # "CPU" (this machine's memory), a worker's "host:port", or llama.cpp's name ("CUDA0")
    kind: str  # model, KV, compute or output
    bytes: int


def placements(lines: list[str]) -> list[Placement]:
    """Every buffer the engine's load log reports, in order (pass the lines of one load)."""
    found = []
    for line in lines:
        match = _BUFFER.search(line)
        if match is None:
            continue
        device = match["worker"] or match["device"]
        device = "CPU" if device in _LOCAL_CPU else device
        found.append(Placement(device, match["kind"], int(float(match["size"]) * (1 << 20))))
    return found


def describe_placement(by_device: dict[str, int]) -> str:
    """ "127.0.0.1:50153 191 MiB, 127.0.0.1:50152 189 MiB, this machine 73 MiB" ("" for none)."""
    return ", ".join(
        f"{'this machine' if device == 'CPU' else device} {size / (1 << 20):.0f} MiB"
        for device, size in by_device.items()
    )


def memory_by_device(lines: list[str]) -> dict[str, int]:
    """Bytes per device (model, KV cache and compute buffers together), largest first."""
    totals: dict[str, int] = {}
    for placement in placements(lines):
        totals[placement.device] = totals.get(placement.device, 0) + placement.bytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))
