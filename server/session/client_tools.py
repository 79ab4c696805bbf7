"""Tools that run on the client: declared in `session.update`, called over the wire, answered by the client.

The backend's agent sees them as ordinary tools. Calling one sends the call to the client (a `tool.call` event,
which the Realtime wire turns into a function-call item) and waits for the answer on the event loop; the client-tool
deadline, counted from the call (the span deadline from the `<ret>`, where that ends later), bounds the wait: real
client tools (an HTTP call, a database) take longer than a span deadline, and LiveKit Agents runs them only once the
response is done. An answer after that, or to a call never made, is refused with an error: the frame clock never
waited for it.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

from backend_agent.tools.base import Tool, ToolError, ToolResult
from server.wire import protocol as p

# Calls remembered after they ended, to tell a late answer from one to a call never made.
_ENDED_KEPT = 64


def _runs_on_the_client(_: dict[str, Any]) -> ToolResult:
    raise ToolError("this tool runs on the client; the agent awaits it with run_async")


class ClientTools:
    """One session's client-run tools and the calls in flight to its client."""

    def __init__(self, emit: Callable[[p.ServerEvent], None], stream_time: Callable[[], float],
                 deadline_s: float | None = None) -> None:
        """`deadline_s`: each call's own deadline, from the call (None: the request's deadline alone)."""
        self.emit = emit
        self.stream_time = stream_time
        self.deadline_s = deadline_s
        self.declared: dict[str, p.ClientTool] = {}
        self._pending: dict[str, asyncio.Future[str]] = {}
        self._ended: deque[str] = deque(maxlen=_ENDED_KEPT)

    def declare(self, tools: list[p.ClientTool]) -> None:
        """Replaces the declared set; calls in flight still take their answers."""
        self.declared = {tool.name: tool for tool in tools}

    def catalogue(self) -> list[Tool]:
        return [Tool(spec.name, spec.description, spec.parameters, _runs_on_the_client,
                     lambda args, name=spec.name: self.call(name, args), self.deadline_s)
                for spec in self.declared.values()]

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Sends the call and waits for the client's answer (the caller bounds the wait)."""
        call_id = f"call_{secrets.token_hex(8)}"
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._pending[call_id] = future
        try:
            self.emit(p.ToolCall(t=self.stream_time(), call_id=call_id, name=name,
                                 arguments=json.dumps(arguments, ensure_ascii=False)))
            output = await future
        finally:
            self._pending.pop(call_id, None)
            self._ended.append(call_id)
        text = readable(output)
        if not text.strip():
            raise ToolError("the client's tool answered with no text")
        return ToolResult(text, f"client:{name}")

    def detach(self) -> None:
        """At the session's end: calls still waiting fail, and the callbacks into the session are dropped (they
        would keep it alive in a cycle only the collector frees)."""
        for future in self._pending.values():
            future.cancel()
        self.emit, self.stream_time = _nothing, _never

    def answer(self, call_id: str, output: str) -> None:
        """The client's answer; raises ProtocolError for a call that has ended or was never made."""
        future = self._pending.get(call_id)
        if future is None or future.done():
            if call_id in self._ended:
                raise p.ProtocolError("tool_result_late", f"the answer to {call_id} came after its deadline "
                                      "(or after the retrieval ended): dropped")
            raise p.ProtocolError("unknown_call", f"no tool call {call_id[:100]!r} was made in this session")
        future.set_result(output)


def readable(output: str) -> str:
    """A tool's output as words to say. Frameworks send what a function returned as JSON (Pipecat a string as
    `"Sunny."`, a dict as an object): a JSON value is read as what it holds, an object as `key: value` pairs in
    order (nulls left out), a list as its items; text that is not JSON is said as it is."""
    try:
        value = json.loads(output)
    except ValueError:
        return output
    return _words(value)


def _words(value: Any) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{key}: {_words(item)}" for key, item in value.items() if item is not None)
    if isinstance(value, list):
        return ", ".join(_words(item) for item in value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _nothing(_: p.ServerEvent) -> None:
    """A detached session's events go nowhere."""


def _never() -> float:
    return 0.0
