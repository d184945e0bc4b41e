"""Markdown and code as the rich text Qt shows."""

from __future__ import annotations

from app.ui.chat.render import DARK, LIGHT, code_html, markdown_html


def test_markdown_renders_scaled_headings_styled_code_and_ruled_tables() -> None:
    out = markdown_html("# Title\n\nUse `x = 1` **now**.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n", LIGHT)
    assert '<p style="font-size:1.5em; font-weight:600; margin-top:6px">Title</p>' in out
    code_style = f"background-color:{LIGHT.code_background}; font-family:monospace;"
    assert f'<code style="{code_style}">x = 1</code>' in out
    assert "<strong>now</strong>" in out
    assert '<table border="1" cellspacing="0" cellpadding="5"' in out and "<td>2</td>" in out


def test_raw_html_and_images_from_a_reply_stay_inert() -> None:
    out = markdown_html('<img src="x.png"> and ![chart](https://example.com/x.png "t")', LIGHT)
    assert "<img" not in out
    assert "&lt;img" in out  # raw HTML is shown as text
    assert '<a href="https://example.com/x.png">chart</a>' in out


def test_code_is_highlighted_per_language_and_theme() -> None:
    light = code_html("def f():\n    return 1", "python", LIGHT)
    dark = code_html("def f():\n    return 1", "Python", DARK)
    assert light.startswith('<pre style="white-space:pre-wrap;') and light.endswith("</pre>")
    assert "<span style=" in light and "def" in light
    assert light != dark  # a dark palette gets a dark code style
    plain = code_html("<b>not bold</b>", "no-such-language", LIGHT)
    assert "&lt;b&gt;not bold&lt;/b&gt;" in plain and "<b>" not in plain
