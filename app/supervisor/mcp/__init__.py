"""MCP servers run by the app (``host``: the collection; ``server``: one server, its state and calls;
``transport``: the stdio pipes of a server the app started itself; ``permissions``: the tools the user
allowed always). Front ends use ``McpHost`` through
the router."""

from app.supervisor.mcp.host import McpHost, McpServerView, OfferedTool
from app.supervisor.mcp.permissions import Permissions
from app.supervisor.mcp.server import McpCallError, McpServer, McpServerChanged, McpTool, ToolOutput

__all__ = [
    "McpCallError",
    "McpHost",
    "McpServer",
    "McpServerChanged",
    "McpServerView",
    "McpTool",
    "OfferedTool",
    "Permissions",
    "ToolOutput",
]
