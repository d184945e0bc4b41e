"""``lemon-desk search / pull / models / rm / import`` against a loopback Hub, in process and as real
child processes (one of them killed mid-download and started again)."""

from __future__ import annotations

import json
import os
import pty
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.core.errors import ModelError
from app.core.names import model_name_problem
from app.store import secrets
from app.store.hfcache import RepoCache, hub_cache_dir
from app.store.library import Library
from app.store.model_paths import local_shape
from app.store.settings import Settings
from app.store.usermodels import user_models_path
from app.supervisor.fetch import CHUNK
from tests.conftest import profile_path
from tests.support.fileserver import Fault
from tests.support.hubserver import HubRepo, LoopbackHub
from tests.support.keychain import private_keychain
from tests.support.modelfiles import gguf_array, gguf_files, gguf_key, mlx_files, raw_gguf
from tests.support.testrepos import BIG, SHARDS, TINY_MLX, big_files

Q4 = f"{BIG}:Q4_K_M"
Q8 = f"{BIG}:Q8_0"

HUB_EARLY_BREAK = pytest.mark.leaves_running(
    "HubClient.read_range breaks off httpx's aiter_bytes once it has the bytes; httpx's inner generator "
    "is left for the loop's GC hook to close (an aclose() task asyncio.run cancels at exit)"
)


@pytest.fixture(autouse=True)
def known_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("cpu_only_x86")))  # 24 GB, no GPU


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def models(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in run_json(capsys, "models")["models"]}


def wait_until(condition: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def full_gets(ranges: list[str | None]) -> list[str | None]:
    """Requests for a file's bytes to keep (whole or resumed), not the fit estimate's header reads."""
    return [r for r in ranges if r is None or r.endswith("-")]


@HUB_EARLY_BREAK
def test_search_shows_variants_sizes_and_fit(hub: LoopbackHub, capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "search", "big", "--ctx-size", "2048")
    [result] = data["results"]
    assert (result["repo_id"], result["recipe"], result["downloads"]) == (BIG, "llamacpp", 50)
    variants = {v["name"]: v for v in result["variants"]}
    assert set(variants) == {"Q4_K_M", "Q8_0"}
    files = big_files()
    q4 = variants["Q4_K_M"]
    assert q4["ref"] == Q4
    assert q4["size_bytes"] == sum(len(files[p]) for p in [*SHARDS, "mmproj-Big-f16.gguf"])
    fit = q4["fit"]
    assert fit["verdict"] == "fits" and fit["context"] == 2048 and fit["memory"]["kind"] == "RAM"
    assert fit["memory"]["usable_bytes"] == 24 * 10**9 and fit["max_context"] == 4096
    # Reading the shape took header ranges, never a whole file.
    assert all(r is not None and not r.endswith("-") for p, r in hub.served.log if "/resolve/" in p)

    code, out, _ = run(capsys, "search", "tiny", "--recipe", "lemon-mlx")
    assert code == 0 and TINY_MLX in out and "MLX" in out and "fits: needs" in out


@HUB_EARLY_BREAK
def test_pull_dry_run_lists_files_and_fit_and_fetches_nothing(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = run_json(capsys, "pull", Q8, "--dry-run")
    assert [f["path"] for f in plan["files"]] == ["Big-Q8_0.gguf", "mmproj-Big-f16.gguf"]
    assert not any(f["cached"] for f in plan["files"])
    assert plan["fit"]["verdict"] == "fits" and plan["dry_run"] is True
    assert full_gets(hub.requests_for(BIG, "Big-Q8_0.gguf")) == []
    assert not hub_cache_dir().exists()
    code, out, _ = run(capsys, "pull", Q8, "--dry-run")
    assert code == 0 and "fit: fits: needs" in out and "largest context that fits: 4,096" in out


def test_pull_models_rm_keep_files_other_models_share(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str]
) -> None:
    for ref in (Q4, Q8):
        report = run_json(capsys, "pull", ref)
        assert report["state"] == "done" and Path(report["path"]).is_file()
    listed = models(capsys)
    q4, q8 = listed["user.Big-GGUF-Q4_K_M"], listed["user.Big-GGUF-Q8_0"]
    assert (q4["state"], q4["downloaded"], q4["recipe"]) == ("downloaded", True, "llamacpp")
    assert q4["path"].endswith(SHARDS[0]) and q4["mmproj"].endswith("mmproj-Big-f16.gguf")
    assert q8["mmproj"] == q4["mmproj"]  # one projector, shared
    # Pulling again fetches nothing.
    before = len(hub.served.log)
    run_json(capsys, "pull", Q8)
    assert full_gets([r for p, r in hub.served.log[before:] if "/resolve/" in p]) == []

    repo = RepoCache(hub_cache_dir(), BIG)
    code, out, _ = run(capsys, "rm", "user.Big-GGUF-Q4_K_M")
    assert code == 0 and "1 file(s) kept: other models use them" in out
    listed = models(capsys)
    assert "user.Big-GGUF-Q4_K_M" not in listed
    assert listed["user.Big-GGUF-Q8_0"]["state"] == "downloaded"
    assert Path(listed["user.Big-GGUF-Q8_0"]["mmproj"]).read_bytes() == big_files()["mmproj-Big-f16.gguf"]
    assert repo.find(SHARDS[0]) is None and len(list((repo.folder / "blobs").iterdir())) == 2
    code, out, _ = run(capsys, "rm", Q8)  # by reference works too
    assert code == 0 and not repo.folder.exists()
    code, _, err = run(capsys, "rm", "user.Big-GGUF-Q8_0")
    assert code == 1 and err.startswith("error: There is no model named")


@pytest.mark.parametrize("ref", [b"\xff\xfe\x00", b"not a commit id\n"])
def test_a_damaged_ref_in_the_shared_cache_does_not_stop_the_model_list(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], ref: bytes
) -> None:
    """``refs/main`` is written by other tools too: one that is not text or names no commit is ignored."""
    assert run_json(capsys, "pull", Q8)["state"] == "done"
    repo = RepoCache(hub_cache_dir(), BIG)
    commit = repo.ref()
    assert commit is not None and len(commit) == 40
    (repo.folder / "refs" / "main").write_bytes(ref)
    assert repo.ref() is None
    assert models(capsys)["user.Big-GGUF-Q8_0"]["state"] == "downloaded"


def test_catalog_model_and_mlx_repo_pull(hub: LoopbackHub, capsys: pytest.CaptureFixture[str]) -> None:
    report = run_json(capsys, "pull", TINY_MLX)
    assert report["recipe"] == "lemon-mlx" and (Path(report["path"]) / "config.json").is_file()
    entry = models(capsys)["user.Tiny-4bit"]
    assert (entry["state"], entry["recipe"]) == ("downloaded", "lemon-mlx")
    assert entry["size_gb"] == round(report["size_bytes"] / 1e9, 3)
    # The catalog lists its models, downloaded or not.
    catalog = models(capsys)["Qwen3-0.6B-GGUF"]
    assert (catalog["state"], catalog["downloaded"], catalog["user"]) == ("not downloaded", False, False)


def test_gated_repo_says_what_to_do_then_works_with_the_keychain_token(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add(HubRepo("gated-org/Secret-GGUF", {"Secret-Q4_0.gguf": big_files()["Big-Q8_0.gguf"]}, gated=True))
    code, _, err = run(capsys, "pull", "gated-org/Secret-GGUF:Q4_0")
    assert code == 1 and "Traceback" not in err
    assert err.startswith("error: gated-org/Secret-GGUF is gated: its files need a token.")
    assert "Accept its licence" in err and "token" in err
    assert not [p for p, _ in hub.served.log if "Secret" in p and "/resolve/" in p]  # known from the listing
    monkeypatch.setenv("HF_TOKEN", "hf_not_the_right_one")
    code, _, err = run(capsys, "pull", "gated-org/Secret-GGUF:Q4_0")
    assert code == 1 and err.startswith(
        "error: gated-org/Secret-GGUF is gated: the Hub refused access (HTTP 403)."
    )
    monkeypatch.delenv("HF_TOKEN")
    with private_keychain(tmp_path / "keyrings"):
        secrets.set_hf_token(hub.token)
        assert run_json(capsys, "pull", "gated-org/Secret-GGUF:Q4_0")["state"] == "done"


def test_pull_that_ends_without_a_usable_model_says_so(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its index names a weight shard the repo lacks: every listed file arrives, the model is not whole."""
    files = mlx_files()
    del files["model-00002-of-00002.safetensors"]
    hub.add(HubRepo("mlx-test/Broken-4bit", files, tags=("mlx",)))
    code, out, err = run(capsys, "pull", "mlx-test/Broken-4bit")
    assert code == 1 and "is ready" not in out and "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("error: The download of user.Broken-4bit ended (done), but its files are not")
    assert "the repo lacks files that its index or shard names promise" in last


def test_errors_are_one_line(hub: LoopbackHub, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in [
        (["pull", "no-such-model"], "error: There is no model named 'no-such-model'."),
        (["pull", "a/b/c"], "error: 'a/b/c' is not a Hugging Face model reference."),
        (["pull", "org/none:Q4_0"], "error: The repo org/none does not exist on the Hugging Face Hub."),
        (["pull", f"{BIG}:Q3_K_S"], f"error: {BIG} has no variant 'Q3_K_S'. Variants there: Q8_0, Q4_K_M."),
    ]:
        code, _, err = run(capsys, *argv)
        assert code == 1 and err.splitlines()[0].startswith(message), err


def test_import_gguf_and_mlx_and_reject_what_is_neither(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    gguf = tmp_path / "mine" / "Mine-Q4_0.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(gguf_files("Mine-Q4_0", layers=1)["Mine-Q4_0.gguf"])
    mlx = tmp_path / "my-mlx"
    mlx.mkdir()
    for name, data in mlx_files().items():
        (mlx / name).write_bytes(data)
    assert run(capsys, "import", str(gguf))[0] == 0
    assert run(capsys, "import", str(mlx), "--name", "tiny")[0] == 0
    listed = models(capsys)
    assert (listed["user.Mine-Q4_0"]["recipe"], listed["user.Mine-Q4_0"]["state"]) == (
        "llamacpp",
        "downloaded",
    )
    assert listed["user.Mine-Q4_0"]["path"] == str(gguf)
    assert (listed["user.tiny"]["recipe"], listed["user.tiny"]["path"]) == ("lemon-mlx", str(mlx))

    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(100))
    (mlx / "tokenizer.json").unlink()
    for argv, message in [
        ([str(fake)], "is not a GGUF model"),
        ([str(mlx), "--name", "other"], "has no tokenizer"),
        ([str(gguf)], "A model named user.Mine-Q4_0 exists already"),
        ([str(tmp_path / "nothing")], "does not exist"),
    ]:
        code, _, err = run(capsys, "import", *argv)
        assert code == 1 and message in err, err
    # Removing an imported model forgets it and leaves the user's files alone.
    code, out, _ = run(capsys, "rm", "user.Mine-Q4_0")
    assert code == 0 and "left alone" in out and gguf.exists()


def test_an_imported_models_name_keeps_the_apis_rule_and_namespace(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--name as the local API takes model_name: the name alphabet, at most 128, in ``user.``; a name
    like a path, a remote's or one that pads every row of `models` is refused and nothing registered."""
    gguf = tmp_path / "Mine-Q4_0.gguf"
    gguf.write_bytes(gguf_files("Mine-Q4_0", layers=1)["Mine-Q4_0.gguf"])
    for name in ("../../evil", "@box/x", "  spaced name ", "ünïcødé", "a" * 129, "", "user."):
        code, _, err = run(capsys, "import", str(gguf), f"--name={name}")
        assert code == 1 and f"error: {name!r} is not a model name (letters, digits" in err, err
    code, _, err = run(capsys, "import", str(gguf), "--name=-dash")
    assert code == 1 and "is not a model name" in err, err
    assert [m for m in models(capsys) if m.startswith("user.")] == []
    assert run(capsys, "import", str(gguf), "--name", "a" * 128)[0] == 0
    assert run(capsys, "import", str(gguf), "--name", "user.mine")[0] == 0  # the prefix given: kept once
    assert {m for m in models(capsys) if m.startswith("user.")} == {"user." + "a" * 128, "user.mine"}


def test_a_file_name_outside_the_alphabet_becomes_a_model_name(tmp_path: Path) -> None:
    """The window imports with the file's own name (Library.import_path, no name given): it is made
    a model name, as the local API would take it, rather than registered as it is."""
    library = Library(Settings())
    for stem, expected in [
        ("Llama 3 8B (Q4)", "user.Llama-3-8B-Q4"),
        ("ünïcødé", "user.unicde"),  # ø has no plain letter in it: left out
        ("..hidden..model", "user.hidden.model"),
        ("ü" + "x" * 200, "user." + "u" + "x" * 127),
        ("€€", "user.model"),
    ]:
        gguf = tmp_path / f"{stem}.gguf"
        gguf.write_bytes(gguf_files("Mine-Q4_0", layers=1)["Mine-Q4_0.gguf"])
        model = library.import_path(gguf)
        assert model.name == expected and model_name_problem(model.name) is None
        assert model.checkpoint == str(gguf)


def test_hostile_headers_are_refused_on_import_or_leave_the_fit_unknown(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    string, array, uint32, float32 = 8, 9, 4, 6  # GGUF value types
    arch = gguf_key("general.architecture", string, struct.pack("<Q", 5) + b"llama")
    hostile = {
        # 2**62 uint32s in a kept key: a struct.error traceback before
        "huge.gguf": (raw_gguf(gguf_key("general.x", array, gguf_array(uint32, 1 << 62))), "cut short"),
        # arrays nested 3000 deep: a RecursionError traceback before
        "deep.gguf": (
            raw_gguf(gguf_key("tokenizer.x", array, gguf_array(array, 1) * 2999 + gguf_array(uint32, 0))),
            "nests arrays more than 4 deep",
        ),
    }
    for name, (data, message) in hostile.items():
        (tmp_path / name).write_bytes(data)
        code, _, err = run(capsys, "import", str(tmp_path / name))
        assert code == 1 and message in err and "Traceback" not in err, err
    # A NaN layer count reads as metadata, so it imports; every `models` run then crashed on its fit.
    nan = tmp_path / "nan.gguf"
    nan.write_bytes(raw_gguf(arch, gguf_key("llama.block_count", float32, struct.pack("<f", float("nan")))))
    # json.loads reads Infinity: an MLX folder did the same with an OverflowError.
    mlx = tmp_path / "inf-mlx"
    mlx.mkdir()
    for name, data in mlx_files().items():
        (mlx / name).write_bytes(data)
    config = json.loads((mlx / "config.json").read_text())
    (mlx / "config.json").write_text(json.dumps({**config, "num_hidden_layers": float("inf")}))
    assert run(capsys, "import", str(nan))[0] == 0
    assert run(capsys, "import", str(mlx), "--name", "inf")[0] == 0
    listed = models(capsys)
    for name in ["user.nan", "user.inf"]:
        assert listed[name]["state"] == "downloaded", listed[name]


DEEP = "[" * 100_000 + "]" * 100_000  # valid JSON that Python's parser cannot read (RecursionError)


@pytest.mark.parametrize(
    "member,message",
    [
        ("config.json", "config.json is not valid JSON (it is nested too deeply to read)."),
        ("model.safetensors.index.json", "lacks weight shards that its model.safetensors.index.json names"),
    ],
)
def test_import_of_an_mlx_folder_whose_json_is_nested_too_deeply_is_refused(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    member: str,
    message: str,
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    mlx = tmp_path / "deep-mlx"
    mlx.mkdir()
    for name, data in mlx_files().items():
        (mlx / name).write_bytes(data)
    (mlx / member).write_text(DEEP)
    code, _, err = run(capsys, "import", str(mlx))
    assert code == 1 and "Traceback" not in err and message in err, err
    assert "user.deep-mlx" not in models(capsys)


def test_the_shape_of_an_mlx_folder_whose_config_is_nested_too_deeply_is_a_model_error(
    tmp_path: Path,
) -> None:
    """An imported folder changed afterwards: the fit check at load time reads its config.json again."""
    mlx = tmp_path / "deep-mlx"
    mlx.mkdir()
    (mlx / "config.json").write_text(DEEP)
    with pytest.raises(ModelError, match=r"config\.json is unreadable \(it is nested too deeply to read\)"):
        local_shape("lemon-mlx", mlx)


def test_a_corrupt_user_models_file_is_kept_aside_and_reported(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    user_models_path().parent.mkdir(parents=True, exist_ok=True)
    user_models_path().write_text('{"schema": 1, "models": {"x": {"recipe": "nope"')
    code, _, err = run(capsys, "models")
    assert code == 0 and "warning: The user models file was unreadable" in err
    [backup] = user_models_path().parent.glob("user_models.json.corrupt-*")
    assert backup.read_text().startswith('{"schema": 1')
    assert run_json(capsys, "pull", Q8)["state"] == "done"  # a fresh file starts
    assert "user.Big-GGUF-Q8_0" in json.loads(user_models_path().read_text())["models"]


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "logs"
    folder.mkdir()
    yield folder


def test_a_killed_pull_resumes_and_refetches_at_most_one_chunk(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str], logs: Path
) -> None:
    held_at = CHUNK + CHUNK // 2  # the server goes silent half way through shard 2's second chunk
    hub.arm(BIG, SHARDS[1], Fault(hold_after=held_at))
    shard2 = hub.repos[BIG].sha256(SHARDS[1])
    part = RepoCache(hub_cache_dir(), BIG).blob(shard2 + ".part")
    with (logs / "first.out").open("w") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "app", "pull", Q4, "--json"], env=child_env(), stdout=out, stderr=out
        )
        try:
            wait_until(lambda: part.exists() and part.stat().st_size >= CHUNK)
        finally:
            child.send_signal(signal.SIGKILL)  # the process, not a task: no cleanup runs
            child.wait()
    kept = part.stat().st_size

    status = models(capsys)["user.Big-GGUF-Q4_K_M"]
    assert status["state"] == "paused"
    assert status["download"]["done_bytes"] == len(big_files()[SHARDS[0]]) + kept

    second = subprocess.run(
        [sys.executable, "-m", "app", "pull", Q4, "--json"],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert second.returncode == 0, second.stderr
    assert json.loads(second.stdout)["state"] == "done"
    ranges = full_gets(hub.requests_for(BIG, SHARDS[1]))
    assert ranges == [None, f"bytes={kept}-"]
    assert held_at - kept <= CHUNK  # of what the server had sent, at most one chunk came again
    assert full_gets(hub.requests_for(BIG, SHARDS[0])) == [None]  # the finished shard was kept
    assert full_gets(hub.requests_for(BIG, SHARDS[2])) == [None]
    assert models(capsys)["user.Big-GGUF-Q4_K_M"]["state"] == "downloaded"


def test_pull_draws_a_progress_bar_on_a_terminal(hub: LoopbackHub) -> None:
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-m", "app", "pull", Q8],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            piece = os.read(leader, 4096)
        except OSError:  # the terminal closed with the child
            break
        if not piece:
            break
        drawn += piece
    os.close(leader)
    out, _ = child.communicate(timeout=120)
    assert child.returncode == 0
    assert b"\r" in drawn and b"100%" in drawn and b"MB/s" in drawn and b"[####" in drawn
    assert "user.Big-GGUF-Q8_0 is ready:" in out


def test_run_finds_pulled_models_in_the_cache_and_says_to_pull_the_others(
    hub: LoopbackHub, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "run", "Qwen3-0.6B-GGUF", "--dry-run")
    assert code == 1
    assert err.strip() == (
        "error: Qwen3-0.6B-GGUF (unsloth/Qwen3-0.6B-GGUF:Q4_0) is not downloaded. "
        "Download it first: lemon-desk pull Qwen3-0.6B-GGUF"
    )
    pulled = run_json(capsys, "pull", Q8)
    plan = run_json(capsys, "run", Q8, "--dry-run")  # by reference: the user model pull made
    command = plan["command"]
    assert command[command.index("-m") + 1] == pulled["path"]
    plan = run_json(capsys, "run", "user.Big-GGUF-Q8_0", "--dry-run")  # and by name
    assert plan["command"][plan["command"].index("-m") + 1] == pulled["path"]


def test_pin_and_unpin_are_saved_and_shown(capsys: pytest.CaptureFixture[str]) -> None:
    name = next(iter(models(capsys)))
    assert run(capsys, "pin", name)[:2] == (0, f"{name} is pinned.\n")
    assert models(capsys)[name]["pinned"] is True
    assert run(capsys, "unpin", name)[0] == 0
    assert models(capsys)[name]["pinned"] is False
    code, _, err = run(capsys, "pin", "no-such-model")
    assert code == 1 and "There is no model named 'no-such-model'" in err


def test_a_count_in_other_digits_is_refused_with_the_apps_message(capsys: pytest.CaptureFixture[str]) -> None:
    """str.isdigit() takes "²", which int() refuses: the option's own message, not argparse's guess."""
    with pytest.raises(SystemExit) as exit_:
        main(["search", "smol", "--limit", "²"])
    assert exit_.value.code == 2
    _, err = capsys.readouterr()
    assert "'²' is not a positive whole number" in err and "Traceback" not in err
