"""The FastAPI application: WebSocket chat, health, readiness, metrics, recordings and the web client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, HTTPException, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect

from frontend_model.calibration import calibrate_prefill
from frontend_model.engine import DEFAULT_MAX_SPAN_FRAMES, PrefillCost
from frontend_model.loading import LoadedModel, ModelLoadError, load_model
from server import protocol as p
from server.backend import Backend
from server.json_logging import session_id_var
from server.metrics import Metrics
from server.model_session import PersonaError, warm_up
from server.recording import recording_path
from server.session import Session, SessionOptions
from server.settings import ServerSettings
from server.worker import ModelWorker, SlotPool

logger = logging.getLogger(__name__)

WEB_CLIENT_DIR = Path(__file__).resolve().parent.parent / "web_client"

RANDOM_WEIGHTS_BANNER = (
    "\n" + "!" * 100 + "\n"
    "!!  RANDOM WEIGHTS: profile {profile} has no trained checkpoint. The server works end to end, but the\n"
    "!!  agent's audio is NOISE and its text is gibberish. Use a CUDA machine or --profile/--checkpoint.\n"
    + "!" * 100
)


@dataclass
class ServerState:
    settings: ServerSettings
    metrics: Metrics = field(default_factory=Metrics)
    model: LoadedModel | None = None
    pool: SlotPool | None = None
    worker: ModelWorker | None = None
    load_error: str | None = None
    cost: PrefillCost | None = None
    backend: Backend | None = None
    sessions: dict[str, Session] = field(default_factory=dict)

    def ready(self) -> bool:
        return self.pool is not None and self.worker is not None


async def load_into(state: ServerState, preloaded: LoadedModel | None) -> None:
    """Load, copy per slot and warm up off the event loop, so /healthz answers while a big model loads."""
    settings = state.settings
    try:
        import torch

        torch.set_num_threads(settings.torch_threads)
        profile, checkpoint = settings.resolved_profile(torch.cuda.is_available())
        model = preloaded or await asyncio.to_thread(
            load_model, profile, checkpoint, settings.device, None, None, settings.seed
        )
        slots = settings.resolved_max_sessions(model.profile)
        worker = ModelWorker(str(model.device))
        state.cost = await worker.run(lambda: calibrate_prefill(model, DEFAULT_MAX_SPAN_FRAMES))
        pool = await asyncio.to_thread(SlotPool, model, slots)
        for slot in pool.models():
            await worker.run(lambda s=slot: warm_up(s))
        state.backend = await asyncio.to_thread(Backend.create, settings)
        await asyncio.to_thread(state.backend.warm_up)
    except ModelLoadError as exc:
        state.load_error = str(exc)
        logger.error("model not loaded: %s", exc)
        return
    except Exception as exc:  # CUDA out of memory, a corrupt file...: say so on /readyz and the page
        state.load_error = f"{type(exc).__name__}: {exc}"
        logger.exception("model not loaded")
        return
    if model.random_weights:
        logger.warning(RANDOM_WEIGHTS_BANNER.format(profile=model.profile))
    logger.info("serving %s on %s with %d session slot(s)", model.description, model.device, slots)
    state.model, state.worker = model, worker
    state.metrics.session_slots.set(slots)
    state.pool = pool


def create_app(settings: ServerSettings | None = None, model: LoadedModel | None = None) -> FastAPI:
    """`model` lets a caller that already holds a loaded model skip loading (benchmarks, notebooks)."""
    settings = settings or ServerSettings()
    state = ServerState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        loader = asyncio.create_task(load_into(state, model))
        try:
            yield
        finally:
            loader.cancel()
            if state.worker is not None:
                state.worker.shutdown()
            if state.backend is not None:
                await state.backend.aclose()

    app = FastAPI(title="contextspan", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        info = _info(state)
        ok = state.ready() and info["free_slots"] > 0
        return JSONResponse(info, status_code=200 if ok else 503)

    @app.get("/api/info")
    async def api_info() -> dict[str, object]:
        return _info(state)

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.sessions_active.set(len(state.sessions))
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/api/recordings/{name}")
    async def recording(name: str) -> FileResponse:
        stem, dot, suffix = name.rpartition(".")
        path = recording_path(settings.recordings_dir, stem, dot + suffix) if settings.recordings else None
        if path is None:
            raise HTTPException(404, "no such recording")
        return FileResponse(path, filename=path.name)

    @app.websocket("/api/chat")
    async def chat(ws: WebSocket) -> None:
        await ws.accept()
        await serve_session(ws, state)

    if settings.web_client and WEB_CLIENT_DIR.is_dir():
        app.mount("/", StaticFiles(directory=WEB_CLIENT_DIR, html=True), name="web_client")
    return app


def _info(state: ServerState) -> dict[str, object]:
    model = state.model
    return {
        "loaded": state.ready(),
        "load_error": state.load_error,
        "profile": model.profile if model else None,
        "description": model.description if model else None,
        "random_weights": model.random_weights if model else None,
        "voices": sorted(model.voice_prompts) if model else [],
        "max_sessions": state.pool.size if state.pool else 0,
        "free_slots": state.pool.free if state.pool else 0,
        "sessions": len(state.sessions),
        "protocol": p.PROTOCOL_VERSION,
        "asr": state.backend is not None and state.backend.asr_process is not None,
        "asr_error": state.backend.asr_error if state.backend else None,
        "llm": bool(state.backend and state.backend.llm),
        "mcp_error": state.backend.mcp_error if state.backend else None,
        "trigger": state.settings.trigger,
    }


async def serve_session(ws: WebSocket, state: ServerState) -> None:
    settings, metrics = state.settings, state.metrics
    if not state.ready() or state.model is None or state.pool is None or state.worker is None:
        metrics.sessions.labels("refused_loading").inc()
        reason = state.load_error or "the model is still loading"
        await ws.close(p.CLOSE_TRY_AGAIN, p.close_reason("not_ready", reason))
        return
    options = SessionOptions.from_query(dict(ws.query_params), settings.persona)
    if len(options.persona) > settings.max_persona_chars:
        metrics.sessions.labels("rejected").inc()
        await ws.close(p.CLOSE_POLICY, p.close_reason("bad_persona", f"over {settings.max_persona_chars} chars"))
        return
    model = state.pool.acquire()
    if model is None:
        metrics.sessions.labels("refused_capacity").inc()
        await ws.close(p.CLOSE_TRY_AGAIN, p.close_reason("at_capacity", f"all {state.pool.size} slots busy"))
        return
    session: Session | None = None
    code, reason = p.CLOSE_NORMAL, ""
    try:
        # Every session's step shares the one worker inside a frame: a span gets its share of the deadline.
        span_budget_s = settings.deadline_ms / 1e3 / state.pool.size
        session = Session(ws, settings, model, state.worker, metrics, options, state.cost, span_budget_s,
                          state.backend, ws.query_params.get("user"))
        session_id_var.set(session.id)
        state.sessions[session.id] = session
        metrics.sessions.labels("accepted").inc()
        await session.run()
    except PersonaError as exc:
        code, reason = p.CLOSE_POLICY, p.close_reason("bad_persona", str(exc))
    except (WebSocketDisconnect, OSError):  # the client left (uvicorn's ClientDisconnected is an OSError)
        pass
    except RuntimeError as exc:
        # Starlette raises RuntimeError for a send on a socket the client already closed.
        if ws.client_state.name == "CONNECTED" and ws.application_state.name == "CONNECTED":
            logger.exception("session failed")
            code, reason = p.CLOSE_INTERNAL, p.close_reason("internal", str(exc))
    except Exception as exc:
        logger.exception("session failed")
        code, reason = p.CLOSE_INTERNAL, p.close_reason("internal", type(exc).__name__)
    finally:
        if session is None:
            state.pool.release(model)
        else:
            state.sessions.pop(session.id, None)
            session.release(state.pool)
            await session.close(code, reason)
            logger.info("session %s closed", session.id)
