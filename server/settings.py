"""Server configuration: one pydantic-settings model read from `CONTEXTSPAN_*` env vars and CLI flags."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# The public Moshi checkpoint served by default where a CUDA device is present.
DEFAULT_CUDA_PROFILE = "moshi"
DEFAULT_CUDA_CHECKPOINT = "kyutai/moshiko-pytorch-bf16"


class ServerSettings(BaseSettings):
    """Every field is also a `contextspan serve --flag` (underscores become dashes)."""

    model_config = SettingsConfigDict(env_prefix="CONTEXTSPAN_", extra="ignore")

    host: str = Field("127.0.0.1", description="bind address; loopback unless you mean to expose it")
    port: int = Field(8998, ge=0, le=65535)
    profile: str | None = Field(None, description="model profile; default: moshi with CUDA, tiny without")
    checkpoint: str | None = Field(None, description="HF repo id or local directory for checkpoint profiles")
    device: str | None = Field(None, description="torch device; default cuda if available else cpu")
    seed: int = 0
    torch_threads: int = Field(
        1, ge=1, description="torch CPU threads; 1 keeps small CPU models steady on a busy machine (2 threads "
        "spin against other processes and miss deadlines)",
    )
    max_sessions: int | None = Field(None, ge=1, description="concurrent sessions; default 2 for tiny, else 1")
    max_message_bytes: int = Field(256 * 1024, ge=1024, description="larger WebSocket messages close with 1009")
    send_queue_frames: int = Field(25, ge=1, description="outgoing audio frames kept for a slow client (2 s)")
    input_backlog_frames: int = Field(50, ge=1, description="unprocessed input frames kept before dropping")
    deadline_ms: float = Field(80.0, gt=0, description="per-frame budget from a frame's arrival to its output")
    span_deadline_s: float = Field(2.5, gt=0, description="a span requested longer ago than this is dropped")
    max_persona_chars: int = Field(2000, ge=0)
    persona: str = Field("", description="default persona / system prompt prefilled before the handshake")
    recordings: bool = Field(True, description="write a stereo WAV and a JSONL transcript per session")
    recordings_dir: Path = Path("recordings")
    web_client: bool = Field(True, description="serve the browser demo at /")
    log_level: str = "info"

    def resolved_profile(self, cuda_available: bool) -> tuple[str, str | None]:
        """(profile, checkpoint): the real checkpoint where a GPU can run it, the tiny random model otherwise."""
        if self.profile:
            return self.profile, self.checkpoint
        if cuda_available:
            return DEFAULT_CUDA_PROFILE, self.checkpoint or DEFAULT_CUDA_CHECKPOINT
        return "tiny", None

    def resolved_max_sessions(self, profile: str) -> int:
        """Each slot holds its own model copy until batching lands, so big profiles default to one."""
        if self.max_sessions is not None:
            return self.max_sessions
        return 2 if profile == "tiny" else 1
