"""The key by which the local API's requests go back to the slot holding their prompt
(``app.supervisor.resume.prompt_key``): a conversation's next turn starts as its last did, an unrelated
one does not, and the tools (which a chat template puts first) are part of the start."""

from __future__ import annotations

from app.supervisor.resume import SHARED_START_AT_LEAST, _best_start, prompt_key, shared_start

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
ASKED = {"role": "user", "content": "What is in the red box?"}
CALL = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "function": {"name": "look"}}]}
TOOL = {"role": "tool", "tool_call_id": "c1", "content": "marbles"}


def test_a_conversations_next_turn_starts_with_its_last_whole() -> None:
    last = prompt_key([SYSTEM, ASKED])
    following = prompt_key([SYSTEM, ASKED, CALL, TOOL])
    assert following.startswith(last)


def test_tool_calls_and_tools_are_part_of_the_prompt() -> None:
    other_call = {**CALL, "tool_calls": [{"id": "c2", "function": {"name": "weigh"}}]}
    assert prompt_key([SYSTEM, ASKED, CALL]) != prompt_key([SYSTEM, ASKED, other_call])
    tools = [{"type": "function", "function": {"name": "look"}}]
    assert shared_start(prompt_key([SYSTEM], tools=tools), prompt_key([SYSTEM])) == 0


def test_the_shared_start_is_counted_to_the_character() -> None:
    assert shared_start("abcdef", "abcxyz") == 3
    assert shared_start("abc", "abcdef") == 3
    assert shared_start("", "abc") == 0
    assert shared_start("x" * 5000 + "a", "x" * 5000 + "b") == 5000


def test_a_completions_prompt_is_its_own_key() -> None:
    assert prompt_key(prompt="Once upon a time") == "Once upon a time"
    assert prompt_key(prompt=[1, 2, 3]) == "[1, 2, 3]"


def test_the_slot_with_the_longest_shared_start_is_chosen_only_past_the_threshold() -> None:
    agent = prompt_key([SYSTEM, ASKED])
    prompts = {0: prompt_key([{"role": "user", "content": "pear " * 100}]), 1: agent}
    assert _best_start([0, 1], prompts, prompt_key([SYSTEM, ASKED, CALL])) == 1
    assert _best_start([0], prompts, agent) is None  # slot 1 is taken: nothing else shares its start
    short = {0: "user\nhello there", 1: ""}
    assert _best_start([0, 1], short, "user\nhello again") is None  # a few shared characters are not enough
    assert len("user\nhello ") < SHARED_START_AT_LEAST
    poem = prompt_key([{"role": "user", "content": "Write a short poem about the sea."}])
    assert _best_start([0, 1], {0: "", 1: poem}, poem) == 1  # a one-line prompt, asked again
    long = {0: "user\n" + "x" * 1000 + "a"}
    assert _best_start([0], long, "user\n" + "x" * 1000 + "b" * 20_000) is None  # under a tenth of it
