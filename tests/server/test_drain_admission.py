"""The drain waits for connections still being admitted, so that one admitted as SIGTERM came is refused with 1013
rather than dropped by the exiting process."""

from __future__ import annotations

import asyncio

from server.app.routes import ARRIVAL_SETTLE_S, ServerState
from server.settings import ServerSettings


async def test_a_drain_waits_for_a_connection_being_admitted() -> None:
    state = ServerState(ServerSettings())
    with state.handling():
        drain = asyncio.create_task(state.drain(4.0))
        await asyncio.sleep(ARRIVAL_SETTLE_S * 3)
        assert state.draining and not drain.done(), "the drain ended with a connection under way"
    await asyncio.wait_for(drain, timeout=2.0)
    assert state.handlers == 0


async def test_with_nothing_under_way_a_drain_still_lets_a_handshake_reach_its_handler() -> None:
    state = ServerState(ServerSettings())
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(state.drain(4.0), timeout=2.0)
    assert loop.time() - started >= ARRIVAL_SETTLE_S
