"""``lemon-desk run Qwen3-0.6B-MLX --dry-run --json`` on mocked hardware (FAKE profiles: this machine
has neither an Apple GPU nor a Strix Halo): the binary, arguments and environment the app would use."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.store.paths import engines_dir
from tests.conftest import profile_path

REPO = "mlx-community/Qwen3-0.6B-4bit"


def dry_run(
    profile: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *extra: str
) -> dict[str, Any]:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path(profile)))
    assert main(["run", "Qwen3-0.6B-MLX", "--dry-run", "--json", *extra]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


@pytest.fixture(autouse=True)
def hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/rocm/lib")
    return tmp_path / "hf"


def test_apple_silicon_runs_the_metal_server_with_dyld_library_path(
    hf_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = dry_run("apple_silicon", capsys, monkeypatch)
    folder = engines_dir() / "lemon-mlx" / "metal"
    assert out["command"] == [
        str(folder / "server"),
        REPO,
        "--host",
        "127.0.0.1",
        "--port",
        out["command"][5],
    ]
    assert out["command"][5].startswith("<")  # a free port is picked per launch
    assert out["env"] == {
        "DYLD_LIBRARY_PATH": str(folder),
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
    }
    assert out["device"] == "gpu"


def test_strix_halo_runs_the_rocm_server_with_ld_library_path(
    hf_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = dry_run("strix_halo", capsys, monkeypatch, "--ctx-size", "8192", "--args", "--max-loaded 2")
    folder = engines_dir() / "lemon-mlx" / "rocm"
    port = out["command"][5]
    assert out["command"] == [
        str(folder / "server"),
        REPO,
        "--host",
        "127.0.0.1",
        "--port",
        port,
        "--ctx-size",
        "8192",
        "--max-loaded",
        "2",
    ]
    assert out["env"] == {
        "LD_LIBRARY_PATH": f"{folder}:/opt/rocm/lib",
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
    }
    assert out["device"] == "gpu"


def test_cpu_backend_on_strix_halo_is_a_cpu_device_with_its_folder_on_the_library_path(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = dry_run("strix_halo", capsys, monkeypatch, "--backend", "lemon-mlx:cpu")
    folder = engines_dir() / "lemon-mlx" / "cpu"
    assert out["command"][:2] == [str(folder / "server"), REPO]
    assert out["env"]["LD_LIBRARY_PATH"] == f"{folder}:/opt/rocm/lib"
    assert out["device"] == "cpu"


def test_mlx_lm_backend_runs_the_venv_python(
    hf_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = dry_run("linux_arm64", capsys, monkeypatch)  # no lemon-mlx build there: mlx-lm is the default
    python = engines_dir() / "lemon-mlx" / "mlx-lm" / "bin" / "python"
    assert out["command"][:8] == [
        str(python),
        "-m",
        "mlx_lm",
        "server",
        "--model",
        REPO,
        "--host",
        "127.0.0.1",
    ]
    assert out["env"]["HF_HUB_CACHE"] == str(hf_home / "hub") and out["env"]["HF_HUB_OFFLINE"] == "1"
    assert "LD_LIBRARY_PATH" not in out["env"]
    assert out["device"] == "cpu"


def test_intel_mac_is_refused_before_anything(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("intel_mac")))
    assert main(["run", "Qwen3-0.6B-MLX", "--dry-run", "--json", "--backend", "lemon-mlx:metal"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: lemon-mlx:metal cannot run on this machine")
    assert "No lemon-mlx build exists for Intel Macs" in err


def test_an_app_owned_flag_in_extra_args_is_an_error_naming_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("strix_halo")))
    assert main(["run", "Qwen3-0.6B-MLX", "--dry-run", "--args", "--port 9000"]) == 1
    assert "--port is set by Lemon Desk" in capsys.readouterr().err


def test_run_of_a_catalog_mlx_model_not_yet_downloaded_downloads_it_first(
    hf_home: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("linux_arm64")))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the download fails at once
    # A FAKE install (manifest and a python that is /bin/true): the failure comes before any launch.
    python = engines_dir() / "lemon-mlx" / "mlx-lm" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to("/bin/true")
    (python.parents[1] / "lemon-desk-install.json").write_text(
        json.dumps({"version": "0.32.2", "asset": "mlx-lm==0.32.2", "sha256": ""})
    )
    assert main(["run", "Qwen3-0.6B-MLX", "--prompt", "hi"]) == 1
    err = capsys.readouterr().err
    assert "Qwen3-0.6B-MLX: downloading" in err  # one click: the run downloads what it lacks
    assert "Could not reach the Hugging Face Hub at http://127.0.0.1:9" in err


def test_both_catalog_mlx_models_load_through_lemon_mlx(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEMON_DESK_MOCK_HARDWARE", str(profile_path("apple_silicon")))
    for name, repo in (("Qwen3-0.6B-MLX", REPO), ("Qwen3-4B-MLX", "mlx-community/Qwen3-4B-4bit")):
        assert main(["run", name, "--dry-run", "--json"]) == 0
        command = json.loads(capsys.readouterr().out)["command"]
        assert command[0] == str(engines_dir() / "lemon-mlx" / "metal" / "server") and command[1] == repo
