"""Settings come from CONTEXTSPAN_* env vars and from CLI flags of the same names; flags win."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from server.cli import add_settings_flags, settings_from_args


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    return parser.parse_args(argv)


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONTEXTSPAN_PORT", "9100")
    monkeypatch.setenv("CONTEXTSPAN_RECORDINGS", "false")
    settings = settings_from_args(parse([]))
    assert (settings.port, settings.recordings, settings.host) == (9100, False, "127.0.0.1")
    settings = settings_from_args(parse(["--port", "9200", "--recordings", "--recordings-dir", "/tmp/r"]))
    assert (settings.port, settings.recordings, settings.recordings_dir) == (9200, True, Path("/tmp/r"))


def test_profile_defaults_follow_the_device() -> None:
    settings = settings_from_args(parse([]))
    assert settings.resolved_profile(cuda_available=False) == ("tiny", None)
    assert settings.resolved_profile(cuda_available=True) == ("moshi", "kyutai/moshiko-pytorch-bf16")
    assert settings.max_sessions == 2
    pinned = settings_from_args(parse(["--profile", "moshi-7b", "--max-sessions", "3"]))
    assert pinned.resolved_profile(cuda_available=False) == ("moshi-7b", None)
    assert pinned.max_sessions == 3
