"""``lemon-desk run``'s terminal chat with a context of 512 tokens, on the real llama-server: a message
that would not fit is never sent as it is nor cut; the chat says why and offers the ways out (as prompts,
or chosen beforehand with ``--on-overflow``), and each does what it says. The tools of ``--mcp``'s servers
count as the window counts them: a message that fits alone but not with them is held too."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.supervisor.mcp import McpHost
from tests.integration.conftest import engines_of
from tests.integration.test_run import FRANCE, installed, telemetry_lines
from tests.support.mcp_servers import stdio_spec
from tests.support.tool_calls import TEMPLATE_ARGS

pytestmark = pytest.mark.integration
__all__ = ["installed"]

CTX = 512
LONG = "apple " * 600  # about 600 tokens: more than the context on its own
FACTS = [f"Fact {n}: the box number {n} holds {n * 7} red marbles and {n} pens. " * 4 for n in range(6)]


def chat(
    model: Path, text: str, *flags: str, args: str = "--temp 0 -n 24"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "run",
            str(model),
            "--ctx-size",
            str(CTX),
            "--args",
            args,
            *flags,
        ],
        input=text,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_a_message_longer_than_the_context_is_held_and_a_larger_context_reloads(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    ran = chat(smol_gguf, f"{LONG}\nr\n")
    assert ran.returncode == 0, ran.stderr
    assert "more than the model's context of 512 tokens. Nothing was sent." in ran.stderr
    assert "r) load the model again with a context of 1,024 tokens" in ran.stderr
    assert "l) " not in ran.stderr and "s) " not in ran.stderr, "nothing earlier to leave out or summarize"
    assert "again with a context of 1,024 tokens" in ran.stderr
    [(prompt, reply)] = telemetry_lines(ran.stderr)
    assert prompt > CTX, "the whole message, after the reload"
    assert reply <= 24, "the reload keeps run's --args (-n 24)"
    assert engines_of(lemon_home) == []


def test_cancel_sends_nothing_and_the_chat_goes_on(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    ran = chat(smol_gguf, f"{LONG}\nc\n{FRANCE}\n")
    assert ran.returncode == 0, ran.stderr
    [(prompt, _)] = telemetry_lines(ran.stderr)
    assert prompt < 100, "only the question after the cancelled message"


def test_on_overflow_leave_out_keeps_the_chat_within_its_context(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    ran = chat(smol_gguf, "\n".join(FACTS) + "\n", "--on-overflow", "leave-out")
    assert ran.returncode == 0, ran.stderr
    assert "Nothing was sent." in ran.stderr and "oldest messages (they are" not in ran.stderr, "not asked"
    assert re.search(r"\(left out the \d+ oldest messages\)", ran.stderr)
    replies = telemetry_lines(ran.stderr)
    assert len(replies) == len(FACTS), "every message answered"
    assert all(prompt + reply <= CTX for prompt, reply in replies)


def test_on_overflow_summary_goes_on_from_the_models_summary(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    ran = chat(smol_gguf, "\n".join(FACTS) + "\n", "--on-overflow", "summary")
    assert ran.returncode == 0, ran.stderr
    assert "Nothing was sent." in ran.stderr
    # What the summary left out, when the chat was too long to summarize whole, is said.
    said = r"Summary of the earlier chat(, without its oldest (message|\d+ messages) \(.*\))?: "
    assert re.search(said, ran.stderr)
    assert len(telemetry_lines(ran.stderr)) == len(FACTS), "every message answered"
    assert all(prompt + reply <= CTX for prompt, reply in telemetry_lines(ran.stderr))


def test_the_tools_offered_count_a_message_that_fits_only_without_them_is_held(
    installed: None, smol_gguf: Path, lemon_home: Path
) -> None:
    # The test MCP server's seven tools, written into the prompt by a template that takes tools (with
    # SmolLM2's own the model is offered none), take more of the 512 tokens than this message leaves.
    asyncio.run(McpHost().put(stdio_spec("t")))
    message = "pear " * 150  # about 150 tokens: well within the context on its own
    args = f"--temp 0 -n 24 {TEMPLATE_ARGS}"
    ran = chat(smol_gguf, f"{message}\nr\n", "--mcp", "t", "--allow-tools", args=args)
    assert ran.returncode == 0, ran.stderr
    assert "more than the model's context of 512 tokens. Nothing was sent." in ran.stderr, ran.stderr
    reload = re.search(r"r\) load the model again with a context of ([\d,]+) tokens", ran.stderr)
    assert reload is not None, ran.stderr
    [(prompt, _)] = telemetry_lines(ran.stderr)
    assert "[tools] No tools" not in ran.stderr, "the reload keeps run's --args (the template)"
    assert prompt > CTX, "the message and the tools, sent after the reload"
    assert prompt <= int(reload.group(1).replace(",", "")), "the larger context holds what was counted"
    assert engines_of(lemon_home) == []
