"""Markdown and code to the HTML subset that Qt's rich text understands.

markdown-it and pygments are imported on the first render, not with this module: the window imports it,
and they cost tens of milliseconds of start-up that no empty chat needs.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from markdown_it import MarkdownIt
    from pygments.formatters import HtmlFormatter
    from pygments.lexer import Lexer

LIGHT_CODE_STYLE = "friendly"
DARK_CODE_STYLE = "monokai"


@dataclass(frozen=True)
class Theme:
    dark: bool
    code_background: str  # behind code blocks and inline code
    border: str  # table rules, quote bars
    muted: str  # quotes, secondary text
    code_foreground: str  # code text the highlighter leaves uncoloured

    @property
    def code_style(self) -> str:
        return DARK_CODE_STYLE if self.dark else LIGHT_CODE_STYLE


LIGHT = Theme(False, "#f3f4f6", "#d0d4da", "#5f6670", "#1f2328")
DARK = Theme(True, "#272822", "#4a4f57", "#a0a6ae", "#f8f8f2")


_HEADING_SIZES = {"h1": "1.5em", "h2": "1.3em", "h3": "1.15em", "h4": "1em", "h5": "1em", "h6": "1em"}


def _md(theme: Theme) -> MarkdownIt:
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark", {"html": False, "breaks": False}).enable(["table", "strikethrough"])
    code = f"background-color:{theme.code_background}; font-family:monospace;"

    def code_inline(_self: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
        return f'<code style="{code}">{html.escape(tokens[idx].content)}</code>'

    def code_block(_self: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
        return code_html(tokens[idx].content.removesuffix("\n"), tokens[idx].info.strip(), theme)

    def table_open(_self: Any, _tokens: Any, _idx: int, _options: Any, _env: Any) -> str:
        return f'<table border="1" cellspacing="0" cellpadding="5" style="border-color:{theme.border}">'

    def heading_open(_self: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
        # Headings a step smaller than a document's: a chat reply is not a page.
        size = _HEADING_SIZES[tokens[idx].tag]
        return f'<p style="font-size:{size}; font-weight:600; margin-top:6px">'

    def heading_close(_self: Any, _tokens: Any, _idx: int, _options: Any, _env: Any) -> str:
        return "</p>\n"

    def image(_self: Any, tokens: Any, idx: int, _options: Any, _env: Any) -> str:
        # A link, not a picture: a reply must not make the app load files or hosts of its choosing.
        src = html.escape(tokens[idx].attrGet("src") or "", quote=True)
        alt = html.escape(tokens[idx].content or tokens[idx].attrGet("src") or "image")
        return f'<a href="{src}">{alt}</a>'

    def blockquote_open(_self: Any, _tokens: Any, _idx: int, _options: Any, _env: Any) -> str:
        return f'<blockquote style="color:{theme.muted}; margin-left:12px">'

    rules = md.add_render_rule
    rules("code_inline", code_inline)
    rules("code_block", code_block)
    rules("fence", code_block)
    rules("table_open", table_open)
    rules("blockquote_open", blockquote_open)
    rules("heading_open", heading_open)
    rules("heading_close", heading_close)
    rules("image", image)
    return md


@lru_cache(maxsize=2)
def _parser(theme: Theme) -> MarkdownIt:
    return _md(theme)


def markdown_html(source: str, theme: Theme) -> str:
    """Markdown source as rich text."""
    html_text: str = _parser(theme).render(source)
    return html_text


@lru_cache(maxsize=64)
def _lexer(lang: str) -> Lexer:
    from pygments.lexers import TextLexer, get_lexer_by_name
    from pygments.util import ClassNotFound

    try:
        return get_lexer_by_name(lang, stripnl=False, ensurenl=False) if lang else TextLexer()
    except ClassNotFound:
        return TextLexer()


@lru_cache(maxsize=2)
def _formatter(style: str) -> HtmlFormatter[str]:
    from pygments.formatters import HtmlFormatter

    return HtmlFormatter(style=style, noclasses=True, nowrap=True)


def code_html(code: str, lang: str, theme: Theme) -> str:
    """Highlighted code in a ``<pre>`` that wraps long lines."""
    from pygments import highlight

    body = highlight(code, _lexer(lang.lower()), _formatter(theme.code_style)) if code else ""
    return (
        f'<pre style="white-space:pre-wrap; margin:0; color:{theme.code_foreground};'
        f' font-family:monospace">{body.removesuffix(chr(10))}</pre>'
    )
