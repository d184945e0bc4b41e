"""llama.cpp RPC workers: addresses, which workers a load uses, exposure, the probe's messages, and where
the engine's load log says the model's memory went (lines from a real ``llama-server -lv 4 --rpc`` run)."""

from __future__ import annotations

import struct

import pytest

from app.core import rpc
from app.core.errors import ConfigError
from app.core.rpc import (
    Endpoint,
    exposure_warning,
    memory_by_device,
    parse_endpoint,
    parse_workers,
    workers_for,
)

LOAD_LOG = """\
0.00.005.053 I cmn  common_param:   - RPC0    : 127.0.0.1:50152 (24105 MiB, 24105 MiB free)
0.00.181.127 I load_tensors:   CPU_Mapped model buffer size =    28.69 MiB
0.00.181.128 I load_tensors: RPC0[127.0.0.1:50152] model buffer size =    33.82 MiB
0.00.181.128 I load_tensors: RPC0[127.0.0.1:50153] model buffer size =    58.28 MiB
0.00.323.626 I llama_context:        CPU  output buffer size =     0.75 MiB
0.00.323.864 I llama_kv_cache: RPC0[127.0.0.1:50152] KV buffer size =    96.00 MiB
0.00.325.875 I llama_kv_cache: RPC0[127.0.0.1:50153] KV buffer size =    84.00 MiB
0.00.369.454 I sched_reserve: RPC0[127.0.0.1:50152] compute buffer size =    59.05 MiB
0.00.369.457 I sched_reserve: RPC0[127.0.0.1:50153] compute buffer size =    48.91 MiB
0.00.369.458 I sched_reserve:        CPU compute buffer size =    43.32 MiB
""".splitlines()
MIB = 1 << 20


def test_worker_addresses() -> None:
    assert parse_endpoint(" 192.168.1.20:50052 ") == Endpoint("192.168.1.20", 50052)
    assert parse_endpoint("[::1]:50052") == Endpoint("::1", 50052)
    assert str(Endpoint("::1", 50052)) == "[::1]:50052"
    assert parse_workers("a.lan:1, b.lan:2,") == (Endpoint("a.lan", 1), Endpoint("b.lan", 2))
    for bad in ("a.lan", "a.lan:0", "a.lan:70000", "a lan:1", ":50052", "a.lan:x", "[nope]:1", "-a:1"):
        with pytest.raises(ConfigError, match="not a worker address"):
            parse_endpoint(bad)
    with pytest.raises(ConfigError, match="listed twice"):
        parse_workers("a.lan:1,a.lan:1")


def test_the_command_line_then_the_models_option_then_settings_decide_the_workers() -> None:
    assert workers_for("c:3", "b:2", "a:1") == (Endpoint("c", 3),)
    assert workers_for(None, "b:2", "a:1") == (Endpoint("b", 2),)
    assert workers_for(None, "", "a:1") == (Endpoint("a", 1),)
    assert workers_for(None, "local", "a:1") == ()
    assert workers_for("local", "b:2", "a:1") == ()
    assert workers_for(None, "", "") == ()


def test_a_worker_beyond_loopback_needs_consent_and_gets_a_warning() -> None:
    assert exposure_warning(Endpoint("127.0.0.1", 1), False) == ""
    assert exposure_warning(Endpoint("localhost", 1), False) == ""
    with pytest.raises(ConfigError, match="no authentication") as err:
        exposure_warning(Endpoint("0.0.0.0", 1), False)
    assert "SSH tunnel" in err.value.hint
    assert "private network" in exposure_warning(Endpoint("192.168.1.5", 1), True)


def test_probe_messages_follow_ggml_rpcs_layout() -> None:
    hello = rpc.hello_request()
    assert hello[0] == 14 and struct.unpack("<Q", hello[1:9])[0] == 24 and hello[9:] == bytes(24)
    assert rpc.request(rpc.CMD_DEVICE_COUNT) == bytes([15]) + bytes(8)
    assert rpc.device_memory_request(2) == bytes([11]) + struct.pack("<QI", 4, 2)
    assert rpc.parse_version(bytes([7, 1, 2, 0]) + bytes(24)) == (7, 1, 2)
    assert rpc.parse_device_memory(struct.pack("<QQ", 5, 9)) == (5, 9)


def test_memory_by_device_from_the_engines_load_log() -> None:
    by_device = memory_by_device(LOAD_LOG)
    assert list(by_device) == ["127.0.0.1:50153", "127.0.0.1:50152", "CPU"]  # largest first
    assert by_device["127.0.0.1:50152"] == pytest.approx((33.82 + 96 + 59.05) * MIB, abs=3)
    assert by_device["CPU"] == pytest.approx((28.69 + 0.75 + 43.32) * MIB, abs=3)
    assert memory_by_device(["0.1 I srv  llama_server: model loaded"]) == {}
