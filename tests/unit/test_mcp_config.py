"""MCP server definitions: the import of a Cursor/Claude-style mcp.json (bad entries refused, each with
its reason), the app's own file (saved atomically, set aside when unreadable), and the state table."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from app.core.errors import ConfigError
from app.core.mcp import (
    McpServerSpec,
    McpState,
    McpTransport,
    can_transition,
    check_server_name,
    describe_target,
    parse_mcp_json,
    spec_from_fields,
    tool_name,
    tool_names,
)
from app.store.mcp_servers import (
    load_always_allowed,
    load_mcp_servers,
    mcp_servers_path,
    save_always_allowed,
    save_mcp_servers,
)

CURSOR_STYLE = {
    "mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
        "search": {"url": "https://example.com/mcp", "headers": {"X-Team": "blue"}},
        "with-env": {"command": "uvx", "args": ["mcp-server-git"], "env": {"GIT_DIR": "/repo"}},
        "both": {"command": "x", "url": "https://example.com/mcp"},
        "neither": {"args": ["a"]},
        "bad-args": {"command": "x", "args": "--flag"},
        "leaky": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer sk-1"}},
        "ftp": {"url": "ftp://example.com/mcp"},
        "../escape": {"command": "x"},
        "bad-env": {"command": "x", "env": {"N": 1}},
    }
}


def test_an_mcp_json_keeps_its_good_servers_and_refuses_each_bad_one_saying_why() -> None:
    found = parse_mcp_json(CURSOR_STYLE)
    assert [s.name for s in found.servers] == ["files", "search", "with-env"]
    files, search, with_env = found.servers
    assert files == McpServerSpec(
        "files",
        McpTransport.STDIO,
        command="npx",
        args=("-y", "@modelcontextprotocol/server-filesystem", "/tmp"),
    )
    assert search.transport is McpTransport.HTTP and search.headers == {"X-Team": "blue"}
    assert with_env.env == {"GIT_DIR": "/repo"}
    refused = "\n".join(found.refused)
    assert len(found.refused) == 7
    for name, why in [
        ("both", "both a command and a url"),
        ("neither", "neither a command nor a url"),
        ("bad-args", "args must be a list of strings"),
        ("leaky", "keep the token in the keychain"),
        ("ftp", "not an http(s) address"),
        ("../escape", "cannot name an MCP server"),
        ("bad-env", "env must be an object of strings"),
    ]:
        assert any(name in line and why in line for line in found.refused), (name, refused)


@pytest.mark.parametrize("data", [[], {"servers": {}}, {"mcpServers": []}, "text"])
def test_a_file_that_is_no_mcp_json_is_refused_whole(data: object) -> None:
    with pytest.raises(ConfigError, match="no 'mcpServers' object"):
        parse_mcp_json(data)


@pytest.mark.parametrize("name", ["", "a/b", "a__b", "a.b", "x" * 41, "-lead"])
def test_server_names_keep_to_a_plain_alphabet(name: str) -> None:
    with pytest.raises(ConfigError, match="cannot name an MCP server"):
        check_server_name(name)


def test_tool_names_offered_to_a_model_are_valid_function_names() -> None:
    assert tool_name("files", "read_file") == "files__read_file"
    assert tool_name("web", "search.v2 (beta)") == "web__search_v2__beta_"
    assert len(tool_name("s", "t" * 100)) == 64


def test_tool_names_that_would_clash_are_made_unique_the_same_way_in_any_order() -> None:
    pairs = [
        ("web", "search.v2"),
        ("web", "search_v2"),
        ("a", "_b"),
        ("a_", "b"),
        ("s", "t" * 70),
        ("s", "t" * 71),
    ]
    names = tool_names(pairs)
    assert len(set(names)) == len(names) and all(len(n) <= 64 for n in names)
    assert all(re.fullmatch(r"[A-Za-z0-9_-]+_[0-9a-f]{8}", n) for n in names)  # every clashing one hashed
    assert names[0].startswith("web__search_v2_") and names[2].startswith("a___b_")
    assert tool_names(pairs[::-1]) == names[::-1]
    assert tool_names([("web", "search.v2"), ("a", "b")]) == ["web__search_v2", "a__b"]  # no clash: plain


def test_servers_are_saved_atomically_without_their_token_and_read_back(lemon_home: Path) -> None:
    servers = {s.name: s for s in parse_mcp_json(CURSOR_STYLE).servers}
    servers["search"] = McpServerSpec(
        "search", McpTransport.HTTP, url="https://example.com/mcp", has_token=True
    )
    save_mcp_servers(servers)
    text = mcp_servers_path().read_text()
    assert "Bearer" not in text and json.loads(text)["servers"]["search"]["token"] is True
    assert list(lemon_home.glob("*.tmp*")) == []
    assert load_mcp_servers().items == servers


def test_an_unreadable_servers_file_is_set_aside_not_deleted(lemon_home: Path) -> None:
    mcp_servers_path().write_text('{"schema": 1, "servers": {"x": {"command": 5}}}')
    loaded = load_mcp_servers()
    assert loaded.items == {} and "unreadable" in loaded.warning
    assert [p.name for p in lemon_home.iterdir() if p.name.startswith("mcp_servers.json.")]


def test_always_allowed_tools_are_kept_per_server() -> None:
    save_always_allowed({"files": frozenset({"read_file", "list"}), "web": frozenset()})
    assert load_always_allowed().items == {"files": frozenset({"read_file", "list"}), "web": frozenset()}


def test_every_pair_of_states_is_legal_or_not_as_the_table_says() -> None:
    legal = {
        (McpState.OFF, McpState.STARTING),
        (McpState.STARTING, McpState.READY),
        (McpState.STARTING, McpState.BACKOFF),
        (McpState.STARTING, McpState.FAILED),
        (McpState.STARTING, McpState.OFF),
        (McpState.READY, McpState.BACKOFF),
        (McpState.READY, McpState.FAILED),
        (McpState.READY, McpState.OFF),
        (McpState.BACKOFF, McpState.STARTING),
        (McpState.BACKOFF, McpState.OFF),
        (McpState.FAILED, McpState.STARTING),
        (McpState.FAILED, McpState.OFF),
    }
    for old in McpState:
        for new in McpState:
            assert can_transition(old, new) == ((old, new) in legal), (old, new)


def test_a_server_typed_in_settings_is_a_command_line_or_a_url_with_key_value_pairs() -> None:
    stdio = spec_from_fields("git", "uvx mcp-server-git --repository '/my repo'", "GIT_PAGER=cat 'A=b c'")
    assert (stdio.transport, stdio.command, stdio.args) == (
        McpTransport.STDIO,
        "uvx",
        ("mcp-server-git", "--repository", "/my repo"),
    )
    assert stdio.env == {"GIT_PAGER": "cat", "A": "b c"}
    assert describe_target(stdio) == ("uvx mcp-server-git --repository '/my repo'", "GIT_PAGER=cat 'A=b c'")
    web = spec_from_fields("web", " https://example.com/mcp ", "X-Team=blue", enabled=False)
    assert (web.transport, web.url, web.headers, web.enabled) == (
        McpTransport.HTTP,
        "https://example.com/mcp",
        {"X-Team": "blue"},
        False,
    )
    for target, pairs, why in [
        ("", "", "command line, or its http"),
        ("tool 'open", "", "Close the quotes"),
        ("tool", "NOVALUE", "is not KEY=VALUE"),
        ("https://example.com/mcp", "Authorization=x", "keep the token in the keychain"),
    ]:
        with pytest.raises(ConfigError, match=why):
            spec_from_fields("s", target, pairs)


def test_an_imported_entry_never_uses_a_token_kept_here() -> None:
    """An mcp.json from elsewhere that says "token": true under a name kept here would have that
    server's keychain token sent to the file's own url."""
    found = parse_mcp_json({"mcpServers": {"work": {"url": "https://elsewhere.example/mcp", "token": True}}})
    (spec,) = found.servers
    assert spec.url == "https://elsewhere.example/mcp" and spec.has_token is False
