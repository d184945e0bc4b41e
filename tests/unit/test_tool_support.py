"""Which models are offered tools (``app.core.tools.tool_support``): llama-server's own reading of its
chat template first, then the model's ``tool-calling`` label, then an MLX folder's template text; and
how an MLX folder's template is found (``app.supervisor.router.tool_support.chat_template``). The
engines' side runs for real in tests/integration/test_tool_loop_real.py."""

from __future__ import annotations

import json
from pathlib import Path

from app.core.tools import TOOL_LABEL, tool_support
from app.supervisor.router.tool_support import chat_template

TAKES = {"supports_tools": True, "supports_tool_calls": True}


def test_the_engines_word_decides_a_model_it_serves_whatever_its_labels() -> None:
    assert tool_support("m", caps=TAKES).can
    refused = tool_support("m", caps={**TAKES, "supports_tools": False}, labels=[TOOL_LABEL])
    assert not refused.can
    assert refused.why.startswith("No tools for m: its chat template does not take tools.")
    assert not tool_support("m", caps={"supports_tools": True}).can  # it must write calls back too


def test_without_the_engines_word_a_label_or_a_template_naming_tools_decides() -> None:
    assert tool_support("m", labels=[TOOL_LABEL]).can
    assert tool_support("m", template="{% if tools %}{{ tools | tojson }}{% endif %}").can
    plain = tool_support("m", template="{% for message in messages %}{{ message.content }}{% endfor %}")
    assert not plain.can and "its chat template names no tools" in plain.why
    unknown = tool_support("m")
    assert not unknown.can and "its engine does not say" in unknown.why and TOOL_LABEL in unknown.why


def test_a_remote_model_is_offered_tools_its_server_decides() -> None:
    assert tool_support("@box/m", remote=True).can


def test_an_mlx_folders_template_is_read_from_either_file(tmp_path: Path) -> None:
    assert chat_template(tmp_path) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ tools }}"}))
    assert chat_template(tmp_path) == "{{ tools }}"
    named = [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "{{ tools }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert "{{ tools }}" in (chat_template(tmp_path) or "")
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    assert chat_template(tmp_path) == "{{ messages }}"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert chat_template(tmp_path) is None
