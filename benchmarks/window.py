"""`contextspan bench window`: a long session past the model's context, as the batcher serves it (its window kept
before each tick, server/batching/window_keeper.py, then the batched tick): what a roll costs in its tick (P50 / P99
ms), what a chunk of a window built ahead costs in its, and how many frames come out late at the frame clock; built
ahead, refilled in the tick, and the same session left to slide, side by side."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import add_max_span_flag, machine_info, save_json
from benchmarks.span_latency import summarise
from frontend_model.engine.batch_model import BatchedModel
from frontend_model.engine.calibration import device_sync
from frontend_model.engine.engine import GREEDY
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import PROFILES
from frontend_model.training.profile import profile_checkpoint
from server.batching.window_keeper import WindowWork, keep_window
from server.batching.window_policy import WindowPolicy
from server.session.persona import build_persona_block, persona_and_voice
from server.settings import ServerSettings

SHORT_PERSONA = "You are a helpful travel assistant called Ada."


def long_session(model: LoadedModel, policy: WindowPolicy | None, refill: str, persona: str, voice: str | None,
                 frames: int, paced: int, deadline_s: float, max_span: int) -> dict[str, Any]:
    """One session of `frames` frames; the last `paced` of them arrive at the frame clock (the first ones are
    stepped back to back, to bring a big model's session near its context quickly). `refill`: ahead (a shadow row)
    or in-tick."""
    sync = device_sync(model.device)
    text, voice = persona_and_voice(model, persona, voice)
    prefix = build_persona_block(model, text, voice, max_span)
    prefix_frames = prefix.frames if prefix is not None else 0
    pcm = (0.1 * np.random.default_rng(0).standard_normal((frames, FRAME_SAMPLES))).astype(np.float32)
    batched = BatchedModel(model, 1, GREEDY, max_span_frames=max_span, record=policy is not None)
    batched.start()
    rolls, builds, ticks, latencies, keeps = [], [], [], [], set()
    late = late_at_window = in_tick = 0
    try:
        if policy is not None and refill == "ahead":
            batched.build_windows_ahead(policy.ahead_chunk(1, 1 << (max_span.bit_length() - 1)))
        batched.warm_up()
        batched.open_slot(0, prefix)
        t0 = time.perf_counter() - (frames - paced) * FRAME_S
        for i in range(frames):
            arrived = t0 + (i + 1) * FRAME_S  # a frame's last sample: where its deadline starts
            if i >= frames - paced:
                time.sleep(max(0.0, arrived - time.perf_counter()))
            start = time.perf_counter()
            offset = batched.offsets()[0]
            work = (keep_window(batched, policy, 0, offset, prefix_frames, 1, lambda slot: True)
                    if policy is not None else WindowWork(False, False, None))
            sync()
            if work.rolled:
                rolls.append(time.perf_counter() - start)
                keeps.add(batched.offsets()[0] - prefix_frames)
                in_tick += work.in_tick
            if work.build_s is not None and not work.rolled:
                builds.append(time.perf_counter() - start)
            tick_start = time.perf_counter()
            batched.tick({0: pcm[i]})
            sync()
            done = time.perf_counter()
            ticks.append(done - tick_start)
            if i >= frames - paced:
                latencies.append(done - arrived)
                if done - arrived > deadline_s:
                    late += 1
                    late_at_window += work.rolled or work.build_s is not None
        offset = batched.offsets()[0]
    finally:
        batched.close()
    return {"window": "keep-prefix" if policy is not None else "slide", "refill": refill if policy else None,
            "prefix_frames": prefix_frames, "keeps_prefix": policy is not None and policy.keeps_prefix(prefix_frames),
            "frames": frames, "paced_frames": paced, "final_offset": offset, "rolls": len(rolls),
            "rolls_in_tick": in_tick, "keep_frames": sorted(keeps), "roll": summarise(rolls) if rolls else None,
            "build_chunk": summarise(builds) if builds else None, "tick": summarise(ticks),
            "frame_latency": summarise(latencies) if latencies else None, "late_frames": late,
            "late_frames_at_a_roll_or_build": late_at_window}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench window", description=__doc__)
    parser.add_argument("--profile", default="tiny", choices=PROFILES)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--reduced", action="store_true", help="random profiles at tiny widths (CPU)")
    parser.add_argument("--context", type=int, default=None, help="override the LM context, in frames")
    parser.add_argument("--persona", default=SHORT_PERSONA, help="the session's persona; '' for the checkpoint's own")
    parser.add_argument("--voice", default=None, help="a voice prompt of the checkpoint (default: its own, if any)")
    parser.add_argument("--frames", type=int, default=1500, help="frames in the session (1500 = 2 minutes)")
    parser.add_argument("--paced", type=int, default=None, help="the last frames, at the frame clock (default: all)")
    parser.add_argument("--torch-threads", type=int, default=ServerSettings().torch_threads)
    add_max_span_flag(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    model = load_model(args.profile, profile_checkpoint(args.profile, args.checkpoint), device=args.device,
                       context=args.context, reduced=args.reduced)
    policy = WindowPolicy.for_context(model.span.context)
    deadline_s = ServerSettings().deadline_ms / 1e3
    paced = args.frames if args.paced is None else args.paced
    runs = [long_session(model, window, refill, args.persona, args.voice, args.frames, paced, deadline_s,
                         args.max_span_frames)
            for window, refill in ((policy, "ahead"), (policy, "in-tick"), (None, "-"))]
    print(f"context {model.span.context} frames, headroom {policy.headroom}, prefix {runs[0]['prefix_frames']} "
          f"frames, kept after the prefix {runs[0]['keep_frames']} (ahead), {runs[1]['keep_frames']} (in the tick)")
    print(f"{'window':>21} | rolls | in tick | roll P50 / P99 (ms) | chunk P50 / P99 (ms) | tick P50 (ms) | "
          "frame P99 (ms) | late | late at a roll or chunk")
    nan = {"p50_ms": float("nan"), "p99_ms": float("nan")}
    for run in runs:
        roll, chunk = run["roll"] or nan, run["build_chunk"] or nan
        frame = run["frame_latency"] or nan
        name = run["window"] + (f" ({run['refill']})" if run["refill"] else "")
        print(f"{name:>21} | {run['rolls']:5d} | {run['rolls_in_tick']:7d} | {roll['p50_ms']:8.2f} / "
              f"{roll['p99_ms']:8.2f} | {chunk['p50_ms']:9.2f} / {chunk['p99_ms']:8.2f} | {run['tick']['p50_ms']:13.2f}"
              f" | {frame['p99_ms']:14.2f} | {run['late_frames']:4d} | {run['late_frames_at_a_roll_or_build']:d}",
              flush=True)
    save_json(args.json, {"benchmark": "window", "profile": args.profile, "context": model.span.context,
                          "headroom": policy.headroom, "persona": args.persona, "voice": args.voice,
                          "max_span_frames": args.max_span_frames, "deadline_ms": deadline_s * 1e3,
                          "machine": machine_info(str(model.device)), "load_average": os.getloadavg(),
                          "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
