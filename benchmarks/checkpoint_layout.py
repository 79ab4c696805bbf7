"""`contextspan bench layout`: the Context Spanning model's own layout at Moshi 7B width, through the checkpoint path.

Random weights are written in the family's files (frontend_model/loading/full_width_files.py: 16 depformer
codebooks, a voice prompt, the fine-tune's weights over the base), loaded as a release is, and served as a session
would be: the default persona and voice prefilled, frames stepped, spans injected in one pass and in chunks, each
timed. The next-step text logits after [prefix, span] written in one pass are checked against the same columns fed
one by one and against chunks. `--reduced` does the same at the tiny widths, on a CPU, in CI.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.report import add_max_span_flag, machine_info, save_json
from benchmarks.span_latency import logit_tolerance, span_of_frames, summarise
from frontend_model.engine.calibration import device_sync, time_call
from frontend_model.engine.chunked_prefill import SpanPrefill
from frontend_model.engine.engine import GREEDY, Engine
from frontend_model.loading.full_width_files import write_full_width_checkpoint
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.span.block import Block, Prefix
from server.session.persona import build_persona_block, persona_and_voice


def session_prefix(model: LoadedModel) -> Prefix:
    persona, voice = persona_and_voice(model, None, None)
    prefix = build_persona_block(model, persona, voice, model.span.context)
    if prefix is None:
        raise RuntimeError(f"{model.profile}: no persona prefix")
    return prefix


def timed_session(model: LoadedModel, prefix: Prefix, mode: SpanPrefill, frames: list[int], steps: int,
                  repeats: int, max_span: int) -> dict[str, Any]:
    sync, user = device_sync(model.device), torch.tensor(model.span.sine_codes)
    with Engine(model, GREEDY, max_span_frames=max_span, prefill=mode) as engine:
        prefill_s = time_call(lambda: engine.prefill(prefix), sync)
        step = [time_call(lambda: engine.step(user), sync) for _ in range(steps)]
        spans = []
        for n in frames:
            block = span_of_frames(model, n)
            samples = [time_call(lambda b=block: (engine.inject(b), engine.step(user)), sync) for _ in range(repeats)]
            spans.append({"frames": n, "span_plus_step": summarise(samples)})
        offset = engine.offset
    return {"prefill": mode.value, "prefix_prefill_ms": 1000 * prefill_s, "step": summarise(step[1:] or step),
            "spans": spans, "frames_written": offset}


def logits_after(model: LoadedModel, prefix: Prefix, block: Block, mode: SpanPrefill | None,
                 max_span: int) -> tuple[torch.Tensor, list[int], torch.Tensor]:
    """The text logits of the step after the prefix, what that step sampled, and the text logits of the step after
    the span that follows; prefix and span both written as `mode` writes them (None: column by column)."""
    user = torch.tensor(model.span.sine_codes)
    with Engine(model, GREEDY, max_span_frames=max_span, prefill=mode or SpanPrefill.ONE_PASS) as engine:
        (engine.prefill_stepwise if mode is None else engine.prefill)(prefix)
        first = engine.step(user)
        assert engine.last_text_logits is not None
        after_prefix = engine.last_text_logits.float().clone()
        sampled = [first.text_token, *([] if first.agent_codes is None else first.agent_codes.tolist())]
        (engine.inject_stepwise if mode is None else engine.inject)(block)
        engine.step(user)
        return after_prefix, sampled, engine.last_text_logits.float().clone()


def equivalence(model: LoadedModel, prefix: Prefix, frames: int, max_span: int) -> dict[str, Any]:
    """After the prefix, then after a span: one pass against column by column and against chunks. The span is
    compared only where the step between sampled the same tokens each way (greedy; in bf16 a near tie may not)."""
    block = span_of_frames(model, frames)
    one_pass, stepwise, chunked = (logits_after(model, prefix, block, mode, max_span)
                                   for mode in (SpanPrefill.ONE_PASS, None, SpanPrefill.CHUNKED))
    scale = float(one_pass[2].abs().max())
    tolerance = logit_tolerance(model.lm.dtype, scale)
    row: dict[str, Any] = {"span_frames": frames, "max_abs_logit": scale, "tolerance": tolerance}
    for name, other in (("one_pass_vs_stepwise", stepwise), ("chunked_vs_one_pass", chunked)):
        row[f"prefix_{name}"] = float((other[0] - one_pass[0]).abs().max())
        same = other[1] == one_pass[1]
        row[f"same_sample_{name}"] = same
        row[name] = float((other[2] - one_pass[2]).abs().max()) if same else None
    compared = [row[k] for k in row if k.startswith(("prefix_", "one_pass_vs", "chunked_vs")) and row[k] is not None]
    row["passed"] = all(value <= tolerance for value in compared)
    return row


def run(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    started = time.perf_counter()
    write_full_width_checkpoint("contextspan", directory, reduced=args.reduced, device=device, dtype=dtype)
    written = time.perf_counter()
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    model = load_model("contextspan", str(directory), device=device, dtype=dtype)
    loaded = time.perf_counter()
    print(f"wrote {size / 2**30:.2f} GiB in {written - started:.1f} s, loaded in {loaded - written:.1f} s: "
          f"{model.description}", flush=True)
    prefix = session_prefix(model)
    sessions = [timed_session(model, prefix, mode, args.frames, args.steps, args.repeats, args.max_span_frames)
                for mode in (SpanPrefill.ONE_PASS, SpanPrefill.CHUNKED)]
    check = equivalence(model, prefix, args.equivalence_frames, args.max_span_frames)
    lm = model.lm
    return {"benchmark": "layout", "layout": model.layout, "reduced": args.reduced, "dtype": str(lm.dtype),
            "machine": machine_info(str(model.device)), "checkpoint_gib": size / 2**30,
            "write_s": written - started, "load_s": loaded - written,
            "architecture": {"dim": lm.dim, "num_layers": len(lm.transformer.layers), "text_card": lm.text_card,
                             "depformer_codebooks": model.span.dep_q, "stepped_codebooks": lm.dep_q,
                             "context": model.span.context},
            "voices": sorted(model.voice_prompts), "prefix_frames": prefix.frames, "sessions": sessions,
            "equivalence": check}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench layout", description=__doc__)
    parser.add_argument("--device", default=None)
    parser.add_argument("--reduced", action="store_true", help="the tiny widths, for a CPU")
    parser.add_argument("--dir", type=Path, default=None, help="where to write the checkpoint (default: a temporary "
                        "folder, removed after)")
    parser.add_argument("--frames", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256])
    parser.add_argument("--steps", type=int, default=30, help="plain steps timed after the prefix")
    parser.add_argument("--repeats", type=int, default=10, help="spans injected per length")
    parser.add_argument("--equivalence-frames", type=int, default=32)
    add_max_span_flag(parser)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="layout-", dir=args.dir) as tmp:
        result = run(args, Path(tmp) / "contextspan")
    for s in result["sessions"]:
        spans = ", ".join(f"{r['frames']}: {r['span_plus_step']['p99_ms']:.2f}" for r in s["spans"])
        print(f"{s['prefill']}: prefix of {result['prefix_frames']} frames {s['prefix_prefill_ms']:.1f} ms; step P99 "
              f"{s['step']['p99_ms']:.2f} ms; span + step P99 (ms) by frames: {spans}", flush=True)
    e = result["equivalence"]
    print(f"next-step logits after the prefix, then after a {e['span_frames']}-frame span: one pass vs column by "
          f"column {e['prefix_one_pass_vs_stepwise']:.2e}, {e['one_pass_vs_stepwise']}; chunked vs one pass "
          f"{e['prefix_chunked_vs_one_pass']:.2e}, {e['chunked_vs_one_pass']} (tolerance {e['tolerance']:.1e}): "
          f"{'passed' if e['passed'] else 'FAILED'}", flush=True)
    save_json(args.json, result)
    return 0 if e["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
