"""Tools from a real MCP server (tests/backend_agent/mcp_echo_server.py) over stdio and streamable HTTP, alone and
through the agent with a fake OpenAI-compatible LLM."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from backend_agent.agent import Agent
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import Tool, ToolError, build_catalogue
from backend_agent.tools.mcp_tools import MCPServerSpec, MCPStartError, MCPToolset
from benchmarks.fakes.fake_openai import fake_openai
from benchmarks.harness import free_port

SERVER = Path(__file__).with_name("mcp_echo_server.py")
ECHO = f"echo={sys.executable} {SERVER}"


def _mcp_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "mcp-client"}


@pytest.fixture(scope="module")
def echo() -> Iterator[MCPToolset]:
    with MCPToolset([ECHO]) as toolset:
        yield toolset


def test_lists_the_servers_tools_with_their_schemas(echo: MCPToolset) -> None:
    tools = {tool.name: tool for tool in echo.tools}
    assert set(tools) == {"echo_add", "echo_capital", "echo_fail"}
    add = tools["echo_add"]
    assert add.description == "Add two integers."
    assert add.parameters["type"] == "object" and add.parameters["required"] == ["a", "b"]
    assert {k: v["type"] for k, v in add.parameters["properties"].items()} == {"a": "integer", "b": "integer"}
    assert tools["echo_capital"].openai_schema()["function"]["parameters"]["properties"]["country"]["type"] == "string"


def test_run_returns_the_text_and_its_source(echo: MCPToolset) -> None:
    tools = {tool.name: tool for tool in echo.tools}
    result = tools["echo_add"].run({"a": 2, "b": 40})
    assert (result.text, result.source) == ("2 + 40 = 42", "mcp:echo/add")
    assert tools["echo_capital"].run({"country": "kenya"}).text == "The capital of Kenya is Nairobi."


@pytest.mark.parametrize(("name", "args"), [("echo_fail", {}), ("echo_capital", {"country": "Atlantis"}),
                                            ("echo_add", {"a": "two", "b": 1})])
def test_a_failing_tool_is_a_tool_error(echo: MCPToolset, name: str, args: dict[str, object]) -> None:
    tool = next(tool for tool in echo.tools if tool.name == name)
    with pytest.raises(ToolError) as raised:
        tool.run(args)
    assert 0 < len(str(raised.value)) <= 200 and "\n" not in str(raised.value)


def test_calls_from_many_worker_threads_at_once(echo: MCPToolset) -> None:
    add = next(tool for tool in echo.tools if tool.name == "echo_add")
    with ThreadPoolExecutor(6) as pool:
        texts = list(pool.map(lambda i: add.run({"a": i, "b": i}).text, range(12)))
    assert texts == [f"{i} + {i} = {2 * i}" for i in range(12)]


def test_the_agent_calls_an_mcp_tool_the_llm_asks_for(echo: MCPToolset) -> None:
    async def ask(url: str) -> object:
        client = ChatClient(LLMConfig(base_url=url, model="fake"))
        try:
            return await Agent(build_catalogue(extra_tools=echo.tools), client).answer("Capital of Peru?", "", 2.0)
        finally:
            await client.aclose()

    with fake_openai() as (url, script):
        script.mode, script.tool, script.arguments = "tool_call", "echo_capital", {"country": "Peru"}
        result = asyncio.run(ask(url))
        sent = {tool["function"]["name"] for tool in script.requests[-1]["tools"]}
    answer = result.answer  # type: ignore[attr-defined]
    assert answer is not None, result
    assert (answer.text, answer.source, answer.tool) == ("The capital of Peru is Lima.", "mcp:echo/capital",
                                                         "echo_capital")
    assert {"echo_add", "echo_capital", "time_in_place"} <= sent


def test_built_in_tools_keep_their_names() -> None:
    shadow = Tool("arithmetic", "shadow", {}, lambda args: None)  # type: ignore[arg-type,return-value]
    assert build_catalogue(extra_tools=[shadow])["arithmetic"] is not shadow


def test_a_command_that_does_not_exist_is_a_clear_start_error() -> None:
    threads, started = _mcp_threads(), time.monotonic()
    with pytest.raises(MCPStartError, match=r"no-such-mcp-server --flag.*FileNotFoundError"):
        MCPToolset([ECHO, "no-such-mcp-server --flag"]).start()  # all or nothing: echo is closed again
    assert time.monotonic() - started < 5
    assert _mcp_threads() == threads


def test_close_leaves_no_child_process_and_later_calls_fail_cleanly() -> None:
    before, threads = {p.pid for p in psutil.Process().children(recursive=True)}, _mcp_threads()
    toolset = MCPToolset([ECHO])
    tools = toolset.start()
    children = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert children, "the stdio server should be our child"
    toolset.close()
    _, alive = psutil.wait_procs(children, timeout=1)
    assert alive == []
    assert _mcp_threads() == threads
    with pytest.raises(ToolError, match="not connected"):
        tools[0].run({"a": 1, "b": 2})
    toolset.close()  # idempotent


def test_streamable_http_server() -> None:
    port = free_port()
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        with MCPToolset([f"http://127.0.0.1:{port}/mcp"]) as toolset:
            add = next(tool for tool in toolset.tools if tool.name.endswith("_add"))
            result = add.run({"a": 1, "b": 2})
        assert (add.name, result.text, result.source) == ("127_0_0_1_add", "1 + 2 = 3", "mcp:127_0_0_1/add")
    finally:
        process.terminate()
        process.wait(timeout=5)


def test_server_specs() -> None:
    parse = MCPServerSpec.parse
    assert parse("python -m pkg.weather_server --units metric") == MCPServerSpec(
        "weather_server", "python", ("-m", "pkg.weather_server", "--units", "metric"))
    assert parse("npx -y @acme/files /tmp").name == "files"
    assert parse("/opt/bin/notes-mcp --db 'my notes.db'").args == ("--db", "my notes.db")
    assert parse("notes=/opt/bin/notes-mcp").name == "notes"
    assert parse("https://mcp.example.com/mcp").name == "mcp_example_com"
    assert parse("kb=https://mcp.example.com/mcp").is_http
    toolset = MCPToolset(["uvx a-server", "uvx a-server --other"])
    assert [spec.name for spec in toolset.specs] == ["a-server", "a-server2"]
    with pytest.raises(ValueError):
        parse("   ")


def test_the_backend_offers_mcp_tools_and_survives_a_broken_server() -> None:
    from backend_agent.context_store import Profile
    from server.session.backend import Backend
    from server.settings import ServerSettings

    async def scenario() -> None:
        backend = Backend.create(ServerSettings(asr=False, mcp_servers=[ECHO]))
        try:
            assert backend.mcp is not None and backend.mcp_error is None
            agent = backend.agent_for(Profile(user_id="u1"))
            assert {"echo_add", "time_in_place"} <= set(agent.tools)
        finally:
            await backend.aclose()
        broken = Backend.create(ServerSettings(asr=False, mcp_servers=["no-such-mcp-server"]))
        try:
            assert broken.mcp is None and "no-such-mcp-server" in (broken.mcp_error or "")
            assert "time_in_place" in broken.agent_for(Profile(user_id="u1")).tools
        finally:
            await broken.aclose()

    asyncio.run(scenario())
