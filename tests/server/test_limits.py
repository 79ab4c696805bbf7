"""Rate, per-address and abuse limits with a fake clock."""

from __future__ import annotations

from server.guard.limits import AbuseCounter, ConnectionsPerAddress, RateLimiter


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_allows_bursts_then_the_average_rate() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=10, burst=20, clock=clock)
    assert all(limiter.allow() for _ in range(20))
    assert not limiter.allow()
    clock.now += 1.0
    assert sum(limiter.allow() for _ in range(30)) == 10
    clock.now += 100.0
    assert sum(limiter.allow() for _ in range(30)) == 20, "idle time refills only up to the burst"


def test_a_steady_client_at_the_rate_is_never_limited() -> None:
    clock = FakeClock()
    limiter = RateLimiter(rate=100, burst=200, clock=clock)
    for _ in range(10_000):
        clock.now += 0.01
        assert limiter.allow()


def test_connections_per_address() -> None:
    limits = ConnectionsPerAddress(limit=2)
    assert limits.enter("a") and limits.enter("a") and not limits.enter("a")
    assert limits.enter("b")
    limits.leave("a")
    assert limits.count("a") == 1 and limits.enter("a")
    for address in ("a", "a", "b"):
        limits.leave(address)
    assert limits.count("a") == 0 and limits.count("b") == 0


def test_abuse_counter_is_a_sliding_window() -> None:
    clock = FakeClock()
    abuse = AbuseCounter(limit=3, window_s=10, clock=clock)
    assert not any(abuse.record() for _ in range(3))
    assert abuse.record()
    clock.now += 11
    assert not abuse.record(), "old errors age out"
