"""<think> splitting: whole texts, and the same answer however the stream is chunked."""

from __future__ import annotations

import random
import re

import pytest

from app.core.reasoning import Split, ThinkSplitter, split_think


def reference(text: str) -> Split:
    """Independent statement of the rule: alternate content / reasoning at each tag; an unclosed
    <think> runs to the end."""
    parts = re.split(r"(<think>|</think>)", text)
    content, reasoning, inside = [], [], False
    for part in parts:
        if part == ("</think>" if inside else "<think>"):
            inside = not inside
        else:
            (reasoning if inside else content).append(part)
    return Split("".join(content), "".join(reasoning))


def streamed(chunks: list[str]) -> Split:
    splitter = ThinkSplitter()
    content, reasoning = [], []
    for piece in [*[splitter.feed(c) for c in chunks], splitter.finish()]:
        content.append(piece.content)
        reasoning.append(piece.reasoning)
    return Split("".join(content), "".join(reasoning))


def test_whole_text() -> None:
    assert split_think("<think>plan it</think>The answer.") == Split("The answer.", "plan it")
    assert split_think("no tags at all") == Split("no tags at all", "")
    assert split_think("<think>still thinking") == Split("", "still thinking")
    assert split_think("a < b and </thin") == Split("a < b and </thin", "")


def test_tag_cut_across_chunks() -> None:
    splitter = ThinkSplitter()
    assert splitter.feed("<th") == Split()
    assert splitter.feed("ink>why") == Split(reasoning="why")
    assert splitter.feed("</") == Split()
    assert splitter.feed("think>ok") == Split(content="ok")
    assert splitter.finish() == Split()


def test_text_that_only_looks_like_a_tag_start_is_released() -> None:
    splitter = ThinkSplitter()
    assert splitter.feed("x <") == Split(content="x ")
    assert splitter.feed("b>") == Split(content="<b>")
    assert splitter.feed("<thi") == Split()
    assert splitter.finish() == Split(content="<thi")


ALPHABET = ["<think>", "</think>", "<", ">", "/", "t", "h", "i", "n", "k", "a", " ", "\n", "é", "<th", "</th"]


@pytest.mark.parametrize("seed", range(300))
def test_fuzzed_chunking_matches_the_whole_text_split(seed: int) -> None:
    rng = random.Random(seed)
    text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 60)))
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 12))))
    chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert "".join(chunks) == text
    assert streamed(chunks) == reference(text)
    assert streamed(list(text)) == reference(text)  # one character at a time
