"""`contextspan bench copy`: how well a trained checkpoint says what a span holds, offline (no server, no ASR).

Conversations are drawn by the training assembler (`Assembler.conversation`: the sequence convention, one turn each)
with held-out questions, voice, statements and notification shapes, and sorted by what their span held: a tool's
answer (after `<ret>`), the abstain span, or an app's text (`span.inject`: no question, no `<ret>`), and apart, a
tool's answer with the time in a place no training span named ("new place"). Per kind: the
answer's tokens the model predicts teacher-forced (argmax), and the answer's words it says in order when it writes
its own answer token by token on its text row (its other rows as drawn), greedily and sampled by a session's sampler
(the checkpoint's text temperature and top-k, seeded). `bench behaviour` measures the served model; this isolates
the copying.
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from backend_agent.tools.places import database_places
from benchmarks.behaviour_scoring import SAID_RECALL, in_order_recall, words
from benchmarks.report import add_trained_checkpoint_flag, machine_info, save_json, trained_checkpoint
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.row_sampling import RowSampler, RowSampling, SamplingConfig, Stream
from frontend_model.training.checkpoint import VOICE_NAME
from frontend_model.training.data import ABSTAIN_REPLY, Assembler, Sequence, synthesise_corpus
from frontend_model.training.trainer import TrainConfig

DEFAULT_OUT = Path("benchmarks/results/copy-tiny-contextspan-cpu.json")
KINDS = ("tool", "new place", "abstain", "app")


@dataclass(frozen=True)
class Said:
    kind: str
    expected: str
    greedy: str
    sampled: str
    token_hits: int
    tokens: int

    @property
    def recall(self) -> float:
        return in_order_recall(words(self.expected), words(self.greedy))

    @property
    def sampled_recall(self) -> float:
        return in_order_recall(words(self.expected), words(self.sampled))


def kind_of(sequence: Sequence, text: str) -> str | None:
    """What the one turn's span held, from its layout: no answer (a quiet turn) is None."""
    if not sequence.answer_columns:
        return None
    if not sequence.ret_columns:
        return "app"
    return "abstain" if text == ABSTAIN_REPLY else "tool"


def sampler(seed: int, sampling: bool) -> RowSampler:
    """A session's sampler for one row: greedy, or the checkpoint's text temperature and top-k with `seed`."""
    config = SamplingConfig(use_sampling=sampling)
    return RowSampler(1, RowSampling.from_config(config, text_seed=seed, audio_seed=seed), torch.device("cpu"))


def write_answer(model: LoadedModel, columns: torch.Tensor, answer: list[int], sampler: RowSampler) -> str:
    """The model's own answer, token by token on its text row (its other rows as drawn)."""
    columns = columns.clone()
    for c in answer:
        _, logits = model.lm.forward_text(columns[:, :, :c])
        columns[0, 0, c] = sampler.sample(logits[:, 0, -1], Stream.TEXT)[0]
    return model.tokenizer.decode([int(columns[0, 0, c]) for c in answer])


@torch.no_grad()
def said(model: LoadedModel, sequence: Sequence, kind: str, greedy: RowSampler, sampled: RowSampler) -> Said:
    columns = sequence.columns[None]
    answer = list(sequence.answer_columns[0])
    _, logits = model.lm.forward_text(columns[:, :, :-1])
    predicted = logits[0, 0].argmax(-1)
    hits = sum(int(predicted[c - 1] == columns[0, 0, c]) for c in answer)
    expected = model.tokenizer.decode([int(columns[0, 0, c]) for c in answer])
    return Said(kind, expected, write_answer(model, columns, answer, greedy),
                write_answer(model, columns, answer, sampled), hits, len(answer))


def measure(model: LoadedModel, per_kind: int, seed: int) -> list[Said]:
    """`per_kind` turns of each kind, drawn as training draws them (held-out split), in a fixed order; "new place":
    the time in a place only the timezone database names (`database_places`), which no training span named."""
    voice = model.voice_prompts[VOICE_NAME]
    corpus = synthesise_corpus(model.mimi, "held_out", 2 * per_kind, per_kind, seed)
    greedy, sampled = sampler(seed, False), sampler(seed, True)
    out: list[Said] = []
    known = Assembler.for_model(model, voice)
    elsewhere = copy.copy(known)
    elsewhere.places = database_places()
    for assembler, kinds in ((known, {"tool", "abstain", "app"}), (elsewhere, {"new place"})):
        rng = random.Random(seed)
        wanted = dict.fromkeys(kinds, per_kind)
        while any(wanted.values()):
            sequence = assembler.conversation(rng, corpus, TrainConfig().max_gap, 1)
            text = model.tokenizer.decode([int(sequence.columns[0, c]) for a in sequence.answer_columns for c in a])
            kind = kind_of(sequence, text)
            if kind == "tool" and assembler.places and text.startswith("It is"):
                kind = "new place"
            if wanted.get(kind):
                wanted[kind] -= 1
                out.append(said(model, sequence, kind, greedy, sampled))
    return out


def summary(results: list[Said]) -> list[dict[str, object]]:
    rows = []
    for kind in KINDS:
        mine = [r for r in results if r.kind == kind]
        rows.append({"kind": kind, "turns": len(mine),
                     "tokens_teacher_forced": round(sum(r.token_hits for r in mine) / sum(r.tokens for r in mine), 3),
                     "words_in_order_greedy": round(statistics.fmean(r.recall for r in mine), 3),
                     "turns_at_pass_recall": round(sum(r.recall >= SAID_RECALL for r in mine) / len(mine), 3),
                     "words_in_order_sampled": round(statistics.fmean(r.sampled_recall for r in mine), 3),
                     "turns_at_pass_recall_sampled": round(
                         sum(r.sampled_recall >= SAID_RECALL for r in mine) / len(mine), 3),
                     "turns_said_exactly_sampled": round(sum(r.sampled_recall == 1.0 for r in mine) / len(mine), 3),
                     "examples": [{"span": r.expected, "greedy": r.greedy, "sampled": r.sampled}
                                  for r in mine[:3]]})
    return rows


def table(rows: list[dict[str, object]]) -> str:
    passing = f"turns >= {SAID_RECALL:.0%}"
    lines = [f"| span | turns | answer tokens, teacher-forced | words in order, greedy | {passing} | "
             f"words in order, sampled | {passing} | said exactly, sampled |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['kind']} | {r['turns']} | {r['tokens_teacher_forced']:.1%} | {r['words_in_order_greedy']:.1%} | "
              f"{r['turns_at_pass_recall']:.0%} | {r['words_in_order_sampled']:.1%} | "
              f"{r['turns_at_pass_recall_sampled']:.0%} | {r['turns_said_exactly_sampled']:.0%} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench copy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trained_checkpoint_flag(parser)
    parser.add_argument("--turns", type=int, default=30, help="turns of each kind")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkpoint = trained_checkpoint(args.checkpoint)
    started = time.monotonic()
    model = load_model("contextspan", str(checkpoint), device="cpu", dtype=torch.float32)
    rows = summary(measure(model, args.turns, args.seed))
    print(table(rows))
    save_json(args.json, {"machine": machine_info("cpu"), "checkpoint": checkpoint.name, "turns": args.turns,
                          "seed": args.seed, "seconds": round(time.monotonic() - started), "kinds": rows})
    return 0

