"""`contextspan bench load`: N real-time streaming clients against a real server on loopback.

Starts `contextspan serve` in a subprocess (or uses `--url`), streams speech from N clients at once for S
seconds, and reports the server's per-frame latency (last input sample of a frame -> its output queued) P50 /
P99 / max from the sessions' stats events, deadline misses, dropped audio, and the server's CPU and RSS.

`--protocol realtime` runs the same sessions over `/v1/realtime` (base64 PCM16 in JSON), `both` runs them over
`/api/chat` (Ogg Opus) and then over `/v1/realtime` on the same server, and reports per protocol the bytes each way,
the client-side lag of every agent frame and the server's ticks, side by side (benchmarks/wire_clients.py).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil

from benchmarks.harness import StreamResult, speak, start_server, stop_server, stream
from benchmarks.report import latency_summary, machine_info, save_json
from benchmarks.wire_clients import SESSIONS, WireResult
from contextspan_client import chat_url, load_wav
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE

CONNECT_S = 3.0  # for every client to connect and get through the handshake before the first one streams
JOIN_FRAMES = 13  # frames between one client's first audio and the next one's
SPEECH = "Hello, this is a load test of the real time voice agent server. What is the weather like in Paris today?"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="contextspan bench load", description=__doc__)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--profile", default="tiny")
    parser.add_argument("--device", default=None, help="the server's --device (default: cuda if available, else cpu)")
    parser.add_argument("--wav", type=Path, help="speech to stream (looped); default: espeak-ng, else a tone")
    parser.add_argument("--url", help="an already running server (http://host:port); CPU/RSS then not measured")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--asr", action=argparse.BooleanOptionalAction, default=True,
                        help="run the server's speech recognition (its default); --no-asr measures the model alone")
    parser.add_argument("--page-ms", type=int, choices=(40, 80), default=80,
                        help="audio per Ogg page the clients send (a browser sends 20 ms; sphn's pages are 40 ms)")
    parser.add_argument("--align-phases", action=argparse.BooleanOptionalAction, default=True,
                        help="the server's --align-phases (it can only act on pages shorter than a frame)")
    parser.add_argument("--phases", choices=("spread", "aligned"), default="spread",
                        help="clients' frame phases: spread evenly over one frame (the hard case for sharing ticks), "
                        "or aligned (all start together, so one tick per frame can serve everyone)")
    parser.add_argument("--protocol", choices=("moshi", "realtime", "both"), default="moshi",
                        help="/api/chat (moshi), /v1/realtime (realtime), or the one then the other, side by side")
    return parser.parse_args(argv)


def speech_pcm(wav: Path | None, seconds: float, workdir: Path) -> np.ndarray:
    if wav is not None:
        pcm = load_wav(str(wav))
    elif shutil.which("espeak-ng"):
        pcm = speak(SPEECH, workdir / "speech.wav")
    else:
        t = np.arange(SAMPLE_RATE * 3) / SAMPLE_RATE
        pcm = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    frames = int(seconds * SAMPLE_RATE / FRAME_SAMPLES)
    return np.resize(pcm, frames * FRAME_SAMPLES).astype(np.float32)


async def drive(url: str, sessions: int, pcm: np.ndarray, pid: int | None,
                spread: bool, page_samples: int) -> tuple[list[StreamResult], dict]:
    samples: dict[str, list[float]] = {"cpu_percent": [], "rss_mb": []}

    async def sample() -> None:
        if pid is None:
            return
        proc = psutil.Process(pid)
        proc.cpu_percent(None)
        while True:
            await asyncio.sleep(1.0)
            samples["cpu_percent"].append(proc.cpu_percent(None))
            samples["rss_mb"].append(proc.memory_info().rss / 2**20)

    # Every client connects at once and starts streaming on a schedule: client k joins 13 frames after client k-1
    # (as sessions join a running server), at the same frame phase (aligned) or a further 1/N of a frame on.
    frame_s = FRAME_SAMPLES / SAMPLE_RATE
    start = time.perf_counter() + CONNECT_S

    async def client(k: int) -> StreamResult:
        at = start + k * (JOIN_FRAMES * frame_s + (frame_s / sessions if spread else 0.0))
        return await stream(chat_url(ws, events=True), pcm, page_samples=page_samples, start_at=at,
                            every_stats=True)

    sampler = asyncio.create_task(sample())
    ws = url.replace("http", "ws", 1)
    try:
        results = await asyncio.gather(*[client(k) for k in range(sessions)])
    finally:
        sampler.cancel()
    return list(results), samples


async def drive_wire(url: str, protocol: str, sessions: int, pcm: np.ndarray, spread: bool,
                     page_samples: int) -> list[WireResult]:
    """The same schedule as `drive`, with the byte-counting clients of one protocol."""
    frame_s = FRAME_SAMPLES / SAMPLE_RATE
    start = time.perf_counter() + CONNECT_S
    ws = url.replace("http", "ws", 1)
    session = SESSIONS[protocol]  # type: ignore[index]
    return list(await asyncio.gather(*[
        session(ws, pcm, page_samples, start + k * (JOIN_FRAMES * frame_s + (frame_s / sessions if spread else 0.0)))
        for k in range(sessions)]))


def histogram_totals(metrics: str, name: str) -> tuple[float, float]:
    total = re.search(rf"^{name}_sum (\S+)", metrics, re.M)
    count = re.search(rf"^{name}_count (\S+)", metrics, re.M)
    return (float(total.group(1)) if total else 0.0), (float(count.group(1)) if count else 0.0)


def phase_mean(before: str, after: str, name: str, scale: float = 1.0) -> float | None:
    """A histogram's mean over what happened between two /metrics readings."""
    (s0, c0), (s1, c1) = histogram_totals(before, name), histogram_totals(after, name)
    return None if c1 == c0 else round((s1 - s0) / (c1 - c0) * scale, 2)


def wire_report(results: list[WireResult], before: str, after: str) -> dict[str, Any]:
    seconds = sum(r.seconds for r in results)
    return {
        "frames_sent": sum(r.frames_sent for r in results),
        "agent_frames_received": sum(r.agent_samples for r in results) // FRAME_SAMPLES,
        "kbytes_per_s_up": round(sum(r.bytes_up for r in results) / seconds / 1e3, 2) if seconds else None,
        "kbytes_per_s_down": round(sum(r.bytes_down for r in results) / seconds / 1e3, 2) if seconds else None,
        "client_lag_ms": latency_summary(np.array([ms for r in results for ms in r.lag_ms])),
        "server_frame_latency_ms": phase_mean(before, after, "contextspan_frame_latency_seconds", 1e3),
        "mean_tick_ms": phase_mean(before, after, "contextspan_tick_seconds", 1e3),
        "mean_batch_size": phase_mean(before, after, "contextspan_batch_size"),
    }


def run_protocols(args: argparse.Namespace, url: str, pcm: np.ndarray) -> dict[str, Any]:
    protocols = ("moshi", "realtime") if args.protocol == "both" else (args.protocol,)
    page_samples = args.page_ms * SAMPLE_RATE // 1000
    found: dict[str, Any] = {}
    for protocol in protocols:
        before = httpx.get(f"{url}/metrics", timeout=5).text
        results = asyncio.run(drive_wire(url, protocol, args.sessions, pcm, args.phases == "spread", page_samples))
        found[protocol] = wire_report(results, before, httpx.get(f"{url}/metrics", timeout=5).text)
    return {"benchmark": "load-protocols", "profile": args.profile, "device": args.device, "sessions": args.sessions,
            "asr": args.asr if not args.url else None, "page_ms": args.page_ms, "phases": args.phases,
            "seconds": args.seconds, "machine": machine_info(), "protocols": found}


def print_protocols(result: dict[str, Any]) -> None:
    print("| protocol | kB/s up | kB/s down | client lag p50 / p99 ms | server frame latency ms | tick ms | "
          "sessions per tick | agent frames / sent |\n|---|---|---|---|---|---|---|---|")
    for protocol, r in result["protocols"].items():
        lag = r["client_lag_ms"]
        print(f"| {protocol} | {r['kbytes_per_s_up']} | {r['kbytes_per_s_down']} | {lag['p50']} / {lag['p99']} | "
              f"{r['server_frame_latency_ms']} | {r['mean_tick_ms']} | {r['mean_batch_size']} | "
              f"{r['agent_frames_received']} / {r['frames_sent']} |")


def histogram_mean(metrics: str, name: str) -> float | None:
    total = re.search(rf"^{name}_sum (\S+)", metrics, re.M)
    count = re.search(rf"^{name}_count (\S+)", metrics, re.M)
    if not (total and count) or float(count.group(1)) == 0:
        return None
    return float(total.group(1)) / float(count.group(1))


def rounded(value: float | None, scale: float = 1.0) -> float | None:
    return None if value is None else round(value * scale, 2)


def report(args: argparse.Namespace, results: list[StreamResult], samples: dict, metrics: str) -> dict[str, Any]:
    latencies = np.array([ms for r in results for s in r.of_type("stats") for ms in s.latency_ms])
    stats = [s for r in results for s in r.of_type("stats")]
    frames_sent = sum(r.frames_sent for r in results)
    return {
        "benchmark": "load",
        "profile": args.profile,
        "device": args.device,
        "sessions": args.sessions,
        "asr": args.asr if not args.url else None,
        "phases": args.phases,
        "page_ms": args.page_ms,
        "align_phases": args.align_phases if not args.url else None,
        "seconds": args.seconds,
        "machine": machine_info(),
        "frames_sent": frames_sent,
        "frames_measured": int(latencies.size),
        "audio_messages_received": sum(r.audio_messages for r in results),
        "latency_ms": latency_summary(latencies),
        "mean_tick_ms": rounded(histogram_mean(metrics, "contextspan_tick_seconds"), 1e3),
        "mean_tick_cpu_ms": rounded(histogram_mean(metrics, "contextspan_tick_cpu_seconds"), 1e3),
        "mean_batch_size": rounded(histogram_mean(metrics, "contextspan_batch_size")),
        "deadline_ms": 80.0,
        "deadline_misses": sum(s.deadline_misses for s in stats),
        "audio_dropped": sum(r.of_type("stats")[-1].audio_dropped for r in results if r.of_type("stats")),
        "input_dropped": sum(r.of_type("stats")[-1].input_dropped for r in results if r.of_type("stats")),
        "server_cpu_percent": {
            "mean": round(float(np.mean(samples["cpu_percent"])), 1) if samples["cpu_percent"] else None,
            "max": round(float(np.max(samples["cpu_percent"])), 1) if samples["cpu_percent"] else None,
        },
        "server_rss_mb": {
            "start": round(samples["rss_mb"][0], 1) if samples["rss_mb"] else None,
            "max": round(max(samples["rss_mb"]), 1) if samples["rss_mb"] else None,
        },
    }


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="contextspan-load-") as tmp:
        workdir = Path(tmp)
        pcm = speech_pcm(args.wav, args.seconds, workdir)
        process = None
        url = args.url
        if url is None:
            process, url = start_server(
                # Exactly the sessions asked for: what the host cannot keep up with shows as deadline misses.
                workdir, "--profile", args.profile, "--max-sessions", str(args.sessions), "--admission", "fixed",
                "--max-connections-per-ip", str(max(8, args.sessions)),  # every client comes from loopback
                "--recordings-dir", str(workdir / "recordings"), "--log-level", "warning",
                "--asr" if args.asr else "--no-asr", "--align-phases" if args.align_phases else "--no-align-phases",
                *(("--device", args.device) if args.device else ()))
        try:
            if args.protocol != "moshi":
                compared = run_protocols(args, url, pcm)
            else:
                results, samples = asyncio.run(drive(url, args.sessions, pcm, process.pid if process else None,
                                                     args.phases == "spread", args.page_ms * SAMPLE_RATE // 1000))
                metrics = httpx.get(f"{url}/metrics", timeout=5).text
        finally:
            if process is not None:
                stop_server(process)
    if args.protocol != "moshi":
        print_protocols(compared)
        save_json(args.json, compared)
        return 0
    result = report(args, results, samples, metrics)
    lat = result["latency_ms"]
    print(f"{args.sessions} sessions x {args.seconds:.0f} s ({args.profile}): frame latency p50 {lat['p50']} ms, "
          f"p99 {lat['p99']} ms, max {lat['max']} ms; deadline misses {result['deadline_misses']} of "
          f"{result['frames_measured']} frames; {result['mean_batch_size']} sessions per tick of "
          f"{result['mean_tick_ms']} ms ({result['mean_tick_cpu_ms']} ms of worker CPU); "
          f"audio dropped {result['audio_dropped']}; server CPU mean "
          f"{result['server_cpu_percent']['mean']} %, RSS max {result['server_rss_mb']['max']} MB")
    save_json(args.json, result)
    return 0
