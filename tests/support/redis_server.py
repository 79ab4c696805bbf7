"""The private redis-server of benchmarks/harness for the resume store's tests: skipped where it is not installed."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.harness import redis_server as harness
from benchmarks.harness.redis_server import RedisServer

__all__ = ["RedisServer", "redis_server"]


@contextlib.contextmanager
def redis_server(folder: Path) -> Iterator[RedisServer]:
    try:
        with harness.redis_server(folder) as server:
            yield server
    except harness.RedisMissing as exc:
        pytest.skip(str(exc))
