"""A fake OpenAI-compatible server on loopback: the real wire format, scripted behaviour per test."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from benchmarks.harness import free_port

HANG_S = 30.0  # how long a hung request holds before it answers: past the span deadline of whoever uses it


@dataclass
class Script:
    mode: str = "content"  # content | tool_call | hang | error500 | garbage | bad_arguments
    content: str = "The museum opens at nine."
    tool: str = "time_in_place"
    arguments: dict[str, Any] = field(default_factory=lambda: {"place": "Tokyo"})
    requests: list[dict[str, Any]] = field(default_factory=list)
    # Replies served first, one per request, before `mode` applies: {"content": ...} or {"tool": ..., "arguments": ...}
    queue: list[dict[str, Any]] = field(default_factory=list)


def _completion(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": "fake",
        "choices": [{"index": 0, "message": {"role": "assistant", **message},
                     "finish_reason": "tool_calls" if "tool_calls" in message else "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def make_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(request: Request) -> Response:
        body = await request.json()
        script.requests.append(body)
        if script.queue:
            reply = script.queue.pop(0)
            if "tool" not in reply:
                return JSONResponse(_completion({"content": reply["content"]}))
            call = {"id": f"call_{len(script.requests)}", "type": "function",
                    "function": {"name": reply["tool"], "arguments": json.dumps(reply["arguments"])}}
            return JSONResponse(_completion({"content": None, "tool_calls": [call]}))
        if script.mode == "hang":
            await asyncio.sleep(HANG_S)
        if script.mode == "error500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if script.mode == "garbage":
            return Response(b'{"choices": [{"message": ', media_type="application/json")
        if script.mode in ("tool_call", "bad_arguments"):
            arguments = "{not json" if script.mode == "bad_arguments" else json.dumps(script.arguments)
            call = {"id": "call_1", "type": "function", "function": {"name": script.tool, "arguments": arguments}}
            return JSONResponse(_completion({"content": None, "tool_calls": [call]}))
        return JSONResponse(_completion({"content": script.content}))

    return app


@contextmanager
def fake_openai() -> Iterator[tuple[str, Script]]:
    script = Script()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(script), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1", script
    finally:
        server.should_exit = True
        thread.join(timeout=5)
