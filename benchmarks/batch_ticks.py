"""`contextspan bench batch`: cost of one batched tick (Mimi encode + LM step + Mimi decode for B sessions), P50 /
P99 per batch size, without and with one span injected per tick."""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.report import add_max_span_flag, machine_info, save_json
from benchmarks.span_latency import span_of_frames, summarise
from frontend_model.engine.batch_engine import BatchEngine
from frontend_model.engine.calibration import device_sync, time_call
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.codec import BatchFrameCodec
from frontend_model.engine.engine import GREEDY
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import PROFILES
from frontend_model.training.profile import profile_checkpoint
from server.settings import ServerSettings

WARM_TICKS = 5


def measure(model: LoadedModel, slots: int, ticks: int, span_frames: int, max_span: int,
            prefill: SpanPrefill = SpanPrefill.ONE_PASS) -> list[float]:
    sync = device_sync(model.device)
    rng = np.random.default_rng(slots)
    pcm = (0.1 * rng.standard_normal((slots, FRAME_SAMPLES))).astype(np.float32)
    active = torch.ones(slots, dtype=torch.bool)
    block = span_of_frames(model, span_frames) if span_frames else None
    codec = BatchFrameCodec(model.mimi, slots)
    codec.open()
    try:
        with BatchEngine(model, slots, GREEDY, max_span_frames=max_span, prefill=prefill) as engine:
            tick_no = 0

            def tick() -> None:
                nonlocal tick_no
                if block is not None and tick_no > 0:
                    engine.inject_slot(tick_no % slots, block)
                outs = engine.step_slots(codec.encode(pcm, active), active)
                codes = torch.stack([o.agent_codes if o and o.agent_codes is not None
                                     else torch.zeros(8, dtype=torch.long) for o in outs])
                codec.decode(codes, active)
                tick_no += 1

            for _ in range(WARM_TICKS):
                tick()
            return [time_call(tick, sync) for _ in range(ticks)]
    finally:
        codec.close()


def release(model: LoadedModel) -> None:
    """The last batch's rings and graphs given back before the next size allocates its own."""
    gc.collect()
    if model.device.type == "cuda":
        torch.cuda.empty_cache()


def device_memory(model: LoadedModel) -> dict[str, float] | None:
    """GiB the device holds now and held at most since the last call: a size that does not fit says why (the rings
    themselves, or memory an earlier size kept)."""
    if model.device.type != "cuda":
        return None
    memory = {"peak_gib": torch.cuda.max_memory_allocated(model.device) / 2**30,
              "allocated_gib": torch.cuda.memory_allocated(model.device) / 2**30}
    torch.cuda.reset_peak_memory_stats(model.device)
    return memory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench batch", description=__doc__)
    parser.add_argument("--profile", default="tiny", choices=PROFILES)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--reduced", action="store_true",
                        help="random profiles at tiny widths, with their real vocabulary, codebooks, delays (CPU CI)")
    parser.add_argument("--context", type=int, default=None, help="override the LM context, in frames")
    parser.add_argument("--sessions", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16],
                        help="batch sizes, measured in this order: largest first, the first that fits the device "
                        "is found on a device no earlier size has used")
    parser.add_argument("--span-frames", type=int, default=64, help="frames of the span injected per tick")
    parser.add_argument("--ticks", type=int, default=100, help="ticks measured per batch size, over all rounds")
    parser.add_argument("--rounds", type=int, default=4,
                        help="sweeps over the batch sizes, each measuring its share of the ticks: a host that slows "
                        "down for a while then weighs on every size alike, so their ratios stay fair")
    parser.add_argument("--torch-threads", type=int, default=ServerSettings().torch_threads,
                        help="torch CPU threads, as the server's --torch-threads (default: the server's default)")
    parser.add_argument("--prefill", choices=[SpanPrefill.ONE_PASS.value, SpanPrefill.CHUNKED.value],
                        default=SpanPrefill.ONE_PASS.value,
                        help="write the span in one pass, or in power-of-two chunks on the scratch row (graphed on a "
                        "GPU)")
    add_max_span_flag(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.span_frames > args.max_span_frames:
        parser.error(f"--span-frames {args.span_frames} is over --max-span-frames {args.max_span_frames}")
    torch.set_num_threads(args.torch_threads)
    model = load_model(args.profile, profile_checkpoint(args.profile, args.checkpoint), device=args.device,
                       context=args.context, reduced=args.reduced)
    per_round = max(1, args.ticks // args.rounds)
    samples: dict[tuple[int, int], list[float]] = {}
    memory: dict[int, dict[str, float] | None] = {}
    sizes, out_of_memory = list(args.sessions), None
    device_memory(model)
    for done in range(args.rounds):
        print(f"round {done + 1} of {args.rounds}", file=sys.stderr, flush=True)
        for slots in list(sizes):
            if slots not in sizes:  # out of memory at a smaller size earlier in this round
                continue
            try:
                for frames in (0, args.span_frames):
                    measured = measure(model, slots, per_round, frames, args.max_span_frames,
                                       SpanPrefill(args.prefill))
                    samples.setdefault((slots, frames), []).extend(measured)
            except torch.OutOfMemoryError as exc:
                # The device holds no more sessions' rings: this size and the larger ones are reported as such.
                out_of_memory = {"sessions": slots, "error": str(exc)[:600]}
                print(f"{slots} sessions: out of memory, larger sizes skipped: {exc}", file=sys.stderr, flush=True)
                sizes = [s for s in sizes if s < slots]
            finally:
                release(model)
                memory[slots] = device_memory(model)
                print(f"{slots} sessions: device memory {memory[slots]}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    print(f"{'B':>4} | tick P50 (ms) | tick P99 (ms) | +span({args.span_frames}) P50 | +span P99")
    for slots in sorted(sizes):
        plain = summarise(samples[(slots, 0)])
        spanned = summarise(samples[(slots, args.span_frames)])
        rows.append({"sessions": slots, "tick": plain, "tick_with_span": spanned, "memory": memory.get(slots)})
        print(f"{slots:>4} | {plain['p50_ms']:13.2f} | {plain['p99_ms']:13.2f} | {spanned['p50_ms']:14.2f} | "
              f"{spanned['p99_ms']:9.2f}", flush=True)
    base = next((r["tick"]["p50_ms"] for r in rows if r["sessions"] == 1), None)
    for row in rows:
        row["p50_vs_one_session"] = row["tick"]["p50_ms"] / base if base else None
    save_json(args.json, {"benchmark": "batch", "profile": args.profile, "span_frames": args.span_frames,
                          "prefill": args.prefill,
                          "max_span_frames": args.max_span_frames,
                          "rounds": args.rounds,
                          "machine": machine_info(str(model.device)), "rows": rows,
                          "out_of_memory": out_of_memory, "memory_at_out_of_memory": memory.get(
                              out_of_memory["sessions"]) if out_of_memory else None})
    return 0


if __name__ == "__main__":
    sys.exit(main())
