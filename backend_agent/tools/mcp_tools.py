"""Tools from MCP servers (the `mcp` package), exposed as ordinary `Tool`s.

`Tool.run` is synchronous and runs in a worker thread, while an MCP client session is asyncio code bound to the
loop it was opened on. So the toolset owns one event loop in a background thread; each server's session lives in
one task on that loop for its whole life (anyio scopes must be entered and left by the same task), and `run`
submits `call_tool` to that loop and waits for it with a timeout.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import shlex
import threading
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

from backend_agent.tools.base import Tool, ToolError, ToolResult

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 200
_NAMED = re.compile(r"^([A-Za-z][\w-]*)=(.+)$", re.S)
_LAUNCHERS = {"python", "python3", "node", "npx", "uvx", "bunx", "deno", "pipx"}


class MCPStartError(RuntimeError):
    """An MCP server did not start or did not answer `initialize`/`tools/list` in time."""


@dataclass(frozen=True)
class MCPServerSpec:
    """One configured server: `[name=]command args...` (stdio) or `[name=]http(s)://...` (streamable HTTP)."""

    name: str
    command: str  # the executable, or the URL
    args: tuple[str, ...] = ()

    @property
    def is_http(self) -> bool:
        return self.command.startswith(("http://", "https://"))

    @property
    def display(self) -> str:
        return shlex.join([self.command, *self.args])

    @classmethod
    def parse(cls, spec: str) -> MCPServerSpec:
        text = spec.strip()
        explicit = None
        named = _NAMED.match(text)
        if named:  # `name=...`; a URL or a command line cannot match (':' or ' ' before the '=')
            explicit, text = named.group(1), named.group(2).strip()
        parts = shlex.split(text)
        if not parts:
            raise ValueError(f"empty MCP server spec {spec!r}")
        command, args = parts[0], tuple(parts[1:])
        return cls(_sanitize(explicit or _default_name(command, args)), command, args)


def _default_name(command: str, args: tuple[str, ...]) -> str:
    """A readable prefix: the module of `python -m mod`, the script or package a launcher runs, the URL's host."""
    if command.startswith(("http://", "https://")):
        return command.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1].rsplit(".", 1)[-1]
    if PurePath(command).name.rstrip("0123456789.") in _LAUNCHERS:  # python3.11 -> python
        target = next((a for a in args if not a.startswith("-")), None)
        if target:
            return PurePath(target).stem
    return PurePath(command).stem


def _sanitize(name: str) -> str:
    """OpenAI function names allow only [A-Za-z0-9_-], at most 64 characters."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")[:40] or "mcp"


def _field(obj: Any, *names: str, default: Any = None) -> Any:
    """mcp 2.x names fields in snake_case (`is_error`), 1.x in camelCase (`isError`)."""
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def _describe(exc: BaseException) -> str:
    """One short line: task groups wrap the real cause in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if hasattr(exc, "error") and getattr(exc.error, "message", None):  # McpError / MCPError
        message = exc.error.message
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def _result_text(result: Any) -> str:
    texts = [item.text for item in _field(result, "content", default=[]) if getattr(item, "type", None) == "text"]
    text = "\n".join(t for t in texts if t).strip()
    if not text:
        structured = _field(result, "structured_content", "structuredContent")
        if structured is not None:
            text = json.dumps(structured, ensure_ascii=False)
    return text


class MCPToolset:
    """Connects to MCP servers, lists their tools once at `start()`, and calls them from any thread.

    Tool names are `<server>_<tool>` so two servers (or a built-in tool) cannot clash. Stdio servers get the mcp
    package's minimal default environment (PATH, HOME, ...), not ours, so our secrets do not leak to them.
    """

    def __init__(self, servers: Sequence[str], *, start_timeout_s: float = 10.0, call_timeout_s: float = 3.0) -> None:
        self.specs = [MCPServerSpec.parse(s) for s in servers]
        names = [spec.name for spec in self.specs]
        for i, spec in enumerate(self.specs):  # same prefix twice: number the later ones
            if names[:i].count(spec.name):
                self.specs[i] = MCPServerSpec(f"{spec.name}{names[:i].count(spec.name) + 1}", spec.command, spec.args)
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.tools: list[Tool] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._sessions: dict[str, Any] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._stop: asyncio.Event | None = None
        self._readies: list[concurrent.futures.Future[list[Any]]] = []

    def start(self) -> list[Tool]:
        """Blocking: spawn/connect every server, initialize, list tools. All or nothing: on any failure everything
        started is closed again and `MCPStartError` names the failing command(s)."""
        if self._loop is not None:
            raise RuntimeError("MCPToolset already started")
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="mcp-client", daemon=True)
        self._thread.start()
        readies = [concurrent.futures.Future[list[Any]]() for _ in self.specs]
        asyncio.run_coroutine_threadsafe(self._spawn(readies), loop).result(timeout=5)
        deadline = time.monotonic() + self.start_timeout_s
        errors: list[str] = []
        tools: list[Tool] = []
        for spec, ready in zip(self.specs, readies, strict=True):
            try:
                listed = ready.result(timeout=max(0.0, deadline - time.monotonic()))
            except concurrent.futures.TimeoutError:
                errors.append(f"{spec.display!r}: no answer within {self.start_timeout_s:g} s")
                continue
            except Exception as exc:
                errors.append(f"{spec.display!r}: {_describe(exc)}")
                continue
            tools.extend(self._make_tool(spec, mcp_tool) for mcp_tool in listed)
        if errors:
            self.close()
            raise MCPStartError("MCP server failed to start: " + "; ".join(errors))
        self.tools = tools
        logger.info("MCP: %d tools from %s", len(tools), ", ".join(spec.name for spec in self.specs))
        return tools

    def close(self) -> None:
        """End every session (the stdio transport closes the server's stdin, then terminates it) and the loop."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=10)
        except Exception as exc:  # a stuck server must not stop our own shutdown
            logger.warning("MCP: shutdown incomplete: %s", _describe(exc))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()
        self._loop, self._thread, self.tools = None, None, []

    def __enter__(self) -> MCPToolset:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _spawn(self, readies: list[concurrent.futures.Future[list[Any]]]) -> None:
        self._stop = asyncio.Event()
        self._readies = readies
        self._tasks = [asyncio.create_task(self._hold(spec, ready)) for spec, ready in zip(self.specs, readies,
                                                                                          strict=True)]

    async def _hold(self, spec: MCPServerSpec, ready: concurrent.futures.Future[list[Any]]) -> None:
        """The one task that opens, owns and closes this server's session."""
        assert self._stop is not None
        try:
            async with AsyncExitStack() as stack:
                if spec.is_http:
                    streams = await stack.enter_async_context(_http_client(spec.command))
                else:
                    params = StdioServerParameters(command=spec.command, args=list(spec.args))
                    streams = await stack.enter_async_context(stdio_client(params))
                session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
                await session.initialize()
                listed = await session.list_tools()
                self._sessions[spec.name] = session
                ready.set_result(list(listed.tools))
                await self._stop.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(_describe(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                logger.error("MCP server %s ended: %s", spec.name, _describe(exc))
            if not isinstance(exc, Exception):
                raise
        finally:
            self._sessions.pop(spec.name, None)

    async def _shutdown(self) -> None:
        if self._stop is not None:
            self._stop.set()
        for task, ready in zip(self._tasks, self._readies, strict=True):  # still starting: nothing to finish
            if not ready.done():
                task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=8)

    def _make_tool(self, spec: MCPServerSpec, mcp_tool: Any) -> Tool:
        schema = dict(_field(mcp_tool, "input_schema", "inputSchema", default={}) or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        description = _field(mcp_tool, "description", "title", default="") or mcp_tool.name
        name = _sanitize(f"{spec.name}_{mcp_tool.name}")[:64]

        def run(args: dict[str, Any]) -> ToolResult:
            return self._call(spec.name, mcp_tool.name, args)

        return Tool(name=name, description=description, parameters=schema, run=run)

    def _call(self, server: str, tool: str, args: dict[str, Any]) -> ToolResult:
        session, loop = self._sessions.get(server), self._loop
        if session is None or loop is None:
            raise ToolError(f"MCP server {server} is not connected")
        future = asyncio.run_coroutine_threadsafe(session.call_tool(tool, dict(args)), loop)
        try:
            result = future.result(timeout=self.call_timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise ToolError(f"MCP server {server} gave no answer within {self.call_timeout_s:g} s") from None
        except Exception as exc:
            raise ToolError(f"MCP {server}/{tool}: {_describe(exc)}") from None
        text = _result_text(result)
        if _field(result, "is_error", "isError", default=False):
            raise ToolError(" ".join((text or f"MCP tool {tool} failed").split())[:MAX_ERROR_CHARS])
        if not text:
            raise ToolError(f"MCP tool {tool} returned no text")
        return ToolResult(text, source=f"mcp:{server}/{tool}")


def _http_client(url: str) -> Any:
    """Streamable HTTP: `streamable_http_client` in mcp 2.x, `streamablehttp_client` (3-tuple) in 1.x."""
    from mcp.client import streamable_http

    factory = getattr(streamable_http, "streamable_http_client", None) or streamable_http.streamablehttp_client
    return factory(url)
