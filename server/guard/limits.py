"""Per-connection and per-address limits, as plain classes with an injectable clock."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class RateLimiter:
    """A token bucket: `rate` messages a second on average, bursts up to `burst`."""

    rate: float
    burst: float
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _last: float = field(init=False)

    def __post_init__(self) -> None:
        self._tokens = self.burst
        self._last = self.clock()

    def allow(self) -> bool:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


@dataclass
class ConnectionsPerAddress:
    """Open WebSockets per client address; `enter` refuses over `limit`, `leave` must follow every success."""

    limit: int
    _open: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, address: str) -> bool:
        with self._lock:
            if self._open[address] >= self.limit:
                return False
            self._open[address] += 1
            return True

    def leave(self, address: str) -> None:
        with self._lock:
            self._open[address] -= 1
            if self._open[address] <= 0:
                del self._open[address]

    def count(self, address: str) -> int:
        with self._lock:
            return self._open[address]


@dataclass
class AbuseCounter:
    """Bad messages in a sliding window; a client past `limit` of them is misbehaving, not unlucky."""

    limit: int
    window_s: float = 10.0
    clock: Callable[[], float] = time.monotonic
    _times: list[float] = field(default_factory=list)

    def record(self) -> bool:
        """Counts one bad message; True once the window holds more than `limit`."""
        now = self.clock()
        self._times = [t for t in self._times if now - t < self.window_s]
        self._times.append(now)
        return len(self._times) > self.limit
