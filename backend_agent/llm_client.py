"""OpenAI-compatible chat completions over httpx, as vLLM, llama.cpp's server, Ollama and OpenAI speak it."""

from __future__ import annotations

import json
from typing import Any

import httpx
from pydantic import BaseModel, Field, ValidationError


class LLMError(RuntimeError):
    """The LLM could not give a usable reply in time; the message is short enough for a span-dropped event."""


class LLMConfig(BaseModel):
    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1 (vLLM), http://127.0.0.1:11434/v1 (Ollama)")
    model: str = "default"
    api_key: str | None = None
    max_tokens: int = Field(96, ge=1)
    temperature: float = Field(0.0, ge=0.0)


class ToolCallRequest(BaseModel):
    id: str = ""
    name: str
    arguments: dict[str, Any]


class LLMReply(BaseModel):
    content: str | None = None
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)


class _Function(BaseModel):
    name: str
    arguments: str | dict[str, Any] = "{}"


class _WireToolCall(BaseModel):
    id: str = ""
    function: _Function


class _WireMessage(BaseModel):
    content: str | None = None
    tool_calls: list[_WireToolCall] | None = None


class _WireChoice(BaseModel):
    message: _WireMessage


class _WireResponse(BaseModel):
    choices: list[_WireChoice] = Field(min_length=1)


class ChatClient:
    """One request, no retries: the caller's span deadline bounds every call through `timeout_s`."""

    def __init__(self, config: LLMConfig, http: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self._http = http or httpx.AsyncClient()
        self._owns_http = http is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        tool_choice: str | dict[str, Any] | None = None,
        timeout_s: float = 2.0,
    ) -> LLMReply:
        body: dict[str, Any] = {
            "model": self.config.model,
            "messages": messages,
            "max_tokens": self.config.max_tokens,
            "temperature": self.config.temperature,
            "stream": False,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = tool_choice or "auto"
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        url = self.config.base_url.rstrip("/") + "/chat/completions"
        if timeout_s <= 0:
            raise LLMError("no time left before the span deadline")
        try:
            response = await self._http.post(url, json=body, headers=headers, timeout=timeout_s)
        except httpx.TimeoutException as exc:
            raise LLMError(f"LLM timed out after {timeout_s:.2f} s") from exc
        except httpx.HTTPError as exc:
            raise LLMError(f"LLM unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise LLMError(f"LLM answered HTTP {response.status_code}")
        return parse_reply(response.content)


def parse_reply(raw: bytes) -> LLMReply:
    """Validate the wire format strictly; tool arguments arrive as a JSON string (or an object from some servers)."""
    try:
        wire = _WireResponse.model_validate_json(raw)
    except ValidationError as exc:
        raise LLMError(f"LLM sent a malformed response ({exc.error_count()} problems)") from exc
    message = wire.choices[0].message
    calls = []
    for call in message.tool_calls or []:
        args = call.function.arguments
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as exc:
                raise LLMError(f"LLM sent malformed arguments for {call.function.name}") from exc
        if not isinstance(args, dict):
            raise LLMError(f"LLM sent non-object arguments for {call.function.name}")
        calls.append(ToolCallRequest(id=call.id, name=call.function.name, arguments=args))
    return LLMReply(content=message.content, tool_calls=calls)
