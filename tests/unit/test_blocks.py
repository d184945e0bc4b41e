"""Splitting a streaming markdown text into finished blocks and a tail."""

from __future__ import annotations

import pytest

from app.ui.chat.blocks import CODE_PIECE_LINES, Block, BlockKind, BlockSplitter

TEXT = BlockKind.TEXT
CODE = BlockKind.CODE


def stream(text: str, step: int) -> tuple[list[Block], BlockSplitter]:
    splitter = BlockSplitter()
    done: list[Block] = []
    for i in range(0, len(text), step):
        done += splitter.feed(text[i : i + step])
    return done, splitter


DOC = """# Title
Intro paragraph
over two lines.

- one
- two

- three after a blank line

Back to text.
```python
def f():
    return 1
```
> quote
"""


@pytest.mark.parametrize("step", [1, 3, 7, 1000])
def test_blocks_end_only_where_splitting_keeps_the_rendering(step: int) -> None:
    done, splitter = stream(DOC, step)
    done += splitter.finish()
    assert [(b.kind, b.text) for b in done] == [
        (TEXT, "# Title\n"),
        (TEXT, "Intro paragraph\nover two lines.\n\n"),
        (TEXT, "- one\n- two\n\n- three after a blank line\n\n"),  # one loose list, not two lists
        (TEXT, "Back to text.\n"),
        (CODE, "def f():\n    return 1"),
        (TEXT, "> quote\n"),
    ]
    assert done[4].lang == "python" and done[4].closed
    assert splitter.text == DOC


def test_the_tail_is_the_unfinished_block() -> None:
    splitter = BlockSplitter()
    assert splitter.feed("First para.\n\nSecond") == []
    tail = splitter.tail()
    assert tail is not None and tail.text == "First para.\n\nSecond"  # the blank line alone ends nothing
    assert splitter.feed(" para.\n\nThird") == [Block(TEXT, "First para.\n\n")]
    tail = splitter.tail()
    assert tail is not None and tail.text == "Second para.\n\nThird"


def test_an_open_fence_is_a_code_tail_and_long_code_comes_in_pieces() -> None:
    splitter = BlockSplitter()
    lines = [f"line {i}\n" for i in range(CODE_PIECE_LINES * 2 + 3)]
    done = splitter.feed("```js\n" + "".join(lines))
    assert [(b.kind, b.continued, b.closed) for b in done] == [(CODE, False, False), (CODE, True, False)]
    assert done[0].text == "".join(lines[:CODE_PIECE_LINES])
    tail = splitter.tail()
    assert tail is not None and (tail.kind, tail.lang, tail.continued) == (CODE, "js", True)
    assert tail.text == "".join(lines[CODE_PIECE_LINES * 2 :])
    assert splitter.feed("```\nafter\n") == [
        Block(CODE, "".join(lines[CODE_PIECE_LINES * 2 :])[:-1], "js", True)
    ]


def test_an_indented_fence_loses_its_indent_and_an_unclosed_fence_ends_with_the_text() -> None:
    splitter = BlockSplitter()
    done = splitter.feed("1. Install:\n   ```sh\n   pip install x\n   ```\n2. Run\n   ~~~\n   go")
    assert done == [Block(TEXT, "1. Install:\n"), Block(CODE, "pip install x", "sh"), Block(TEXT, "2. Run\n")]
    assert splitter.finish() == [Block(CODE, "go")]
    assert splitter.tail() is None
