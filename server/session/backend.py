"""What every session's retrieval shares: the Whisper model and its thread, the context store, the knowledge base,
the LLM client. Built once at startup; a part that fails to start is reported and retrieval goes on without it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend_agent.agent import Agent
from backend_agent.asr.streaming import SpeechEdge, StreamingASR
from backend_agent.asr.transcriber import ASRLoadError
from backend_agent.asr.worker_process import ASRProcess, start_asr_process, transcribe
from backend_agent.context_store import ContextStore, Profile
from backend_agent.llm_client import ChatClient, LLMConfig
from backend_agent.tools import build_catalogue
from backend_agent.tools.base import Tool
from backend_agent.tools.knowledge_base import KnowledgeBase
from frontend_model.span.contract import SpanContract
from server.session.retrieval import Retrieval, RetrievalConfig, SpanAnswer
from server.session.trigger import Trigger
from server.settings import ServerSettings

if TYPE_CHECKING:
    from backend_agent.tools.mcp_tools import MCPToolset

logger = logging.getLogger(__name__)
BACKEND_NICENESS = 10


def lower_thread_priority() -> None:
    """Tool threads yield the CPU to the frame worker: a late answer costs little, a late frame is audible.

    Linux schedules threads as tasks, so a thread can be niced alone; elsewhere this is a no-op.
    """
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKEND_NICENESS)


def tool_choice(setting: str) -> str | dict[str, Any]:
    """`auto`, `required` and `none` pass through; any other value forces that tool."""
    if setting in ("auto", "required", "none"):
        return setting
    return {"type": "function", "function": {"name": setting}}


@dataclass
class Backend:
    settings: ServerSettings
    asr_process: ASRProcess | None  # Whisper in its own process, replaced if it dies (see worker_process)
    store: ContextStore
    knowledge: KnowledgeBase | None
    llm: ChatClient | None
    tool_executor: ThreadPoolExecutor
    asr_error: str | None = None
    mcp: MCPToolset | None = None
    mcp_error: str | None = None

    @classmethod
    def create(cls, settings: ServerSettings) -> Backend:
        """Blocking (model load, folder indexing): call it off the event loop."""
        asr_process, asr_error = None, None
        if settings.asr:
            try:
                asr_process = start_asr_process(settings.asr_model, settings.asr_device,
                                                beam_size=settings.asr_beam_size)
            except ASRLoadError as exc:
                asr_error = str(exc)
                logger.error("speech recognition off: %s", exc)
        knowledge = None
        if settings.knowledge_dir is not None:
            knowledge = KnowledgeBase(":memory:")
            count = knowledge.index_folder(settings.knowledge_dir)
            logger.info("knowledge base: %d documents from %s", count, settings.knowledge_dir)
        llm = None
        if settings.llm_base_url:
            llm = ChatClient(LLMConfig(base_url=settings.llm_base_url, model=settings.llm_model,
                                       api_key=settings.llm_api_key))
        mcp, mcp_error = None, None
        if settings.mcp_servers:
            from backend_agent.tools.mcp_tools import MCPStartError, MCPToolset  # imports `mcp` only when used

            try:
                mcp = MCPToolset(settings.mcp_servers)
                mcp.start()
            except (MCPStartError, ValueError) as exc:
                mcp, mcp_error = None, str(exc)
                logger.error("MCP tools off: %s", exc)
        return cls(settings, asr_process, ContextStore(settings.context_store), knowledge, llm,
                   ThreadPoolExecutor(2, thread_name_prefix="tool", initializer=lower_thread_priority),
                   asr_error, mcp, mcp_error)

    def warm_up(self) -> None:
        """First calls load timezone data and compile parsers (~10 ms): pay that before a `<ret>` waits on it."""
        router = self.agent_for(Profile(user_id="warm-up")).router
        for question in ("What time is it in London?", "What is 2 plus 2?", "How many metres are in a mile?",
                         "What day is it today?"):
            router.answer(question)

    def agent_for(self, profile: Profile, client_tools: Sequence[Tool] = ()) -> Agent:
        """`client_tools`: the session's client-run tools, after the built-in and MCP ones (never replacing one)."""
        tools = build_catalogue(
            default_timezone=profile.timezone or "UTC", knowledge=self.knowledge, user_id=profile.user_id,
            weather_url=self.settings.weather_url, search_url=self.settings.search_url,
            extra_tools=[*(self.mcp.tools if self.mcp is not None else ()), *client_tools],
        )
        return Agent(tools, self.llm, tool_choice(self.settings.llm_tool_choice), self.tool_executor)

    def retrieval_for(
        self,
        session_id: str,
        user_id: str,
        on_answer: Callable[[SpanAnswer], None],
        emit: Callable[[Any], None],
        stream_time: Callable[[], float],
        on_error: Callable[[Exception], None],
        trigger: Trigger,
        contract: SpanContract | None = None,
    ) -> Retrieval:
        """A started retrieval loop for one session (must run on the event loop); `trigger` as resolved at load,
        `contract` the model's (tool prefix, abstain span)."""
        retrieval: Retrieval | None = None

        def on_transcript(transcript: Any) -> None:
            if retrieval is not None:
                retrieval.on_transcript(transcript)

        def on_speech(edge: SpeechEdge) -> None:
            if retrieval is not None:
                retrieval.on_speech(edge)

        asr = None
        if self.asr_process is not None:
            asr = StreamingASR(transcribe, self.asr_process, on_transcript, on_error, on_speech=on_speech)
            asr.start()
        s = self.settings
        config = RetrievalConfig(deadline_s=s.span_deadline_s, question_wait_s=s.question_wait_s,
                                 recent_audio_s=s.recent_audio_s, trigger=trigger, contract=contract or SpanContract())
        retrieval = Retrieval(session_id, user_id, self.agent_for(self.store.get_profile(user_id)), self.store, asr,
                              on_answer, emit, stream_time, config)
        return retrieval

    async def aclose(self) -> None:
        if self.llm is not None:
            await self.llm.aclose()
        if self.asr_process is not None:
            self.asr_process.shutdown(wait=False, cancel_futures=True)
        self.tool_executor.shutdown(wait=False, cancel_futures=True)
        if self.mcp is not None:
            await asyncio.to_thread(self.mcp.close)  # up to a few seconds for a server that ignores EOF
        self.store.close()
        if self.knowledge is not None:
            self.knowledge.close()
