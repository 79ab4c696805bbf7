"""Fixtures: a real server per module, real speech per session, a headless Chromium."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contextspan_client import load_wav

from .servers import RunningServer, espeak_wav, start_server, stop_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # No test of this server needs Whisper, which would only take CPU from the sessions on a small host.
    running = start_server(tmp_path_factory.mktemp("server"), "--max-sessions", "2", "--no-asr")
    yield running
    stop_server(running)


@pytest.fixture(scope="session")
def speech_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return espeak_wav(
        tmp_path_factory.mktemp("speech") / "speech.wav",
        "Hello, this is a test of the real time voice agent server. What is the weather like in Paris today?",
    )


@pytest.fixture(scope="session")
def speech(speech_path: Path) -> np.ndarray:
    """About 5.7 s of espeak-ng speech at 24 kHz."""
    return load_wav(str(speech_path))


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser(speech_path: Path, tmp_path: Path) -> Iterator[object]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.skip("Debian chromium and chromium-driver are not installed")
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                 f"--use-file-for-fake-audio-capture={speech_path}", "--autoplay-policy=no-user-gesture-required",
                 f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1280,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
