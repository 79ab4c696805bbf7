"""Client-run tools: the call goes out as an event, the answer comes back by call id; late and unknown answers are
refused, and the agent's deadline bounds the wait."""

from __future__ import annotations

import asyncio

import pytest

from backend_agent.agent import Agent
from backend_agent.llm_client import ChatClient, LLMConfig
from benchmarks.fakes.fake_openai import fake_openai
from server.session.client_tools import ClientTools
from server.wire import protocol as p

WEATHER = p.ClientTool(name="get_weather", parameters={"type": "object", "properties": {"place": {"type": "string"}}})


def test_an_answer_by_call_id_is_the_tool_result_and_a_second_one_is_late() -> None:
    async def run() -> None:
        calls: list[p.ServerEvent] = []
        tools = ClientTools(calls.append, lambda: 1.0)
        tools.declare([WEATHER])
        (tool,) = tools.catalogue()
        assert tool.run_async is not None
        pending = asyncio.create_task(tool.run_async({"place": "Paris"}))
        await asyncio.sleep(0)
        (call,) = calls
        assert isinstance(call, p.ToolCall) and call.arguments == '{"place": "Paris"}'
        tools.answer(call.call_id, "Sunny.")
        result = await pending
        assert (result.text, result.source) == ("Sunny.", "client:get_weather")
        with pytest.raises(p.ProtocolError, match="after its span deadline") as late:
            tools.answer(call.call_id, "Sunny again.")
        assert late.value.code == "tool_result_late"
        with pytest.raises(p.ProtocolError) as unknown:
            tools.answer("call_never", "x")
        assert unknown.value.code == "unknown_call"

    asyncio.run(run())


def test_the_agent_waits_for_a_client_tool_no_longer_than_its_deadline() -> None:
    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "get_weather", {"place": "Paris"}

        async def run() -> str | None:
            tools = ClientTools(lambda _: None, lambda: 0.0)
            tools.declare([WEATHER])
            llm = ChatClient(LLMConfig(base_url=url, model="fake"))
            try:
                result = await Agent({t.name: t for t in tools.catalogue()}, llm).answer("Weather?", timeout_s=1.0)
            finally:
                await llm.aclose()
            assert result.answer is None
            return result.reason

        assert asyncio.run(run()) == "no answer within 1.00 s"
