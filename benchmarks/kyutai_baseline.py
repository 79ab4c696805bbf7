"""`contextspan bench kyutai`: the anchor. Kyutai's server (moshi 0.2.13 `moshi.server`) does this per frame for its one
session: Mimi encode of 1920 samples, `LMGen.step` (CUDA-graphed on a GPU, as moshi builds it), Mimi decode of the
agent codes. Run here as that server runs it (`streaming_forever(1)`, its four warm-up frames, its sampling settings),
on the same random model our batch benchmarks step, so that the ratio of frames per second per GPU, ours over
Kyutai's, is measured side by side in one run (scripts/gpu_check.py puts the two together).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi.models.lm import LMGen

from benchmarks.report import machine_info, save_json
from benchmarks.span_latency import summarise
from frontend_model.engine.calibration import device_sync, time_call
from frontend_model.frame import FRAME_S, FRAME_SAMPLES
from frontend_model.loading.loader import load_model

KYUTAI_WARM_FRAMES = 4  # moshi.server.ServerState.warmup


def measure(profile: str, device: str | None, frames: int, reduced: bool) -> dict[str, Any]:
    model = load_model(profile, device=device, reduced=reduced)
    lm_gen = LMGen(model.lm, use_sampling=True, temp=0.8, temp_text=0.7, top_k=250, top_k_text=25)
    mimi, sync = model.mimi, device_sync(model.device)
    mimi.streaming_forever(1)
    lm_gen.streaming_forever(1)
    pcm = torch.from_numpy((0.1 * np.random.default_rng(0).standard_normal(FRAME_SAMPLES)).astype(np.float32))
    chunk = pcm.to(model.device)[None, None]

    def frame() -> None:
        with torch.no_grad():
            codes = mimi.encode(chunk)
            for c in range(codes.shape[-1]):
                tokens = lm_gen.step(codes[:, :, c : c + 1])
                if tokens is not None:
                    mimi.decode(tokens[:, 1:])

    for _ in range(KYUTAI_WARM_FRAMES):
        frame()
    samples = [time_call(frame, sync) for _ in range(frames)]
    summary = summarise(samples)
    return {"benchmark": "kyutai", "profile": profile, "reduced": reduced, "dtype": str(model.lm.dtype),
            "graphs": model.device.type == "cuda", "machine": machine_info(str(model.device)), "frame": summary,
            "sessions": 1, "frames_per_s": 1000.0 / summary["mean_ms"], "real_time": summary["p99_ms"] < 1000 * FRAME_S}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench kyutai", description=__doc__)
    parser.add_argument("--profile", default="moshi-7b", choices=["tiny", "moshi-7b"])
    parser.add_argument("--device", default=None)
    parser.add_argument("--reduced", action="store_true", help="moshi-7b at tiny widths (CPU CI)")
    parser.add_argument("--frames", type=int, default=200, help="frames timed after the warm-up")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = measure(args.profile, args.device, args.frames, args.reduced)
    f = result["frame"]
    print(f"Kyutai's frame (encode + LMGen.step + decode, batch 1, graphs {result['graphs']}): median "
          f"{f['p50_ms']:.2f} ms, P99 {f['p99_ms']:.2f} ms, {result['frames_per_s']:.0f} frames/s", flush=True)
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
