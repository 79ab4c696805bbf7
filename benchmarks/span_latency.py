"""`contextspan bench span`: the paper's Table 1 (span prefill + one step per span length n).

Per n: one-pass injection + the next step (mean +- std, P99), the same span in power-of-two chunks on the scratch row
(graphed on a GPU) + the next step and the max abs difference of its next-step text logits from one pass, and the same
span columns fed one by one (T=1 each) with the speed-up of one pass over them and their logit difference.
Also the cost of one whole frame (Mimi encode + LM step + Mimi decode) at batch 1, for PersonaPlex-family models
the step with the depformer run for the agent codebooks only (as served) next to all 16 (as the reference runs it),
and the span's exit: the frame after a span is sampled from the close position (the text head and the depformer once
more, timed here, inside every span+step above), so the first frame out is conditioned on the span (counted against
the same stream without it; before issue 21 that frame was sampled before the span, 1 frame = 80 ms later).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from moshi.models.lm import LMGen

from benchmarks.report import add_max_span_flag, machine_info, save_json
from frontend_model.engine.calibration import device_sync, time_call
from frontend_model.engine.chunked_prefill import SpanPrefill, chunk_sizes, power_of_two_chunks
from frontend_model.engine.codec import FrameCodec
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.frame import FRAME_SAMPLES
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.loading.profiles import PROFILES
from frontend_model.span.block import Block
from frontend_model.span.build import frames_block, placeholder_rows, tokenize_data_text
from frontend_model.span.text_ids import non_text_ids
from frontend_model.training.profile import profile_checkpoint

SPAN_TEXT = (
    "According to the knowledge base, the museum opens every day except Tuesday from nine in the morning until "
    "six in the evening, and the train from London to Edinburgh takes about four and a half hours. "
)
WARM_STEPS = 8
FLOAT32_TOLERANCE = 1e-4  # next-step logits of two ways of writing the same columns, in float32


def logit_tolerance(dtype: torch.dtype, scale: float) -> float:
    """float32: FLOAT32_TOLERANCE; bf16: four bf16 steps at the logits' magnitude, as
    tests/frontend_model/test_bf16_tolerance.py states it."""
    return FLOAT32_TOLERANCE if dtype == torch.float32 else 4 * 2**-8 * max(8.0, scale)


def span_of_frames(model: LoadedModel, frames: int) -> Block:
    """A real text span of exactly `frames` frames: open, normalised text tokens, close."""
    _, ids = tokenize_data_text(SPAN_TEXT, model.tokenizer, non_text_ids(model.tokenizer, model.span))
    body = (ids * (frames // max(len(ids), 1) + 1))[: max(frames - 2, 0)]
    row = ([model.span.open_id, *body, model.span.close_id])[:frames]
    return frames_block(row, *placeholder_rows(model.span, frames))


def summarise(samples_s: list[float]) -> dict[str, float]:
    ms = np.array(samples_s) * 1000
    return {
        "mean_ms": float(ms.mean()),
        "std_ms": float(ms.std()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "runs": len(ms),
    }


def measure_span(model: LoadedModel, frames: int, repeats: int, max_span: int,
                 mode: SpanPrefill = SpanPrefill.ONE_PASS) -> list[float]:
    sync = device_sync(model.device)
    user = torch.tensor(model.span.sine_codes)
    block = span_of_frames(model, frames) if frames else None
    with Engine(model, GREEDY, max_span_frames=max_span, prefill=mode) as engine:
        for _ in range(WARM_STEPS):
            engine.step(user)

        def once() -> None:
            if block is not None:
                engine.inject(block)
            engine.step(user)

        once()
        return [time_call(once, sync) for _ in range(repeats)]


def measure_stepwise(model: LoadedModel, frames: int, repeats: int, max_span: int) -> list[float]:
    sync = device_sync(model.device)
    user = torch.tensor(model.span.sine_codes)
    block = span_of_frames(model, frames)
    with Engine(model, GREEDY, max_span_frames=max_span) as engine:
        for _ in range(WARM_STEPS):
            engine.step(user)
        return [time_call(lambda: (engine.inject_stepwise(block), engine.step(user)), sync) for _ in range(repeats)]


def next_step_logits(model: LoadedModel, frames: int, mode: SpanPrefill | None, max_span: int) -> torch.Tensor:
    """The text logits of the step after a span written as `mode` writes it, or column by column when None."""
    user = torch.tensor(model.span.sine_codes)
    block = span_of_frames(model, frames)
    with Engine(model, GREEDY, max_span_frames=max_span, prefill=mode or SpanPrefill.ONE_PASS) as engine:
        for _ in range(WARM_STEPS):
            engine.step(user)
        (engine.inject if mode is not None else engine.inject_stepwise)(block)
        engine.step(user)
        assert engine.last_text_logits is not None
        return engine.last_text_logits.float().clone()


def measure_frame(model: LoadedModel, repeats: int, max_span: int) -> list[float]:
    """Whole frame at batch 1: Mimi encode, LM step, Mimi decode."""
    sync = device_sync(model.device)
    rng = np.random.default_rng(0)
    pcm = (0.1 * rng.standard_normal(FRAME_SAMPLES)).astype(np.float32)
    codec = FrameCodec(model.mimi)
    codec.open()
    try:
        with Engine(model, GREEDY, max_span_frames=max_span) as engine:

            def frame() -> None:
                out = engine.step(codec.encode(pcm))
                if out.agent_codes is not None:
                    codec.decode(out.agent_codes)

            for _ in range(WARM_STEPS):
                frame()
            return [time_call(frame, sync) for _ in range(repeats)]
    finally:
        codec.close()


def measure_depformer(model: LoadedModel, repeats: int) -> dict[str, Any] | None:
    """A plain LM step with the depformer run for the agent codebooks only (as served) and for every codebook the
    checkpoint predicts (as PersonaPlex's runtime runs it): timing only, the second step's outputs are not used."""
    served, trained = model.lm.dep_q, model.span.dep_q
    if trained == served:
        return None
    sync = device_sync(model.device)
    user = torch.tensor(model.span.sine_codes, device=model.device)[None, :, None]

    def steps(dep_q: int) -> list[float]:
        model.lm.dep_q = dep_q
        try:
            gen = LMGen(model.lm, use_sampling=False)
            with gen.streaming(1):
                for _ in range(WARM_STEPS):
                    gen.step(user)
                return [time_call(lambda: gen.step(user), sync) for _ in range(repeats)]
        finally:
            model.lm.dep_q = served

    agent_only, every = steps(served), steps(trained)
    return {"codebooks": [served, trained], "step_agent_only": summarise(agent_only),
            "step_all_codebooks": summarise(every), "ratio": statistics.mean(every) / statistics.mean(agent_only)}


def measure_exit(model: LoadedModel, repeats: int, trials: int, max_span: int) -> dict[str, Any]:
    """The exit sample's cost (the depformer on a position's output, for the agent codebooks), and in how many of
    `trials` streams the first and second frames out after a 16-frame span differ from the same stream without it."""
    sync = device_sync(model.device)
    with Engine(model, GREEDY, max_span_frames=max_span) as engine:
        user = torch.tensor(model.span.sine_codes)
        for _ in range(WARM_STEPS):
            engine.step(user)
        assert engine.sampler is not None
        out = torch.zeros(1, 1, model.lm.dim, device=model.device, dtype=model.lm.dtype)
        text = torch.zeros(1, dtype=torch.long, device=model.device)
        with engine.sampler.installed(engine.lm_gen._streaming_state.exec_mask):
            samples = [time_call(lambda: engine.lm_gen.depformer_step(text, out), sync) for _ in range(repeats)]
    block = span_of_frames(model, 16)
    differs = [0, 0]
    for trial in range(trials):
        codes = torch.randint(0, 2048, (WARM_STEPS + trial + 2, model.span.user_codebooks),
                              generator=torch.Generator().manual_seed(trial))
        texts = []
        for inject in (False, True):
            with Engine(model, GREEDY, max_span_frames=max_span) as engine:
                for frame in codes[: WARM_STEPS + trial]:
                    engine.step(frame)
                if inject:
                    engine.inject(block)
                texts.append([engine.step(frame).text_token for frame in codes[WARM_STEPS + trial :]])
        differs = [d + int(a != b) for d, a, b in zip(differs, *texts, strict=True)]
    return {"exit_sample": summarise(samples), "trials": trials, "first_frame_differs": differs[0],
            "second_frame_differs": differs[1], "first_conditioned_frame": 0, "first_conditioned_frame_before": 1}


def run(args: argparse.Namespace) -> dict[str, Any]:
    model = load_model(args.profile, profile_checkpoint(args.profile, args.checkpoint), device=args.device,
                       context=args.context, reduced=args.reduced)
    frames = sorted(set(args.frames))
    max_span = args.max_span_frames
    rows = []
    for n in frames:
        one_pass = measure_span(model, n, args.repeats, max_span)
        row: dict[str, Any] = {"frames": n, "span_plus_step": summarise(one_pass)}
        if n > 0:
            reference = next_step_logits(model, n, SpanPrefill.ONE_PASS, max_span)
            row["chunks"] = power_of_two_chunks(n, chunk_sizes(max_span)[0])
            row["chunked_plus_step"] = summarise(measure_span(model, n, args.repeats, max_span, SpanPrefill.CHUNKED))
            chunked = next_step_logits(model, n, SpanPrefill.CHUNKED, max_span)
            row["chunked_max_abs_logit_diff"] = float((chunked - reference).abs().max())
        if n > 0 and args.stepwise:
            stepwise = measure_stepwise(model, n, args.stepwise_repeats, max_span)
            row["stepwise_plus_step"] = summarise(stepwise)
            row["speedup"] = statistics.mean(stepwise) / statistics.mean(one_pass)
            row["max_abs_logit_diff"] = float((reference - next_step_logits(model, n, None, max_span)).abs().max())
        rows.append(row)
        print_row(row)
    return {
        "benchmark": "span",
        "profile": args.profile,
        "dtype": str(model.lm.dtype),
        "max_span_frames": max_span,
        "machine": machine_info(str(model.device)),
        "frame": summarise(measure_frame(model, args.repeats, max_span)),
        "depformer": measure_depformer(model, args.repeats),
        "exit": measure_exit(model, args.repeats, args.exit_trials, max_span),
        "rows": rows,
    }


def print_row(row: dict[str, Any]) -> None:
    s = row["span_plus_step"]
    line = f"{row['frames']:>6} | {s['mean_ms']:8.2f} +- {s['std_ms']:6.2f} | {s['p99_ms']:8.2f}"
    if "chunked_plus_step" in row:
        c = row["chunked_plus_step"]
        line += f" | {c['mean_ms']:8.2f} | {c['p99_ms']:8.2f} | {row['chunked_max_abs_logit_diff']:.1e}"
    else:
        line += " |" * 3
    if "speedup" in row:
        w = row["stepwise_plus_step"]
        line += f" | {w['mean_ms']:10.1f} | {row['speedup']:7.1f}x | {row['max_abs_logit_diff']:.2e}"
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench span", description=__doc__)
    parser.add_argument("--profile", default="tiny", choices=PROFILES)
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--reduced", action="store_true",
                        help="random profiles at tiny widths, with their real vocabulary, codebooks, delays (CPU CI)")
    parser.add_argument("--context", type=int, default=None, help="override the LM context, in frames")
    parser.add_argument("--frames", type=lambda s: [int(x) for x in s.split(",")], default=[0, 16, 64, 256, 600])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--stepwise-repeats", type=int, default=3)
    parser.add_argument("--exit-trials", type=int, default=20,
                        help="streams compared with and without a span for the exit's conditioning")
    parser.add_argument("--stepwise", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the column-by-column reference and compare logits (slow for long spans)")
    add_max_span_flag(parser)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)
    if max(args.frames) > args.max_span_frames:
        parser.error(f"--frames goes up to {max(args.frames)}, over --max-span-frames {args.max_span_frames}")
    print("     n | span+step mean +- std (ms) | P99 (ms) | chunked mean | chunked P99 | chunked |dlogit| "
          "| stepwise (ms) | speed-up | max |dlogit|", flush=True)
    result = run(args)
    f = result["frame"]
    print(f"whole frame (encode + step + decode): median {f['p50_ms']:.2f} ms, P99 {f['p99_ms']:.2f} ms")
    if result["depformer"] is not None:
        d = result["depformer"]
        print(f"LM step, depformer for {d['codebooks'][0]} codebooks: mean {d['step_agent_only']['mean_ms']:.2f} ms; "
              f"for all {d['codebooks'][1]}: {d['step_all_codebooks']['mean_ms']:.2f} ms ({d['ratio']:.2f}x)")
    e = result["exit"]
    print(f"span exit: the frame after a span is sampled from the close position (+{e['exit_sample']['mean_ms']:.2f} "
          f"ms, depformer once more); first frame out differs from no span in {e['first_frame_differs']}/"
          f"{e['trials']} streams, the second in {e['second_frame_differs']}/{e['trials']}")
    save_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
