"""The web client in Debian's headless Chromium with a fake microphone fed from an espeak-ng WAV, and a page that
speaks the wire as Kyutai's Moshi web client does."""

from __future__ import annotations

import base64
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from frontend_model.frame import SAMPLE_RATE
from tests.support.tcp_proxy import tcp_proxy

from .servers import ARTIFACTS, RunningServer

pytestmark = pytest.mark.slow


def test_page_streams_plays_and_shows_text(server: RunningServer, browser: object) -> None:
    from selenium.webdriver.common.by import By

    driver = browser
    driver.get(server.http + "/")  # type: ignore[attr-defined]
    deadline = time.monotonic() + 20
    while "random weights" not in driver.find_element(By.ID, "model").text:  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, "the page never showed the model"
        time.sleep(0.2)
    assert driver.find_element(By.ID, "random-warning").is_displayed()  # type: ignore[attr-defined]
    driver.find_element(By.ID, "name").send_keys("Ada")  # type: ignore[attr-defined]
    driver.find_element(By.ID, "start").click()  # type: ignore[attr-defined]

    stats: dict[str, object] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = driver.execute_script("return window.csStats")  # type: ignore[attr-defined]
        if stats["error"] or (float(stats["playedS"]) > 3.0 and int(stats["textPieces"]) > 5):  # type: ignore[arg-type]
            break
        time.sleep(0.5)
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / "browser.png"))  # type: ignore[attr-defined]
    logs = "\n".join(str(entry) for entry in driver.get_log("browser"))  # type: ignore[attr-defined]
    assert not stats["error"], (stats, logs)
    assert stats["handshake"] and stats["state"] == "live", stats
    assert int(stats["pagesSent"]) > 100, stats  # 20 ms pages from the fake microphone  # type: ignore[arg-type]
    assert int(stats["audioMessages"]) > 30, stats  # type: ignore[arg-type]
    assert float(stats["playedS"]) > 3.0, stats  # type: ignore[arg-type]
    assert driver.find_element(By.ID, "agent").text.strip(), "no agent text on the page"  # type: ignore[attr-defined]
    events = driver.find_element(By.ID, "events").text  # type: ignore[attr-defined]
    assert "ready" in events and "profile sent: Ada" in events, events

    driver.find_element(By.ID, "stop").click()  # type: ignore[attr-defined]
    wav = driver.find_element(By.ID, "wav").get_attribute("href")  # type: ignore[attr-defined]
    assert wav and wav.endswith(".wav")


def page_stats(driver: object, until: Callable[[dict[str, Any]], bool], within_s: float) -> dict[str, Any]:
    """The page's counters once `until` holds of them or the page shows an error; fails after `within_s`."""
    deadline = time.monotonic() + within_s
    while True:
        stats: dict[str, Any] = driver.execute_script("return window.csStats")  # type: ignore[attr-defined]
        if stats["error"] or until(stats):
            return stats
        assert time.monotonic() < deadline, stats
        time.sleep(0.2)


def test_page_resumes_its_session_when_the_connection_drops(server: RunningServer, browser: object) -> None:
    """The page on a proxy that drops every connection once, mid-call: it reopens with its resume token by itself
    (the server's default memory store), keeping its microphone and speaker, and the same session goes on."""
    from selenium.webdriver.common.by import By

    driver = browser
    wait_for_no_session(server)
    with tcp_proxy(int(server.http.rsplit(":", 1)[1])) as proxy:
        driver.get(f"http://127.0.0.1:{proxy.port}/")  # type: ignore[attr-defined]
        page_stats(driver, lambda _: "random weights" in driver.find_element(By.ID, "model").text, 20)  # type: ignore[attr-defined]
        driver.find_element(By.ID, "start").click()  # type: ignore[attr-defined]
        before = page_stats(driver, lambda s: s["state"] == "live" and s["audioMessages"] > 25, 20)
        assert not before["error"], before
        assert proxy.cut() > 0, "the page's socket went through the proxy"
        after = page_stats(driver, lambda s: s["resumes"] == 1 and s["state"] == "live"
                           and s["audioMessages"] > before["audioMessages"] + 25, 20)
        events = driver.find_element(By.ID, "events").text  # type: ignore[attr-defined]
        driver.find_element(By.ID, "stop").click()  # type: ignore[attr-defined]
    assert not after["error"], (after, events)
    assert after["sessionId"] == before["sessionId"], "the same session went on"
    assert f"session {before['sessionId']} resumed" in events and "resuming the session" in events, events


KYUTAI_CLIENT = Path(__file__).with_name("kyutai_client.js")
TAIL_S = 2.0


def wait_for_no_session(server: RunningServer) -> None:
    deadline = time.monotonic() + 30  # a hang guard
    while httpx.get(f"{server.http}/api/info", timeout=5).json()["sessions"]:
        assert time.monotonic() < deadline, "a session never closed"
        time.sleep(0.2)


def test_kyutai_web_client_wire(server: RunningServer, browser: object, speech: np.ndarray) -> None:
    """Kyutai's client throws on any kind but 0x00-0x07 (and on text messages); it sends its sampling parameters,
    waits for the handshake, then two 20 ms Opus packets an Ogg page. The server must decode every packet (the
    recording's user side is as long as what was sent) and answer with audio and text only."""
    driver = browser
    driver.get(server.http + "/")  # type: ignore[attr-defined]  # the server's own origin, as Kyutai's page is
    driver.set_script_timeout(120)  # type: ignore[attr-defined]  # a hang guard
    wait_for_no_session(server)  # an earlier test's session writes its recording as it closes
    before = set(server.recordings.glob("*.wav"))
    pcm = base64.b64encode(speech.astype("<f4").tobytes()).decode()
    result = driver.execute_async_script(KYUTAI_CLIENT.read_text(), pcm, 1234, 5678, TAIL_S)  # type: ignore[attr-defined]
    logs = "\n".join(str(entry) for entry in driver.get_log("browser"))  # type: ignore[attr-defined]
    assert "error" not in result, (result, logs)
    assert result["thrown"] == [], result
    assert set(result["kinds"]) <= {"handshake", "audio", "text"} and result["kinds"]["handshake"] == 1, result
    assert result["pagesSent"] == 2 + (result["packets"] + 1) // 2, result
    assert result["kinds"]["audio"] > 30 and result["audioBytes"] > 0, result
    assert result["kinds"].get("text", 0) > 0 and result["text"].strip(), result

    wait_for_no_session(server)  # the recording is complete once the session is gone
    (wav,) = set(server.recordings.glob("*.wav")) - before
    with wave.open(str(wav)) as w:
        user = np.frombuffer(w.readframes(w.getnframes()), np.int16).reshape(-1, 2)[:, 0] / 32768.0
    sent_s = result["packets"] * 0.02
    # Every frame the server stepped came from the client: a decoder that took one packet a page would hold half.
    assert len(user) / SAMPLE_RATE > 0.9 * sent_s - 0.2, (len(user) / SAMPLE_RATE, sent_s)
    speech_part = user[: len(speech)]
    assert np.sqrt(np.mean(speech_part**2)) > 0.3 * np.sqrt(np.mean(speech**2)), "the speech did not come through"
