"""The web client in Debian's headless Chromium with a fake microphone fed from an espeak-ng WAV."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .servers import ARTIFACTS, RunningServer

pytestmark = pytest.mark.slow

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
