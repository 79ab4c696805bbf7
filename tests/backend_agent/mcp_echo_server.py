"""A tiny real MCP server for the tests: run it as `python tests/backend_agent/mcp_echo_server.py` (stdio), or
`... --http PORT` (streamable HTTP on loopback)."""

from __future__ import annotations

import sys
from typing import Any

try:  # mcp 2.x renamed FastMCP to MCPServer
    from mcp.server.mcpserver import MCPServer as FastMCP
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP  # type: ignore[no-redef]

CAPITALS = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi", "peru": "Lima"}

server: Any = FastMCP("echo")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return f"{a} + {b} = {a + b}"


@server.tool()
def capital(country: str) -> str:
    """The capital city of a country."""
    city = CAPITALS.get(country.strip().lower())
    if city is None:
        raise ValueError(f"no capital known for {country}")
    return f"The capital of {country.strip().title()} is {city}."


@server.tool()
def fail() -> str:
    """Always fails."""
    raise RuntimeError("this tool always fails")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run()
