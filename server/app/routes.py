"""The FastAPI application: WebSocket chat, health, readiness, metrics, recordings and the web client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.websockets import WebSocketDisconnect

from frontend_model.engine.batch_engine import RowFault
from frontend_model.engine.batch_model import BatchedModel, capture_step_graphs, start_batch
from frontend_model.engine.calibration import calibrate_costs, no_span_budget_warning, tick_sizes
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.costs import TickCost
from frontend_model.engine.device_memory import (
    DeviceMemory,
    device_memory,
    free_bytes,
    release_model,
    session_bytes,
    set_device,
    weight_bytes,
)
from frontend_model.engine.optimisations import Optimisations
from frontend_model.loading.loader import LoadedModel, ModelLoadError, default_device, load_model
from frontend_model.span.build import MIN_SPAN_FRAMES
from frontend_model.training.profile import profile_checkpoint
from server.app.kept_calibration import calibration_key, keep, read_kept
from server.batching.batcher import Batcher
from server.batching.tick_scheduler import TICK_SHARE, admission_log, admit
from server.batching.window_policy import WindowPolicy, resolve_window
from server.batching.worker import ModelWorker, WorkerRestarted
from server.guard import auth
from server.guard.limits import ConnectionsPerAddress
from server.ops.collector import PauseWatch, freeze_loaded
from server.ops.json_logging import session_id_var
from server.ops.metrics import Metrics
from server.ops.recording import recording_path
from server.session.backend import Backend
from server.session.persona import PersonaError
from server.session.realtime_wire import RealtimeWire
from server.session.resume import MemoryResumeStore, Resumes, ResumeState, ResumeStore, StoreUnavailable
from server.session.session import Session, SessionEnd, SessionOptions
from server.session.trigger import ResolvedTrigger, resolve_trigger
from server.session.wire import MoshiWire, SessionWire
from server.settings import ServerSettings
from server.wire import protocol as p
from server.wire import realtime as rt
from server.wire.outbound import OutboundQueue

logger = logging.getLogger(__name__)

ARRIVAL_SETTLE_S = 0.25  # how long a drain with nothing live still waits for a handshake under way
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
    batcher: Batcher | None = None
    worker: ModelWorker | None = None
    load_error: str | None = None
    backend: Backend | None = None
    memory: DeviceMemory | None = None  # the model's device memory when its batch started (memory_report)
    trigger: ResolvedTrigger | None = None  # resolved for the loaded checkpoint (server/session/trigger.py)
    optimisations: Optimisations | None = None  # which GPU optimisations started, for the loaded model's device
    sessions: dict[str, Session] = field(default_factory=dict)
    tokens: auth.SessionTokens = field(init=False)
    spent: ResumeStore = field(init=False)  # which session tokens were spent: the resume store's set, shared or not
    signer: auth.RecordingSigner = field(default_factory=auth.RecordingSigner)
    connections: ConnectionsPerAddress = field(init=False)
    resumes: Resumes | None = field(init=False)  # None: resume is off
    draining: bool = False
    handlers: int = 0  # connections inside `open_session`: being admitted, or a session's

    def __post_init__(self) -> None:
        settings = self.settings
        # Replicas given the same secret check each other's session and resume tokens; unset, one per process.
        secret = settings.resume_secret.encode() if settings.resume_secret else secrets.token_bytes(32)
        self.tokens = auth.SessionTokens(secret, settings.token_ttl_s)
        self.connections = ConnectionsPerAddress(settings.max_connections_per_ip)
        self.resumes = Resumes.from_settings(settings, secret)
        self.spent = self.resumes.store if self.resumes is not None else MemoryResumeStore()

    def ready(self) -> bool:
        return self.batcher is not None and self.worker is not None

    def handling(self) -> Handling:
        """A connection from its admission to its close: the drain waits for it, so that one admitted as SIGTERM came
        gets its 1013 rather than a socket dropped by the exiting process."""
        return Handling(self)

    async def drain(self, grace_s: float) -> None:
        """SIGTERM: refuse new sessions, warn the live ones, let them run, close what is left before the grace ends.
        With a shared resume store that answers, every session (of either endpoint) is handed over at once instead:
        each saves its state and closes with CLOSE_RESUME_ELSEWHERE and its token, to resume on another replica.

        Closing goes through each session's normal teardown, so recordings are complete when this returns.
        """
        self.draining = True
        loop = asyncio.get_running_loop()
        staying = list(self.sessions.values())
        resumes = self.resumes
        if resumes is not None and resumes.shared and staying:
            await resumes.check()
            if resumes.error is None:
                handed = [session for session in staying if session.resumes is not None]
                logger.info("draining: handing %d session(s) over to other replicas", len(handed))
                for session in handed:
                    session.end(p.CLOSE_RESUME_ELSEWHERE, "")
                staying = [session for session in staying if session.resumes is None]
        logger.info("draining %d session(s) within %.1f s", len(staying), grace_s)
        close_margin = min(1.0, grace_s / 2)
        for session in staying:
            session.notify_ending("server_shutdown", grace_s - close_margin)
        deadline = loop.time() + grace_s - close_margin
        settled = loop.time() + min(ARRIVAL_SETTLE_S, grace_s / 4)  # a handshake under way reaches its handler
        while (self.handlers or loop.time() < settled) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        for session in list(self.sessions.values()):
            session.end(p.CLOSE_GOING_AWAY, p.close_reason("server_shutdown", "the server is shutting down"))
        while self.handlers and loop.time() < deadline + close_margin:
            await asyncio.sleep(0.02)


@dataclass
class Handling:
    """`ServerState.handling`: a plain context manager (no generator frame for an exception to hold on to)."""

    state: ServerState

    def __enter__(self) -> None:
        self.state.handlers += 1

    def __exit__(self, *_: object) -> None:
        self.state.handlers -= 1


def model_loader(settings: ServerSettings, profile: str, checkpoint: str | None) -> Callable[[], LoadedModel]:
    """Loads the served model; runs on a thread of its own, which it first places on the model's CUDA device so that
    what loading runs there (and a cuda:N model's kernels) do not land on cuda:0."""

    def load() -> LoadedModel:
        set_device(settings.device or default_device())
        return load_model(profile, profile_checkpoint(profile, checkpoint, settings.seed), settings.device, None, None,
                          settings.seed)

    return load


async def load_into(state: ServerState, preloaded: LoadedModel | None) -> Callable[[], LoadedModel] | None:
    """Load, calibrate and warm up off the event loop, so /healthz answers while a big model loads.

    Returns how to make a fresh model (for the worker watchdog), or None when nothing loaded.
    """
    settings = state.settings
    try:
        import torch

        torch.set_num_threads(settings.torch_threads)
        profile, checkpoint = settings.resolved_profile(torch.cuda.is_available())
        if preloaded is not None:
            profile = preloaded.profile
        load = model_loader(settings, profile, checkpoint)
        model = await loaded_beside_the_backend(state, lambda: preloaded or load())
        worker = ModelWorker(str(model.device))
        optimisations = Optimisations(model.device.type == "cuda", frozenset(settings.fail_optimisations))
        state.optimisations = optimisations
        cost = await calibrate(state, model, worker, optimisations)
        state.batcher = await start_batcher(state, model, worker, cost, optimisations)
        await asyncio.to_thread(state.backend.warm_up)
        trigger = resolve_trigger(settings.trigger, model.layout, settings.force_ret_frame is not None)
    except ModelLoadError as exc:
        state.load_error = str(exc)
        logger.error("model not loaded: %s", exc)
        return None
    except Exception as exc:  # CUDA out of memory, a corrupt file...: say so on /readyz and the page
        state.load_error = f"{type(exc).__name__}: {exc}"
        logger.exception("model not loaded")
        return None
    if model.random_weights:
        logger.warning(RANDOM_WEIGHTS_BANNER.format(profile=model.profile))
    batcher = state.batcher
    logger.info("serving %s%s on %s: %s", model.description, f" from {model.source}" if model.source else "",
                model.device,
                admission_log(state.settings.admission, batcher.capacity, cost.tick, state.settings.deadline_ms / 1e3))
    logger.info("retrieval trigger: %s (%s)", trigger.trigger, trigger.why)
    logger.info("past the %d-frame context: %s", model.span.context, batcher.window_mode)
    if trigger.trigger == "asr" and state.backend.asr_process is None:
        logger.warning("retrieval trigger asr needs speech recognition, which is off: no retrieval will start")
    logger.info("froze %d objects made while loading: no garbage collection walks them", freeze_loaded())
    state.model, state.worker, state.trigger = model, worker, trigger  # ready: frozen before any session
    return load


async def loaded_beside_the_backend(state: ServerState, load: Callable[[], LoadedModel]) -> LoadedModel:
    """The model loads while the backend starts its speech recognition process (each takes seconds of a start);
    calibration comes after both, so that it measures the machine as it serves. A failed load still keeps the backend
    it started, for the shutdown to close."""
    creating = asyncio.create_task(asyncio.to_thread(Backend.create, state.settings))
    try:
        model = await asyncio.to_thread(load)
    except BaseException:
        with contextlib.suppress(Exception):
            state.backend = await creating
        raise
    state.backend = await creating
    return model


async def calibrate(state: ServerState, model: LoadedModel, worker: ModelWorker,
                    optimisations: Optimisations) -> TickCost:
    """What a span and a tick of each batch size cost on this machine; sizes stop past the tick's share. The step
    graphs start first, so that where they fail the eager step that will serve is what is measured. With a
    calibration cache, a start whose model, machine and settings were measured before reads that measurement."""
    settings = state.settings
    limit_s = settings.deadline_ms / 1e3 * TICK_SHARE
    sizes = tick_sizes(settings.max_sessions)
    await worker.run(lambda: capture_step_graphs(model, optimisations, settings.max_span_frames))

    def measure() -> TickCost:
        return calibrate_costs(model, sizes, limit_s, settings.max_span_frames, optimisations)

    folder = settings.calibration_cache
    if folder is None:
        return await worker.run(measure)
    key = calibration_key(model, sizes, limit_s, settings.max_span_frames, optimisations)
    kept = await asyncio.to_thread(optimisations.attempt, "calibration", lambda: read_kept(folder, key))
    if kept is not None:
        return kept
    cost = await worker.run(measure)
    if optimisations.enabled("calibration"):  # never an assumed cost
        await asyncio.to_thread(keep, folder, key, cost)
    return cost


async def start_batcher(state: ServerState, model: LoadedModel, worker: ModelWorker, cost: TickCost,
                        optimisations: Optimisations) -> Batcher:
    """As many slots as admission allows, in one batched model, warmed up and ticking; without the optimisations
    that failed to start."""
    settings = state.settings
    budget_s = settings.deadline_ms / 1e3
    admitted = admit(settings.admission, cost.tick, budget_s, settings.max_sessions, cost.memory_slots)
    span_budget_s = cost.span_budget(budget_s, admitted.slots)
    window = resolve_window(settings.window, model.span.contract.prefix_silences_always)
    # A fixed cap is an unbounded budget: spans still go the way calibration measured faster, as the scheduler expects.
    batched = await worker.run(lambda: start_batch(lambda: BatchedModel(
        model, admitted.slots, max_span_frames=settings.max_span_frames, cost=cost.prefill,
        frame_budget_s=span_budget_s if settings.span_cap == "calibrated" else math.inf,
        prefill=SpanPrefill(settings.span_prefill), optimisations=optimisations,
        # every slot keeps its token history on the device: to be saved and resumed, or to refill its window
        record=window == "keep-prefix" or state.resumes is not None)))
    cost = replace(cost, prefill=batched.engine.cost or cost.prefill)  # one-pass costs where its chunks did not start
    policy = WindowPolicy.for_context(model.span.context) if window == "keep-prefix" else None
    await worker.run(lambda: build_windows_ahead(batched, policy, settings.window_refill, optimisations))
    if batched.span_frame_cap < MIN_SPAN_FRAMES:
        logger.warning(no_span_budget_warning(cost.prefill, span_budget_s))
    per_session = session_bytes(model.lm, model.mimi, settings.max_span_frames).total
    scratch = batched.scratch_bytes()
    state.memory = await worker.run(lambda: device_memory(model.lm, model.mimi, per_session, scratch))
    batcher = Batcher(batched, worker, cost, admitted, budget_s, settings.span_deadline_s, state.metrics, policy)
    batcher.start()
    state.metrics.session_slots.set(admitted.slots)
    return batcher


def build_windows_ahead(batched: BatchedModel, policy: WindowPolicy | None, refill: str,
                        optimisations: Optimisations) -> None:
    """The shadow row that builds windows ahead (engine/window.py), where sessions keep their prefix and `refill`
    asks for it; where it fails to start, windows roll in their tick."""
    if policy is None or refill != "ahead":
        optimisations.unused("window_ahead")
        return
    largest = 1 << (batched.max_span_frames.bit_length() - 1)
    chunk = policy.ahead_chunk(batched.slots, largest)
    if optimisations.attempt("window_ahead", lambda: batched.build_windows_ahead(chunk)) is None:
        batched.stop_windows_ahead()


def memory_report(state: ServerState) -> DeviceMemory | None:
    """Live on CUDA (the allocator's counters cost nothing to read); on CPU the count taken when the batch started,
    since the weights and the preallocated streaming state do not change while serving."""
    model, memory = state.model, state.memory
    if model is not None and memory is not None and model.device.type == "cuda":
        state.memory = memory = device_memory(model.lm, model.mimi, memory.session_bytes, memory.scratch_bytes)
    return memory


async def watch_worker(state: ServerState, make_model: Callable[[], LoadedModel]) -> None:
    """Restart a worker stuck in one call for `worker_stall_s`: every session on it would miss every deadline.

    The sessions close with 1011 (their frames never ran), the stuck model is written off (the abandoned thread may
    still be using it) and a fresh one takes its place with the same calibration, so the server serves again.
    """
    stall_s = state.settings.worker_stall_s
    while True:
        await asyncio.sleep(min(0.5, stall_s / 4))
        worker, batcher = state.worker, state.batcher
        if worker is None or batcher is None:
            continue
        busy_s, session_id = worker.busy_for()
        if busy_s < stall_s:
            continue
        logger.error("model worker stuck for %.1f s (last submitted by session %s): restarting it", busy_s,
                     session_id)
        state.metrics.worker_restarts.inc()
        state.batcher = None
        worker.restart()
        for session in list(state.sessions.values()):
            session.end(p.CLOSE_INTERNAL, p.close_reason("worker_restarted", "the model worker stalled"))
        await batcher.stop(WorkerRestarted("the model worker stalled and was restarted"))
        memory, state.memory = state.memory, None
        refusal = await asyncio.to_thread(write_off, batcher.model, memory.session_bytes if memory else 0)
        if refusal is not None:
            state.load_error = refusal
            logger.error("model worker not restarted: %s", refusal)
            return
        model = await asyncio.to_thread(make_model)
        state.batcher = await start_batcher(state, model, worker, batcher.cost, batcher.model.optimisations)
        state.model = model
        freeze_loaded()  # the stuck model's objects are collected; the new one's frozen
        logger.info("model worker restarted; %d slot(s) ready again", state.batcher.size)


def write_off(batched: BatchedModel, per_session: int) -> str | None:
    """Free a stuck worker's model before another is loaded; why a reload cannot fit beside what is still held, or
    None. Emptying its tensors frees them though the stuck thread references the modules; only what a call still
    running holds (a hung kernel's operands) stays until that call returns, and a GPU that cannot hold a second copy
    beside it must not try."""
    model = batched.model
    need = weight_bytes(model.lm, model.mimi) + batched.slots * per_session
    release_model(model.lm, model.mimi)
    batched.close()  # its engine's exit stack still held the streaming states
    free = free_bytes(model.device)
    if free >= need:
        return None
    return (f"the stuck call still holds memory on {model.device}: {free / 2**30:.2f} GiB free, a reload needs "
            f"{need / 2**30:.2f} GiB; restart the process")


def create_app(settings: ServerSettings | None = None, model: LoadedModel | None = None) -> FastAPI:
    """`model` lets a caller that already holds a loaded model skip loading (benchmarks, notebooks)."""
    settings = settings or ServerSettings()
    state = ServerState(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async def load_and_watch() -> None:
            make_model = await load_into(state, model)
            if make_model is not None:
                await watch_worker(state, make_model)

        pauses = PauseWatch(state.metrics.gc_pause)
        pauses.start()
        loader = asyncio.create_task(load_and_watch())
        try:
            yield
        finally:
            pauses.stop()
            loader.cancel()
            if state.batcher is not None:
                await state.batcher.stop(WorkerRestarted("the server is shutting down"))
            if state.worker is not None:
                state.worker.shutdown()
            if state.backend is not None:
                await state.backend.aclose()
            if state.resumes is not None:
                await state.resumes.store.aclose()

    app = FastAPI(title="contextspan", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.server = state

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "alive"}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if state.resumes is not None:
            state.resumes.refresh()
        info = _info(state)
        ok = state.ready() and info["free_slots"] > 0 and not state.draining
        return JSONResponse(info, status_code=200 if ok else 503)

    @app.get("/api/info")
    async def api_info() -> dict[str, object]:
        return _info(state)

    @app.get("/metrics")
    async def metrics() -> Response:
        state.metrics.sessions_active.set(len(state.sessions))
        state.metrics.set_memory(memory_report(state))
        if state.optimisations is not None:
            state.metrics.set_optimisations(state.optimisations.status())
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.post("/api/token")
    async def token(request: Request) -> JSONResponse:
        """Trade an operator API key for a single-use session token that a page or app spends on /api/chat."""
        if not settings.api_keys:
            return JSONResponse({"error": "auth_off", "message": "no API keys are configured: /api/chat needs "
                                 "no token"}, status_code=404)
        if not auth.api_key_ok(auth.bearer(request.headers), settings.api_keys):
            return JSONResponse({"error": "bad_api_key", "message": "send Authorization: Bearer <API key>"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        return JSONResponse({"token": state.tokens.issue(), "expires_in": settings.token_ttl_s})

    @app.get("/api/recordings/{name}")
    async def recording(name: str, request: Request, sig: str | None = None) -> FileResponse:
        stem, dot, suffix = name.rpartition(".")
        if settings.api_keys and not (auth.api_key_ok(auth.bearer(request.headers), settings.api_keys)
                                      or state.signer.verify(stem, sig)):
            raise HTTPException(401, "recordings need an API key or the signed link from session.ready")
        path = recording_path(settings.recordings_dir, stem, dot + suffix) if settings.recordings else None
        if path is None:
            raise HTTPException(404, "no such recording")
        return FileResponse(path, filename=path.name)

    @app.websocket("/api/chat")
    async def chat(ws: WebSocket) -> None:
        await open_session(ws, state, auth.session_token(ws.query_params, ws.headers), None)

    @app.post("/v1/realtime/client_secrets")
    async def client_secrets(request: Request) -> JSONResponse:
        """The OpenAI SDK's `realtime.client_secrets.create`: an app's backend trades its API key for a short-lived,
        single-use secret that a device spends on /v1/realtime (`Authorization: Bearer <secret>`)."""
        if not settings.api_keys:
            return JSONResponse({"error": {"type": "invalid_request_error", "code": "auth_off", "message":
                                           "no API keys are configured: /v1/realtime needs no secret"}},
                                status_code=404)
        if not auth.api_key_ok(auth.bearer(request.headers), settings.api_keys):
            return JSONResponse({"error": {"type": "invalid_request_error", "code": "bad_api_key",
                                           "message": "send Authorization: Bearer <API key>"}},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        profile = state.model.profile if state.model else None
        return JSONResponse({"value": state.tokens.issue(), "expires_at": int(time.time() + settings.token_ttl_s),
                             "session": {"type": "realtime", "object": "realtime.session", "model": profile}})

    @app.websocket("/v1/realtime")
    async def realtime(ws: WebSocket) -> None:
        """The OpenAI Realtime protocol; `Authorization: Bearer` carries an API key or a client secret."""
        credential = auth.bearer(ws.headers)
        dialect = rt.dialect_of(dict(ws.headers))
        model = state.model
        voices = sorted(model.voice_prompts) if model else []
        name = model.profile if model else ""
        await open_session(ws, state, credential, lambda queue: RealtimeWire(
            queue, dialect, name, voices, settings.max_persona_chars, settings.client_tool_deadline_s),
            api_key_accepted=True)

    if settings.web_client:
        app.mount("/", StaticFiles(directory=web_client_dir(), html=True), name="web_client")
    return app


def web_client_dir() -> Path:
    """The browser demo's files: package data of `web_client`, found where that package is installed (a wheel, an
    image, a checkout), never by a path relative to this file."""
    files = resources.files("web_client")
    if not isinstance(files, Path):  # StaticFiles serves a folder on disk, not one inside a zip
        raise RuntimeError(f"web_client is not installed as files on disk ({files}); serve with --no-web-client")
    return files


async def open_session(ws: WebSocket, state: ServerState, credential: str | None,
                       wire: Callable[[OutboundQueue], SessionWire] | None, api_key_accepted: bool = False) -> None:
    """Admission, auth and the per-address cap, then the session; `wire` None is `/api/chat`'s protocol.
    `api_key_accepted`: an operator API key opens a session directly (server-side Realtime clients), besides
    a single-use token."""
    with state.handling():
        settings = state.settings
        address = ws.client.host if ws.client else "unknown"
        refusal = admission_refusal(ws, state)
        if refusal is not None:
            await deny(ws, state, *refusal)
            return
        if not state.connections.enter(address):
            await deny(ws, state, 429, "too_many_connections",
                       f"at most {settings.max_connections_per_ip} connections per address")
            return
        try:
            # A resume token stands in for the session token: it is signed, bound to its user and checked once accepted.
            resuming = "resume" in ws.query_params
            if settings.api_keys and not resuming and not (api_key_accepted and
                                                            auth.api_key_ok(credential, settings.api_keys)):
                check = await redeem(state, credential)
                if check is not auth.TokenCheck.OK:
                    await deny(ws, state, *TOKEN_REFUSALS[check])
                    return
            await ws.accept(subprotocol=auth.accepted_subprotocol(ws.headers))
            await serve_session(ws, state, wire)
        finally:
            state.connections.leave(address)


TOKEN_REFUSALS = {check: (status, f"token_{check.value}", message) for check, status, message in (
    (auth.TokenCheck.MISSING, 401, "this server needs a session token from POST /api/token"),
    (auth.TokenCheck.UNKNOWN, 401, "unknown or already used session token: each token opens one session"),
    (auth.TokenCheck.EXPIRED, 401, "session token expired: get a fresh one from POST /api/token"),
    (auth.TokenCheck.STORE_UNAVAILABLE, 503, "the token store cannot be reached: try again with the same token"),
)}


async def redeem(state: ServerState, token: str | None) -> auth.TokenCheck:
    """Spends a session token on this connection. A spent set that cannot answer refuses it unspent (fail closed:
    a token must never open two sessions), so the client may try the same token again while it lasts."""
    claim = state.tokens.check(token)
    if claim.check is not auth.TokenCheck.OK:
        return claim.check
    try:
        first = await state.spent.spend(claim.key, claim.left_s)
    except StoreUnavailable as exc:
        if state.resumes is not None:
            state.resumes.answered(exc)
        return auth.TokenCheck.STORE_UNAVAILABLE
    return auth.TokenCheck.OK if first else auth.TokenCheck.UNKNOWN


def admission_refusal(ws: WebSocket, state: ServerState) -> tuple[int, str, str] | None:
    """(HTTP status, error, message) for an upgrade refused before any token is spent, or None."""
    if not auth.origin_allowed(ws.headers.get("origin"), ws.headers.get("host"), state.settings.allowed_origins):
        return 403, "origin_not_allowed", "this origin may not open sessions (see allowed_origins)"
    return None


async def deny(ws: WebSocket, state: ServerState, status: int, error: str, message: str) -> None:
    """Refuse the upgrade with an HTTP status and a JSON body, which clients can read, unlike a bare 403."""
    state.metrics.sessions.labels(f"refused_{error}").inc()
    logger.info("refused a WebSocket from %s: %s", ws.client.host if ws.client else "?", error)
    await ws.send_denial_response(JSONResponse({"error": error, "message": message}, status_code=status))


def _info(state: ServerState) -> dict[str, object]:
    model = state.model
    return {
        "loaded": state.ready(),
        "load_error": state.load_error,
        "profile": model.profile if model else None,
        "description": model.description if model else None,
        "random_weights": model.random_weights if model else None,
        "voices": sorted(model.voice_prompts) if model else [],
        "max_sessions": state.batcher.size if state.batcher else 0,
        "free_slots": state.batcher.free if state.batcher else 0,
        "sessions": len(state.sessions),
        "protocol": p.PROTOCOL_VERSION,
        "asr": state.backend is not None and state.backend.asr_process is not None,
        "asr_error": state.backend.asr_error if state.backend else None,
        "llm": bool(state.backend and state.backend.llm),
        "mcp_error": state.backend.mcp_error if state.backend else None,
        "trigger": state.trigger.trigger if state.trigger else state.settings.trigger,
        "trigger_why": state.trigger.why if state.trigger else None,
        "app_spans": state.settings.app_spans,
        "window": state.batcher.window_mode if state.batcher else state.settings.window,
        "window_refill": state.batcher.window_refill if state.batcher else state.settings.window_refill,
        "auth": bool(state.settings.api_keys),
        "draining": state.draining,
        "memory": memory.as_dict() if (memory := memory_report(state)) else None,
        "optimisations": state.optimisations.status() if state.optimisations else None,
        "resume": state.resumes.status() if state.resumes else None,
    }


async def refused_draining(ws: WebSocket, state: ServerState) -> bool:
    """Closes with 1013 once the server drains: the drain has taken its list of sessions to warn."""
    if not state.draining:
        return False
    state.metrics.sessions.labels("refused_draining").inc()
    await ws.close(p.CLOSE_TRY_AGAIN, p.close_reason("draining", "the server is shutting down"))
    return True


async def serve_session(ws: WebSocket, state: ServerState,
                        wire: Callable[[OutboundQueue], SessionWire] | None = None) -> None:
    settings, metrics = state.settings, state.metrics
    if await refused_draining(ws, state):
        return
    batcher = state.batcher
    if not state.ready() or state.model is None or batcher is None:
        metrics.sessions.labels("refused_loading").inc()
        reason = state.load_error or "the model is still loading"
        await ws.close(p.CLOSE_TRY_AGAIN, p.close_reason("not_ready", reason))
        return
    resumed = None
    if (token := ws.query_params.get("resume")) is not None:
        resumed = await take_over(ws, state, token, MoshiWire.protocol if wire is None else RealtimeWire.protocol)
        if resumed is None:
            return
    if await refused_draining(ws, state):  # it drained while a resume was looked up
        return
    try:
        options = SessionOptions.from_query(dict(ws.query_params), settings.persona)
        if resumed is not None:
            options = replace(options, persona=resumed.persona, voice=resumed.voice)
    except ValueError as exc:
        metrics.sessions.labels("rejected").inc()
        await ws.close(p.CLOSE_POLICY, p.close_reason("bad_sampling", str(exc)))
        return
    if len(options.persona or "") > settings.max_persona_chars:
        metrics.sessions.labels("rejected").inc()
        await ws.close(p.CLOSE_POLICY, p.close_reason("bad_persona", f"over {settings.max_persona_chars} chars"))
        return
    slot = batcher.acquire()
    if slot is None:
        metrics.sessions.labels("refused_capacity").inc()
        await ws.close(p.CLOSE_TRY_AGAIN, p.close_reason(
            "at_capacity", f"all {batcher.size} slots busy; {batcher.capacity.reason}"))
        return
    session: Session | None = None
    code, reason = p.CLOSE_NORMAL, ""
    try:
        # With API keys set, every session got here with a token: it is authenticated.
        session = Session(ws, settings, state.model, batcher, slot, metrics, options, state.backend,
                          ws.query_params.get("user"), state.signer if settings.api_keys else None,
                          state.trigger.trigger if state.trigger else "ret",
                          auth.app_spans_allowed(settings.app_spans, authenticated=bool(settings.api_keys)), wire,
                          state.resumes, resumed)
        session_id_var.set(session.id)
        state.sessions[session.id] = session
        metrics.sessions.labels("accepted").inc()
        await session.run()
    except PersonaError as exc:
        code, reason = p.CLOSE_POLICY, p.close_reason("bad_persona", str(exc))
    except SessionEnd as end:
        code, reason = end.code, end.reason
    except WorkerRestarted as exc:
        code, reason = p.CLOSE_INTERNAL, p.close_reason("worker_restarted", str(exc))
    except RowFault as exc:
        code, reason = p.CLOSE_INTERNAL, p.close_reason("model_fault", str(exc))
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
            batcher.release(slot)
        else:
            code, reason = await session.settle(code, reason)
            session.release()
            await session.close(code, reason)
            state.sessions.pop(session.id, None)
            logger.info("session %s closed", session.id)


RESUME_REFUSALS = {
    auth.ResumeCheck.MALFORMED: (p.CLOSE_RESUME_BAD_TOKEN, "resume_bad_token",
                                 "not a resume token of this deployment (bad signature or format)"),
    auth.ResumeCheck.OTHER_USER: (p.CLOSE_RESUME_OTHER_USER, "resume_other_user",
                                  "this resume token belongs to a session of another user"),
    auth.ResumeCheck.EXPIRED: (p.CLOSE_RESUME_EXPIRED, "resume_expired", "this resume token has expired"),
}


async def take_over(ws: WebSocket, state: ServerState, token: str, protocol: str) -> ResumeState | None:
    """The kept state of the session `token` names, for this connection (speaking `protocol`) to continue; None once
    the socket is closed with the reason it cannot be (the token itself is never logged nor echoed)."""
    resumes = state.resumes
    refusal: tuple[int, str, str] | None = None
    saved = None
    if resumes is None:
        refusal = p.CLOSE_RESUME_UNAVAILABLE, "resume_unavailable", "resume is off on this server"
    else:
        check, session_id = resumes.signer.check(token, ws.query_params.get("user"))
        refusal = RESUME_REFUSALS.get(check)
        if refusal is None and session_id in state.sessions:
            refusal = p.CLOSE_RESUME_IN_USE, "resume_in_use", "that session is still live on this server"
        if refusal is None:
            try:
                saved = await resumes.store.load(session_id)
            except StoreUnavailable as exc:
                resumes.answered(exc)
                refusal = p.CLOSE_RESUME_UNAVAILABLE, "resume_unavailable", "the resume store cannot be reached"
            except ValueError:
                logger.exception("session %s: unreadable resume state", session_id)
        if saved is None and refusal is None:
            refusal = p.CLOSE_RESUME_UNKNOWN, "resume_unknown", "no state is kept for that session (ended or expired)"
        elif saved is not None and saved.protocol != protocol:
            refusal = p.CLOSE_RESUME_UNKNOWN, "resume_unknown", "that session was opened on the other endpoint"
    if refusal is not None:
        state.metrics.sessions.labels(f"refused_{refusal[1]}").inc()
        await ws.close(refusal[0], p.close_reason(*refusal[1:]))
        return None
    return saved
