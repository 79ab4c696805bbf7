"""What the benchmarks and the tests share to drive real servers: start one on a free loopback port, stream speech to
it at the frame clock and collect what comes back, make speech with espeak-ng. Never part of the client library
(`contextspan_client`), which app authors install."""

from benchmarks.harness.servers import free_port, start_server, stop_server, wait_ready
from benchmarks.harness.speech import speak
from benchmarks.harness.streaming import DRAIN_LIMIT_S, StreamResult, stream

__all__ = ["DRAIN_LIMIT_S", "StreamResult", "free_port", "speak", "start_server", "stop_server", "stream", "wait_ready"]
