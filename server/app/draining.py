"""uvicorn, with a drain before its shutdown: on SIGTERM live sessions get `shutdown_grace_s` to end.

Plain uvicorn closes every WebSocket at once (1012) on SIGTERM; a rolling restart would cut every caller off
mid-sentence. Here the first SIGTERM or Ctrl-C starts the drain (new sessions are refused with 1013, /readyz
turns 503, live ones are told and closed by the deadline, recordings flushed) and a second one exits at once.

A model that fails to load stops the server with exit status 1 (unless `wait_for_model`), so that a container
orchestrator sees the failure instead of a server that answers 1013 forever.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from server.settings import ServerSettings

logger = logging.getLogger(__name__)


def websocket_config(settings: ServerSettings) -> dict[str, Any]:
    """uvicorn's WebSocket options. Its pings are what a binary Moshi client gets while its session prefills: a
    control frame that browsers and websockets clients answer on their own and that never reaches the page, so a
    client waiting for the handshake hears from the server every `keepalive_s` and understands all it hears."""
    return {"ws": "websockets-sansio", "ws_max_size": settings.max_message_bytes,
            "ws_ping_interval": settings.keepalive_s, "ws_ping_timeout": settings.keepalive_timeout_s}


class DrainingServer(uvicorn.Server):
    def __init__(self, app: FastAPI, settings: ServerSettings) -> None:
        config = uvicorn.Config(
            app, host=settings.host, port=settings.port, log_level=settings.log_level, log_config=None,
            lifespan="on", **websocket_config(settings),
            proxy_headers=True, forwarded_allow_ips=settings.trusted_proxies,
            timeout_graceful_shutdown=max(1.0, settings.shutdown_grace_s),
        )
        super().__init__(config)
        self.app = app
        self.grace_s = settings.shutdown_grace_s
        self.wait_for_model = settings.wait_for_model
        self.exit_code = 0
        self._draining = False
        self._tasks: set[asyncio.Task[None]] = set()

    async def on_tick(self, counter: int) -> bool:
        """uvicorn calls this every 0.1 s; True stops the server."""
        load_error = self.app.state.server.load_error
        if load_error is not None and not self.wait_for_model and not self.exit_code:
            logger.error("exiting: the model did not load: %s (--wait-for-model keeps the server up)", load_error)
            self.exit_code = 1
        return self.exit_code != 0 or await super().on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._draining = True
        logger.info("%s: draining sessions for up to %.1f s (send it again to stop at once)",
                    signal.Signals(sig).name, self.grace_s)
        # A signal handler interrupts the loop mid-callback: schedule the drain rather than start it here.
        asyncio.get_event_loop().call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        task = asyncio.get_running_loop().create_task(self._drain_then_exit())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _drain_then_exit(self) -> None:
        try:
            await self.app.state.server.drain(self.grace_s)
        finally:
            self.should_exit = True
