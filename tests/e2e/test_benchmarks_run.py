"""The benchmark commands still run end to end and write the report benchmarks/README.md quotes; their numbers are not
checked here (performance lives in benchmarks/results/, measured on purpose, not in tests)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import pytest
import torch

from benchmarks.harness import start_server

pytestmark = pytest.mark.slow


def bench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "server.cli", "bench", *args], check=True, timeout=300)


def test_bench_batch_reports_every_batch_size(tmp_path: Path) -> None:
    out = tmp_path / "batch.json"
    bench("batch", "--sessions", "1,2", "--ticks", "4", "--rounds", "2", "--span-frames", "4", "--json", str(out))
    report = json.loads(out.read_text())
    assert [row["sessions"] for row in report["rows"]] == [1, 2]
    for row in report["rows"]:
        assert row["tick"]["p50_ms"] > 0 and row["tick_with_span"]["p50_ms"] > 0
    assert report["rows"][0]["p50_vs_one_session"] == 1.0


def test_bench_gc_times_full_collections_of_the_loaded_server_with_what_it_loaded_frozen_and_not(
    tmp_path: Path
) -> None:
    out = tmp_path / "gc.json"
    bench("gc", "--repeats", "2", "--ballast", "100000", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["frozen_objects"] > 100000
    assert report["frozen"]["objects_walked"] < report["unfrozen"]["objects_walked"] - 100000
    assert all(report[way]["median_ms"] > 0 for way in ("frozen", "unfrozen"))


def test_bench_window_rolls_a_session_past_its_context_ahead_or_in_the_tick_and_compares_it_with_sliding(
        tmp_path: Path) -> None:
    out = tmp_path / "window.json"
    bench("window", "--context", "96", "--frames", "110", "--paced", "30", "--json", str(out))
    ahead, in_tick, slide = json.loads(out.read_text())["runs"]
    assert ahead["refill"] == "ahead" and ahead["rolls"] > 0 and ahead["rolls_in_tick"] == 0
    assert ahead["build_chunk"]["p50_ms"] > 0 and ahead["roll"]["p50_ms"] > 0
    assert in_tick["refill"] == "in-tick" and in_tick["rolls"] == in_tick["rolls_in_tick"] > 0
    for keep in (ahead, in_tick):
        assert keep["window"] == "keep-prefix" and keep["final_offset"] <= 96 < slide["final_offset"]
    assert slide["rolls"] == 0


def test_bench_resume_resumes_a_killed_replicas_session_on_the_other(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    out = tmp_path / "resume.json"
    bench("resume", "--minutes", "0.1", "--json", str(out))
    (run,) = json.loads(out.read_text())["runs"]
    assert run["resumed_frames"] == run["frames_sent"] == 75 and run["state_bytes"] > 0
    assert run["replay_ms"] > 0 and 0 < run["kill_to_handshake_ms"] < run["kill_to_first_audio_ms"]


@pytest.mark.parametrize(("phases", "page_ms"), [("spread", "80"), ("aligned", "40")])
def test_bench_load_measures_every_frame(tmp_path: Path, phases: str, page_ms: str) -> None:
    out = tmp_path / "load.json"
    bench("load", "--sessions", "2", "--seconds", "3", "--no-asr", "--phases", phases, "--page-ms", page_ms,
          "--json", str(out))
    report = json.loads(out.read_text())
    assert report["phases"] == phases and report["sessions"] == 2 and report["page_ms"] == int(page_ms)
    # Every frame sent is timed: a client stays until the server's stats have timed all it answered, on any host.
    assert report["frames_measured"] == report["frames_sent"] == 2 * 37
    assert report["mean_batch_size"] is not None and 1 <= report["mean_batch_size"] <= 2
    # The worker thread's CPU time in a tick is measured, and a thread cannot use more CPU than the tick lasted.
    assert 0 < report["mean_tick_cpu_ms"] <= report["mean_tick_ms"] * 1.01 + 0.1
    assert report["server_rss_mb"]["max"] is not None


def test_bench_load_serves_the_personaplex_family(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    bench("load", "--profile", "tiny-personaplex", "--sessions", "2", "--seconds", "3", "--no-asr", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["profile"] == "tiny-personaplex" and report["sessions"] == 2
    assert report["frames_measured"] == report["frames_sent"] == 2 * 37


def test_bench_faults_reports_each_scenario(tmp_path: Path) -> None:
    out = tmp_path / "faults.json"
    bench("faults", "--seconds", "8", "--scenarios", "no fault,LLM HTTP 500", "--json", str(out))
    rows = {row["scenario"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {"no fault", "LLM HTTP 500"}
    for row in rows.values():
        assert row["sessions_kept"] == 2 and row["frames"] == 2 * 100  # as in the load test above
        # Each session's `<ret>` has an outcome (which one depends on how fast this machine's Whisper is).
        assert row["spans_injected"] + sum(row["spans_dropped"].values()) == 2, row


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a device that cannot load")
def test_bench_load_fails_fast_when_the_model_cannot_load(tmp_path: Path) -> None:
    """A model that cannot load on the asked device ends the bench at once with the reason, not after the 300 s
    readiness wait; with --wait-for-model the server stays up and /readyz carries the error instead."""
    done = subprocess.run([sys.executable, "-m", "server.cli", "bench", "load", "--device", "cuda:0", "--seconds", "1",
                           "--no-asr"], capture_output=True, text=True, timeout=240)
    assert done.returncode != 0 and "CUDA" in done.stderr
    with pytest.raises(RuntimeError, match=r"could not load its model: .*CUDA"):
        start_server(tmp_path, "--device", "cuda:0", "--wait-for-model", "--no-asr", ready_timeout=240)


def test_bench_load_compares_both_protocols_side_by_side(tmp_path: Path) -> None:
    out = tmp_path / "protocols.json"
    bench("load", "--protocol", "both", "--sessions", "2", "--seconds", "3", "--no-asr", "--json", str(out))
    report = json.loads(out.read_text())
    assert set(report["protocols"]) == {"moshi", "realtime"}
    for row in report["protocols"].values():
        assert row["frames_sent"] == 2 * 37 and row["agent_frames_received"] > 0
        assert row["kbytes_per_s_up"] > 0 and row["kbytes_per_s_down"] > 0 and row["client_lag_ms"]["p50"] > 0
    # Base64 PCM16 (48 kB/s of samples, 4/3 of that in base64) against Opus: more bytes, whatever the host's speed.
    assert report["protocols"]["realtime"]["kbytes_per_s_up"] > 4 * report["protocols"]["moshi"]["kbytes_per_s_up"]


def test_bench_asks_reports_every_room_statements_and_questions_and_a_lower_ret_logit_asks_less(
        tmp_path: Path) -> None:
    """On the training sentences (`--split train`): the held-out split differs only in what it draws, and each run
    spends over a minute encoding its rooms (one run, not one per split)."""
    from frontend_model.training.served import PROFILES

    out = tmp_path / "asks.json"
    bench("asks", "--split", "train", "--statements", "2", "--questions", "2", "--follow-ups", "1", "--json", str(out))
    report = json.loads(out.read_text())
    assert report["split"] == "train" and report["set"] == "development (train recipes, not the test set)"
    rows = report["rows"]
    assert rows[0]["ret_logit_shift"] == 0 and all(a["ret_logit_shift"] > b["ret_logit_shift"]
                                                   for a, b in pairwise(rows))
    for row in rows:
        assert list(row["rets_per_min_by_room"]) == [p.name for p in PROFILES]
        assert all(0 <= row[key] <= 1 for key in ("asks_per_statement", "questions_asked", "follow_ups_asked"))
    offsets = report["ret_chance_by_offset"]
    assert all(len(offsets[kind]) == len(offsets["from"]) and all(0 <= c <= 1 for c in offsets[kind])
               for kind in ("statements", "questions"))
    for key in ("rets_per_min_rooms", "asks_per_statement", "questions_asked", "follow_ups_asked"):
        assert all(a[key] >= b[key] for a, b in pairwise(rows)), key
    heard = report["heard"]
    assert heard["distinct_codes_by_codebook"] and heard["speech_frames"] > 0
    codes = heard["distinct_codes_by_codebook"]
    assert all(1 <= n <= heard["distinct_frames"] <= heard["speech_frames"] for n in codes)
