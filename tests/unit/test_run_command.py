"""``lemon-desk run --dry-run`` and the run command's refusals: no engine is needed (or started) here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.core.launch import ENGINE_THREADS
from app.store.installs import install_dir
from app.store.paths import home
from tests.conftest import profile_path


@pytest.fixture(autouse=True)
def users_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plans as a user sees them: without the suite's one thread per engine (tests/conftest.py)."""
    monkeypatch.delenv(ENGINE_THREADS)


@pytest.fixture
def gguf(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(b"GGUF")
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["run", *args])
    out, err = capsys.readouterr()
    return code, out, err


def planned(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """The engine command ``run ARGS --dry-run --json`` prints."""
    code, out, err = run(capsys, *args, "--dry-run", "--json")
    assert code == 0, err
    command: list[str] = json.loads(out)["command"]
    return command


def use_profile(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path(name)))


def test_dry_run_on_a_hybrid_host_with_rocm(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    use_profile(monkeypatch, "amd_nvidia_hybrid")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/rocm/lib")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    code, out, _ = run(
        capsys,
        str(gguf),
        "--backend",
        "llamacpp:rocm",
        "--ctx-size",
        "8192",
        "--args",
        "-ngl 99",
        "--dry-run",
        "--json",
    )
    assert code == 0
    engine_dir = install_dir("llamacpp", "rocm")
    assert json.loads(out) == {
        "command": [
            str(engine_dir / "llama-server"),
            "-m",
            str(gguf),
            "--ctx-size",
            "8192",
            "--host",
            "127.0.0.1",
            "--port",
            "<free port per launch>",
            "--jinja",
            "--metrics",
            "--slot-save-path",
            str(home() / "kvcache"),
            "--api-key-file",
            "<private key file, random per launch>",
            "--alias",
            gguf.stem,
            "-ngl",
            "99",
        ],
        "env": {
            "LD_LIBRARY_PATH": f"{engine_dir}:/opt/rocm/lib",
            "GGML_NO_BACKTRACE": "1",
            "CUDA_VISIBLE_DEVICES": "",
        },
        "device": "gpu",
    }


def test_dry_run_with_rpc_workers_and_a_bad_worker_list(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    code, out, _ = run(capsys, str(gguf), "--rpc", "10.0.0.2:50052,10.0.0.3:50052", "--dry-run", "--json")
    assert code == 0
    argv = json.loads(out)["command"]
    assert argv[argv.index("--rpc") :][:4] == ["--rpc", "10.0.0.2:50052,10.0.0.3:50052", "-ngl", "999"]
    code, _, err = run(capsys, str(gguf), "--rpc", "10.0.0.2", "--dry-run")
    assert code != 0 and "'10.0.0.2' is not a worker address" in err


def test_dry_run_picks_the_default_backend(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    use_profile(monkeypatch, "strix_halo")
    code, out, _ = run(capsys, str(gguf), "--dry-run", "--json")
    assert code == 0
    plan = json.loads(out)
    assert plan["command"][0] == str(install_dir("llamacpp", "rocm") / "llama-server")
    assert "CUDA_VISIBLE_DEVICES" not in plan["env"]


def test_dry_run_as_text_is_a_shell_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    code, out, _ = run(capsys, str(gguf), "--dry-run")
    lines = out.splitlines()
    assert code == 0 and lines[0] == f"LD_LIBRARY_PATH={install_dir('llamacpp', 'cpu')}"
    assert lines[1] == "GGML_NO_BACKTRACE=1"
    assert lines[2].endswith("--api-key-file '<private key file, random per launch>' --alias tiny")


@pytest.mark.parametrize(
    "args,message",
    [
        (["--backend", "llamacpp:vulkan"], "llamacpp:vulkan cannot run on this machine: Vulkan needs a GPU"),
        (["--backend", "lemon-mlx:cpu"], "is a llamacpp model; lemon-mlx:cpu is a lemon-mlx backend"),
        (["--backend", "llamacpp:nope"], "llamacpp has no backend called 'nope'"),
        (["--args", "-m other.gguf"], "The extra engine argument -m is set by Lemon Desk"),
        (["--args", "--alias 'x"], "The extra engine arguments cannot be read"),
        (["--ctx-size", "0"], "--ctx-size must be a positive number"),
        # The local API's rule: llama-server's own usage text came out with --force.
        (["--ctx-size", "99999999999999", "--force"], "at most 16,777,216, or -1 for automatic"),
        (["--ctx-size", "-2"], "--ctx-size must be a positive number of tokens, at most 16,777,216, or -1"),
    ],
)
def test_refusals_are_one_clear_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    gguf: Path,
    args: list[str],
    message: str,
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    code, out, err = run(capsys, str(gguf), *args, "--dry-run")
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    "model,message",
    [
        ("/no/such/model.gguf", "No such model file: /no/such/model.gguf."),
        ("Qwen3-0.6B-GGUF", "Qwen3-0.6B-GGUF (unsloth/Qwen3-0.6B-GGUF:Q4_0) is not downloaded."),
        ("no-such-name", "There is no model named 'no-such-name'."),
        ("", "A model name is needed."),  # was: "<cwd> is a folder without config.json"
        (" ", "A model name is needed."),
    ],
)
def test_models_that_cannot_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], model: str, message: str
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    code, _, err = run(capsys, model, "--dry-run")
    assert code == 1 and message in err


def test_a_file_that_is_not_gguf(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    (tmp_path / "notes.txt").write_text("hi")
    code, _, err = run(capsys, str(tmp_path / "notes.txt"), "--prompt", "hi")
    assert code == 1 and "notes.txt is not a .gguf file" in err


def test_json_without_prompt_is_refused(capsys: pytest.CaptureFixture[str], gguf: Path) -> None:
    code, _, err = run(capsys, str(gguf), "--json")
    assert code == 1 and "--json needs --prompt or --dry-run" in err


def test_an_engine_argument_that_starts_with_a_dash_is_given_after_an_equals_sign(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    """argparse takes `--args --no-mmap`'s value for an option of its own; its refusal says to write
    `--args="--no-mmap"`, and that form (as the help and the README show it) reaches the engine."""
    use_profile(monkeypatch, "cpu_only_x86")
    with pytest.raises(SystemExit) as exit_:
        run(capsys, str(gguf), "--args", "--no-mmap", "--dry-run")
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --args: expected one argument; a value that starts with '-' goes after an '='" in err
    assert '--args="-..."' in err
    assert planned(capsys, str(gguf), "--args=--no-mmap")[-1] == "--no-mmap"
    with pytest.raises(SystemExit):
        main(["import", str(gguf), "--name", "-dash"])
    assert '--name="-..."' in capsys.readouterr().err


def test_a_context_size_of_minus_one_is_automatic_as_in_the_local_api(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], gguf: Path
) -> None:
    use_profile(monkeypatch, "cpu_only_x86")
    command = planned(capsys, str(gguf), "--ctx-size", "-1")
    assert command == planned(capsys, str(gguf))
    assert command[command.index("--ctx-size") + 1] == "4096"  # the default, as without --ctx-size
