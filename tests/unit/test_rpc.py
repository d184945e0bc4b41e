"""llama.cpp RPC workers: addresses, which workers a load uses, exposure, the probe's messages, where the
engine's load log says the model's memory went (lines from a real ``llama-server -lv 4 --rpc`` run), and
the checks before a load against stand-in workers of other protocols (the real worker is in
tests/integration/test_rpc.py)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from app.cli import main
from app.core import rpc
from app.core.errors import ConfigError, EngineError, WorkerError
from app.core.rpc import (
    Endpoint,
    WorkerInfo,
    exposure_warning,
    memory_by_device,
    parse_endpoint,
    parse_workers,
    worker_endpoint,
    workers_for,
)
from app.supervisor.rpc import check_workers, engine_protocol, probe

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
    for bad in (
        "a.lan",
        "a.lan:0",
        "a.lan:70000",
        "a lan:1",
        ":50052",
        "a.lan:x",
        "[nope]:1",
        "-a:1",
        "a.lan:²",
    ):
        with pytest.raises(ConfigError, match="not a worker address"):
            parse_endpoint(bad)
    with pytest.raises(ConfigError, match="listed twice"):
        parse_workers("a.lan:1,a.lan:1")


@pytest.mark.parametrize(
    ("host", "port", "says"),
    [
        ("127.0.0.1", 0, "Port 0 is not one a worker can listen on: give one from 1 to 65535."),
        ("127.0.0.1", 65536, "Port 65536 is not one a worker can listen on"),
        ("a lan", 50052, "'a lan' is not a host a worker can listen on: give an IP address or a host name"),
    ],
)
def test_the_workers_own_address_is_refused_naming_the_part_that_is_wrong(
    host: str, port: int, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`worker --port 0` said "... and separate workers with commas", the words for a list of workers."""
    assert worker_endpoint(" 127.0.0.1 ", 50052) == Endpoint("127.0.0.1", 50052)
    with pytest.raises(ConfigError) as refused:
        worker_endpoint(host, port)
    assert str(refused.value).startswith(says)
    assert "commas" not in str(refused.value)
    assert main(["worker", "--host", host, "--port", str(port)]) == 1
    assert capsys.readouterr().err.startswith(f"error: {says}")


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
    # A size that is no number (a garbled or hostile log line) is no placement, not a ValueError.
    garbled = [
        "load_tensors: CPU model buffer size = 1.2.3 MiB",
        "llama_kv_cache: CUDA0 KV buffer size = . MiB",
    ]
    assert memory_by_device(garbled) == {}


class StandInWorker:
    """A fake ggml-rpc worker on loopback (other llama.cpp builds cannot run here): it answers HELLO with
    the version it is given, then one device; or takes the connection and says nothing (busy); or
    closes it at a HELLO of the size it does not expect (an older protocol)."""

    def __init__(self, version: tuple[int, int, int] = (7, 0, 0), mode: str = "answer") -> None:
        self.version, self.mode = version, mode

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while header := await reader.readexactly(9):
                cmd, size = struct.unpack("<BQ", header)
                await reader.readexactly(size)
                if self.mode == "silent":
                    await reader.read()  # until the probe gives up and closes the connection
                    break
                if cmd == rpc.CMD_HELLO and (self.mode == "old" and size != 0):
                    break
                reply = {
                    rpc.CMD_HELLO: bytes([*self.version, 0]) + bytes(rpc.CAPS_SIZE if size else 0),
                    rpc.CMD_DEVICE_COUNT: struct.pack("<I", 1),
                    rpc.CMD_GET_DEVICE_MEMORY: struct.pack("<QQ", 3 << 30, 4 << 30),
                }[cmd]
                writer.write(struct.pack("<Q", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def _check(worker: StandInWorker, expected: tuple[int, int, int] | None) -> list[WorkerInfo] | WorkerError:
    async def go() -> list[WorkerInfo] | WorkerError:
        server = await asyncio.start_server(worker.handle, "127.0.0.1", 0)
        async with server:
            endpoint = Endpoint("127.0.0.1", server.sockets[0].getsockname()[1])
            try:
                return await check_workers((endpoint,), expected)
            except WorkerError as err:
                return err

    return asyncio.run(go())


def test_a_worker_of_this_protocol_says_its_memory() -> None:
    [info] = _check(StandInWorker(), (7, 0, 0))  # type: ignore[misc]
    assert info.version == (7, 0, 0) and info.devices == ((3 << 30, 4 << 30),)


def test_a_worker_of_another_protocol_is_named_and_refused() -> None:
    error = _check(StandInWorker((8, 0, 0)), (7, 0, 0))
    assert isinstance(error, WorkerError) and "speaks RPC protocol 8.0.0" in error.message
    assert "llama.cpp speaks 7.0.0" in error.message and len(error.workers) == 1
    newer_minor = _check(StandInWorker((7, 1, 0)), (7, 0, 0))
    assert isinstance(newer_minor, WorkerError)


def test_an_older_worker_is_understood_through_the_empty_hello() -> None:
    [info] = _check(StandInWorker((3, 0, 0), mode="old"), None)  # type: ignore[misc]
    assert info.version == (3, 0, 0)


def test_a_worker_that_takes_the_connection_and_says_nothing_is_busy() -> None:
    async def go() -> WorkerError:
        server = await asyncio.start_server(StandInWorker(mode="silent").handle, "127.0.0.1", 0)
        async with server:
            with pytest.raises(WorkerError) as err:
                await probe(Endpoint("127.0.0.1", server.sockets[0].getsockname()[1]), 0.2)
            return err.value

    assert "is busy: another engine is using it" in asyncio.run(go()).message


def test_an_engine_without_rpc_support_is_refused_with_the_fix(tmp_path: Path) -> None:
    """A stand-in llama-server (a script) whose --help has no --rpc, and no worker beside it."""
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'usage: llama-server [options] --port N'\n")
    binary.chmod(0o755)
    with pytest.raises(EngineError, match="built without RPC support") as err:
        asyncio.run(engine_protocol(binary, "", "linux"))
    assert "-DGGML_RPC=ON" in err.value.hint
