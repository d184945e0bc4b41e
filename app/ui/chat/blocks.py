"""Split a growing markdown text into finished blocks and a tail that may still change.

A streaming reply is rendered block by block: finished blocks are rendered once, and only the tail is
rendered again as tokens arrive, so the cost of a token does not grow with the reply. A block ends only
where splitting cannot change how the text renders: at a blank line followed by a line that starts a new
block, before a heading, and around fenced code. A long fenced block is handed out in pieces of
``CODE_PIECE_LINES`` lines so that its tail stays short too.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

CODE_PIECE_LINES = 24

_FENCE_OPEN = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
_LIST_ITEM = re.compile(r"^ {0,3}(?:[-*+]|\d{1,9}[.)])(?:[ \t]|$)")
_HEADING = re.compile(r"^#{1,6}(?:[ \t]|$)")


class BlockKind(enum.Enum):
    TEXT = "text"  # markdown source: paragraphs, lists, headings, quotes, tables
    CODE = "code"  # the text of a fenced code block (or a piece of one)


@dataclass(frozen=True)
class Block:
    kind: BlockKind
    text: str
    lang: str = ""  # CODE: the fence's info string
    continued: bool = False  # CODE: continues the previous piece of the same fenced block
    closed: bool = True  # CODE: the last piece of its fenced block


class BlockSplitter:
    def __init__(self) -> None:
        self._text = ""
        self._start = 0  # where the unfinished block begins
        self._scan = 0  # the first line not yet looked at
        self._blank = False  # the last line looked at was blank
        self._list = False  # the unfinished text block is a list
        self._fence = ""  # the open fence's marker, "" outside code
        self._fence_indent = 0
        self._lang = ""
        self._continued = False  # the open piece of code continues an earlier piece
        self._piece_lines = 0

    @property
    def text(self) -> str:
        return self._text

    def feed(self, delta: str) -> list[Block]:
        """Add text; return the blocks it finished, in order."""
        self._text += delta
        done: list[Block] = []
        text = self._text
        while (end := text.find("\n", self._scan)) != -1:
            self._line(text[self._scan : end], self._scan, end + 1, done)
            self._scan = end + 1
        return done

    def tail(self) -> Block | None:
        """The unfinished block as it stands, or None when there is nothing but whitespace."""
        rest = self._text[self._start :]
        if self._fence:
            return Block(BlockKind.CODE, self._dedent(rest), self._lang, self._continued, closed=False)
        return Block(BlockKind.TEXT, rest) if rest.strip() else None

    def finish(self) -> list[Block]:
        """The end of the text: the tail becomes final."""
        tail = self.tail()
        self._start = self._scan = len(self._text)
        if tail is None:
            return []
        self._fence = ""
        if tail.kind is BlockKind.CODE:
            return [Block(BlockKind.CODE, tail.text.removesuffix("\n"), tail.lang, tail.continued)]
        return [tail]

    def _line(self, line: str, start: int, after: int, done: list[Block]) -> None:
        if self._fence:
            self._code_line(line, start, after, done)
            return
        opened = _FENCE_OPEN.match(line)
        if opened:
            self._end_text(start, done)
            self._fence, self._lang = opened.group(2), opened.group(3)
            self._fence_indent = len(opened.group(1))
            self._start, self._continued, self._piece_lines = after, False, 0
            self._blank = False
            return
        if not line.strip():
            self._blank = True
            return
        heading = bool(_HEADING.match(line))
        continues = line[0] in " \t" or (self._list and bool(_LIST_ITEM.match(line)))
        if heading or (self._blank and not continues):
            self._end_text(start, done)
        if self._start == start:
            self._list = bool(_LIST_ITEM.match(line))
        if heading:
            self._end_text(after, done)
        self._blank = False

    def _code_line(self, line: str, start: int, after: int, done: list[Block]) -> None:
        stripped = line.strip()
        closes = stripped.startswith(self._fence) and not stripped.strip(self._fence[0])
        if closes:
            code = self._dedent(self._text[self._start : start]).removesuffix("\n")
            done.append(Block(BlockKind.CODE, code, self._lang, self._continued))
            self._fence, self._start, self._blank = "", after, False
            return
        self._piece_lines += 1
        if self._piece_lines >= CODE_PIECE_LINES:
            code = self._dedent(self._text[self._start : after])
            done.append(Block(BlockKind.CODE, code, self._lang, self._continued, closed=False))
            self._start, self._continued, self._piece_lines = after, True, 0

    def _end_text(self, end: int, done: list[Block]) -> None:
        source = self._text[self._start : end]
        if source.strip():
            done.append(Block(BlockKind.TEXT, source))
        self._start = end
        self._list = False

    def _dedent(self, code: str) -> str:
        """Code inside an indented fence loses the fence's indent, as CommonMark says."""
        if not self._fence_indent:
            return code
        pattern = re.compile(rf"^ {{1,{self._fence_indent}}}", re.MULTILINE)
        return pattern.sub("", code)
