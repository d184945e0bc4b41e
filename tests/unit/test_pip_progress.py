"""pip's output lines (as pip 23-25 print them) become install progress."""

from __future__ import annotations

from app.supervisor.mlx_lm import PipPhase, parse_pip_line


def test_pip_lines() -> None:
    assert parse_pip_line("Collecting mlx-lm==0.32.2") == (PipPhase.RESOLVE, "Found mlx-lm==0.32.2", True)
    assert parse_pip_line(
        "Processing /opt/pypi/files/mdurl-0.1.2-py3-none-any.whl (from markdown-it-py>=2.2.0)"
    ) == (PipPhase.RESOLVE, "Found mdurl-0.1.2-py3-none-any.whl", True)
    assert parse_pip_line("  Downloading mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl (10.2 MB)") == (
        PipPhase.DOWNLOAD,
        "Downloading mlx_cpu-0.32.4-py3-none-manylinux_2_35_x86_64.whl (10.2 MB)",
        False,
    )
    assert parse_pip_line("  Using cached https://x/numpy-2.4.6.whl (16 kB)") == (
        PipPhase.DOWNLOAD,
        "Using cached numpy-2.4.6.whl (16 kB)",
        False,
    )
    assert parse_pip_line("Installing collected packages: numpy, mlx-cpu, mlx, mlx-lm") == (
        PipPhase.INSTALL,
        "Installing 4 packages",
        False,
    )
    assert parse_pip_line("Successfully installed mlx-0.32.4 mlx-lm-0.32.2") == (
        PipPhase.INSTALL,
        "Packages installed",
        False,
    )
    assert parse_pip_line("  Preparing metadata (pyproject.toml): started") is None
    assert parse_pip_line("WARNING: Location 'file:///x' is ignored") is None
