"""Server configuration: one pydantic-settings model read from `CONTEXTSPAN_*` env vars and CLI flags."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from backend_agent.asr.transcriber import DEFAULT_BEAM_SIZE
from frontend_model.engine.optimisations import Optimisation

# Docker and Swarm secrets are files here, named like the variables in lower case (`contextspan_api_keys`): a key
# read from a file never sits in the environment, an image layer or `docker inspect`.
SECRETS_DIR = Path("/run/secrets")

# The public Moshi checkpoint served by default where a CUDA device is present.
DEFAULT_CUDA_PROFILE = "moshi"
DEFAULT_CUDA_CHECKPOINT = "kyutai/moshiko-pytorch-bf16"


class ServerSettings(BaseSettings):
    """Every field is also a `contextspan serve --flag` (underscores become dashes)."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTSPAN_", extra="ignore",
                                      secrets_dir=SECRETS_DIR if SECRETS_DIR.is_dir() else None)

    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean to expose it")
    port: int = Field(8998, ge=0, le=65535, description="TCP port; 0 picks a free one")
    profile: str | None = Field(None, description="model profile; default: moshi with CUDA, tiny without")
    checkpoint: str | None = Field(None, description="HF repo id or local directory for checkpoint profiles")
    device: str | None = Field(None, description="torch device; default cuda if available else cpu")
    seed: int = Field(0, description="seed of the random weights of the tiny, tiny-personaplex, tiny-contextspan "
                      "and moshi-7b profiles")
    wait_for_model: bool = Field(
        False, description="when the model fails to load, stay up (/readyz 503 with the reason, chats refused with "
        "1013) instead of exiting non-zero")
    torch_threads: int = Field(
        1, ge=1, description="torch CPU threads; 1 keeps small CPU models steady on a busy machine (2 threads "
        "spin against other processes and miss deadlines)",
    )
    api_keys: list[str] = Field(
        default_factory=list, description="operator API keys; when set, /api/chat needs a session token from "
        "POST /api/token and recordings need a key or their signed link")
    token_ttl_s: float = Field(60.0, gt=0, description="a session token works once, within this many seconds")
    allowed_origins: list[str] = Field(
        default_factory=list, description="browser origins that may open /api/chat besides the server's own; "
        "* allows any")
    allow_public_without_auth: bool = Field(
        False, description="listen on a non-loopback address without api_keys (a proxy in front authenticates)")
    trusted_proxies: str = Field(
        "127.0.0.1", description="addresses whose X-Forwarded-For names the client (comma list, * for any)")
    max_sessions: int = Field(
        2, ge=1, description="concurrent sessions, stepped as one batch (every row is computed each tick and holds "
        "a KV cache: ~1.9 GB for 7B bf16); fewer if the calibrated tick would not fit the frame budget")
    admission: Literal["calibrated", "fixed"] = Field(
        "calibrated", description="calibrated: as many sessions as the measured tick fits in the frame budget, at most "
        "max_sessions; fixed: exactly max_sessions whatever the measurement says (tests, hosts of known capacity)")
    max_span_frames: int = Field(
        640, ge=3, description="longest span in frames (open + text + close); the KV ring is widened by this much")
    span_cap: Literal["calibrated", "fixed"] = Field(
        "calibrated", description="calibrated: a span is cut to what its prefill fits in the frame budget by the "
        "startup measurement; fixed: spans up to max_span_frames whatever it says (tests, slow hosts)")
    calibration_cache: Path | None = Field(
        None, description="a folder where the startup measurement is kept, and read back instead of measured again "
        "by a later start with the same model, machine and settings (seconds of every start; replicas of one kind "
        "of machine may share it); delete its files to measure again")
    span_prefill: Literal["faster", "one-pass", "chunked"] = Field(
        "faster", description="how spans are written: whichever the startup measurement found faster per length, one "
        "forward pass, or power-of-two chunks on a scratch row (the same state either way)")
    window: Literal["auto", "keep-prefix", "slide"] = Field(
        "auto", description="a session past the model's context: keep-prefix keeps its persona prefix and prefills its "
        "most recent frames again right after it (exact, a prefill every context/8 frames); slide lets the prefix "
        "scroll out (moshi's ring); auto: keep-prefix for the PersonaPlex family (PersonaPlex, Context Spanning), "
        "trained with a prefix, slide for the others")
    window_refill: Literal["ahead", "in-tick"] = Field(
        "ahead", description="keep-prefix: ahead builds a session's refilled window a chunk a tick on a shadow row "
        "(one session's KV memory more) as it nears the context and swaps it in, so no tick pays a whole refill; "
        "in-tick prefills the kept frames in the tick that rolls (on 7B about 2300 frames, over a frame's budget)")
    max_connections_per_ip: int = Field(8, ge=1, description="open WebSockets per client address (HTTP 429 over)")
    max_message_bytes: int = Field(256 * 1024, ge=1024, description="larger WebSocket messages close with 1009")
    keepalive_s: float = Field(
        5.0, gt=0, le=60, description="WebSocket ping interval, and how often a session still preparing (prefill, "
        "a long persona) sends `session.preparing` to events clients: under the 10 s idle timers of clients and "
        "proxies")
    keepalive_timeout_s: float = Field(
        20.0, gt=0, description="a client that leaves a ping unanswered this long is gone: closed 1011")
    max_messages_per_s: float = Field(
        100.0, gt=0, description="client messages a second, averaged over 2 s bursts; over it closes 1008")
    max_session_s: float = Field(3600.0, gt=0, description="sessions end (1000, max_duration) after this long")
    session_end_warning_s: float = Field(30.0, ge=0, description="`session.ending` is sent this long before")
    max_protocol_errors: int = Field(
        20, ge=1, description="bad messages within 10 s before closing 1003 (unusable kinds) or 1007 (bad data)")
    shutdown_grace_s: float = Field(
        10.0, ge=0, description="on SIGTERM: refuse new sessions, warn live ones, close them by this deadline")
    worker_stall_s: float = Field(
        10.0, gt=0, description="a model call running longer restarts the worker: its sessions close 1011")
    send_queue_frames: int = Field(25, ge=1, description="outgoing audio frames kept for a slow client (2 s)")
    input_backlog_frames: int = Field(50, ge=1, description="unprocessed input frames kept before dropping")
    deadline_ms: float = Field(80.0, gt=0, description="per-frame budget from a frame's arrival to its output")
    align_phases: bool = Field(
        True, description="put up to one frame of silence ahead of a new session's audio so that its frames end "
        "with the other sessions' and share their ticks (for clients that send pages shorter than 80 ms)",
    )
    span_deadline_s: float = Field(2.5, gt=0, description="a span requested longer ago than this is dropped")
    client_tool_deadline_s: float = Field(
        10.0, gt=0, description="a client-run tool's answer is awaited this long from its call (the span deadline "
        "instead, where that ends later), the model keeping the floor meanwhile; its span's deadline then counts "
        "from the answer")
    max_persona_chars: int = Field(2000, ge=0, description="longer personas are refused with close code 1008")
    persona: str = Field("", description="default persona / system prompt prefilled before the handshake; empty: "
                         "the checkpoint's own (Context Spanning: the persona of its training, naming the user)")
    level_user_audio: bool = Field(True, description="bring the user's audio to -24 LUFS, per session as it streams, "
                                   "before the model and the ASR hear it (the loudness Context Spanning trained on)")
    recordings: bool = Field(True, description="write a stereo WAV and a JSONL transcript per session")
    recordings_dir: Path = Field(Path("recordings"), description="where session WAV and JSONL files go")
    web_client: bool = Field(True, description="serve the browser demo at /")
    asr: bool = Field(True, description="transcribe the user (retrieval needs the question)")
    asr_model: str | None = Field(None, description="faster-whisper model name or path; default: bundled tiny.en")
    asr_device: str = Field("cpu", description="device for Whisper: cpu (int8) or cuda (float16)")
    asr_beam_size: int = Field(
        DEFAULT_BEAM_SIZE, ge=1, le=10, description="Whisper's beam search width; 1 is greedy. 5 heard more "
        "questions right than greedy at about the same decode time on CPU (benchmarks/asr_settings.py)")
    llm_base_url: str | None = Field(None, description="OpenAI-compatible API, e.g. http://127.0.0.1:8000/v1; "
                                     "unset: the built-in router answers time, date, arithmetic, units, knowledge")
    llm_model: str = Field("default", description="model name sent to the LLM server")
    llm_api_key: str | None = Field(None, description="bearer token for the LLM server")
    llm_tool_choice: str = Field("auto", description="auto, required, none, or a tool name to force")
    trigger: Literal["auto", "ret", "asr"] = Field(
        "auto", description="what starts a retrieval: the model's <ret> token (ret), a question in the user's final "
        "transcript (asr), or by checkpoint (auto: ret for Context Spanning checkpoints, by their files; asr for "
        "the others)")
    app_spans: Literal["auto", "on", "off"] = Field(
        "auto", description="accept `span.inject` text from clients as spans; auto: only in authenticated sessions "
        "(api_keys set)")
    question_wait_s: float = Field(
        3.0, ge=0, description="how long a <ret> heard while the user speaks waits for them to stop; the span "
        "deadline then counts from their stop")
    recent_audio_s: float = Field(10.0, gt=0, description="audio transcribed when no utterance is final")
    context_store: str = Field(":memory:", description="SQLite file for profiles and turns; a path keeps them")
    knowledge_dir: Path | None = Field(None, description="folder of .txt/.md documents for the knowledge base tool")
    weather_url: str | None = Field(None, description="weather API URL template with {place}; off when unset")
    search_url: str | None = Field(None, description="SearXNG-style search API base URL; off when unset")
    mcp_servers: list[str] = Field(default_factory=list,
                                   description="MCP servers (stdio commands) whose tools the agent may call")
    resume_store: str = Field(
        "memory", description="where live sessions' state is kept to resume them (docs/operations.md, Sessions that "
        "outlive their replica): memory (this process only), redis://host:port/db (shared by replicas), or off")
    resume_ttl_s: float = Field(300.0, gt=0, description="a session's kept state and its resume token last this long "
                                "after its last save")
    resume_save_s: float = Field(1.0, gt=0, description="how often a live session's state is saved: what a crash "
                                 "loses at most")
    resume_secret: str | None = Field(
        None, description="HMAC key of resume tokens and session tokens; replicas that take each other's tokens and "
        "resume each other's sessions share it (unset: one drawn per process, so a token works only where it was "
        "issued)")
    force_ret_frame: int | None = Field(
        None, ge=0, description="test hook: act as if the model emitted <ret> at this frame of every session")
    fail_optimisations: list[Optimisation] = Field(
        default_factory=list, description="test hook: these GPU optimisations fail as they start, on any device, so "
        "that their eager fallback runs (docs/operations.md, When a GPU optimisation fails to start)")
    log_level: str = Field("info", description="debug, info, warning or error")
    log_json: bool = Field(False, description="one JSON object per log line, keyed by session_id")

    def resolved_profile(self, cuda_available: bool) -> tuple[str, str | None]:
        """(profile, checkpoint): the real checkpoint where a GPU can run it, the tiny random model otherwise."""
        if self.profile:
            return self.profile, self.checkpoint
        if cuda_available:
            return DEFAULT_CUDA_PROFILE, self.checkpoint or DEFAULT_CUDA_CHECKPOINT
        return "tiny", None
