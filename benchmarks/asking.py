"""`contextspan bench asks`: when a trained checkpoint asks (`<ret>`), offline, on a development set.

Why: served, the trained tiny model asked 13-19 times a minute in the frozen test set's chatter and room noise. This
says where, in seconds and without a server: each frame's chance of `<ret>` as a session samples it (the
checkpoint's text temperature and top-k), teacher-forced on a window as a rolled window reads it (the persona prefix,
then the most recent frames, `KEPT` of them), the agent silent. Summed over frames, it is the expected number of asks:
- rooms: every training noise profile (`served.PROFILES`) drawn with seeds training never used, as served; `<ret>` a
  minute per room;
- chatter: held-out statements (`statements` "held_out"; `--split train`: the training ones, to tell what the model did
  not generalise from what it did not learn), in the held-out and training voices, each in a room, and the room after
  it: the chance of at least one `<ret>` per statement;
- questions: held-out phrasings and follow-ups (or the training ones), the same way: the chance of `<ret>` within
  `ASK_FRAMES` of the question's end (training puts it 1-4 frames after).

And where in a window the rooms' asks fall (`<ret>` a minute by ten frames after the prefix, the mean of the six
profiles, each session's first window left out), and around a statement's or a question's end (the mean `<ret>`
chance a frame by `OFFSET_BUCKET` frames from the speech's end: whether the model asks where training put `<ret>`
after the one and nothing after the other, or at every end of speech). Each also with the `<ret>` logit shifted
down (`SHIFTS`): if a served threshold could cut asks in noise and chatter and keep them after questions, it shows
here. And what the codec keeps of the statements' and questions' speech (`heard`: distinct codes by user codebook,
distinct frames), what the model has to tell them apart by. A development set, never the test set: its numbers are
labelled so.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.report import add_trained_checkpoint_flag, machine_info, save_json, trained_checkpoint
from frontend_model.frame import FRAME_S
from frontend_model.loading.loader import LoadedModel, load_model
from frontend_model.moshi_internals.row_sampling import SamplingConfig
from frontend_model.span.build import build_prefix
from frontend_model.span.convention import Conversation, assemble
from frontend_model.training.checkpoint import VOICE_NAME
from frontend_model.training.data import TRAINED_PERSONA, Assembler, Utterance, served_silence, speak_and_encode
from frontend_model.training.recipes import (
    HELD_OUT_VOICES,
    TRAIN_VOICES,
    Split,
    draw_exchange,
    draw_follow_up,
    follow_up_kinds,
)
from frontend_model.training.served import PROFILES
from frontend_model.training.speech import Voice
from frontend_model.training.statements import draw_statement

DEFAULT_OUT = Path("benchmarks/results/asks-tiny-contextspan-cpu.json")
KEPT = 57  # live frames a rolled window of the trained model keeps after its prefix (96-frame context)
ROOM_FRAMES = 600
ASK_FRAMES = 6
BUCKET = 10
LEAD_FRAMES = 8
SHIFTS = (0.0, -math.log(2), -math.log(5), -math.log(10))
OFFSET_BUCKET = 4
OFFSETS = range(-8, 24, OFFSET_BUCKET)


class Windows:
    """The model's `<ret>` chances on windows of [the default persona prefix + live frames]."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        voice = model.voice_prompts[VOICE_NAME]
        self.assembler = Assembler.for_model(model, voice)
        self.prefix = build_prefix(TRAINED_PERSONA, model.tokenizer, model.span, voice, list(model.lm.delays),
                                   self.assembler.forbidden)
        sampling = SamplingConfig()
        self.temperature, self.top_k = sampling.temp_text, sampling.top_k_text
        self.suppressed = sorted(model.suppressed_text_ids)

    @torch.no_grad()
    def logits(self, user: torch.Tensor) -> torch.Tensor:
        """[frames, vocabulary]: the text logits that predict each live frame's text, `user` codes [codebooks, frames]
        under a silent agent."""
        span, frames = self.model.span, user.shape[1]
        quiet = self.assembler.quiet(frames)
        a = span.agent_codebooks
        conversation = Conversation(quiet[0], quiet[1:1 + a], user.to(torch.long), prefix=self.prefix)
        columns = self.assembler.layout(assemble(conversation, span), []).columns
        _, logits = self.model.lm.forward_text(columns[None, :, :-1])
        return logits[0, 0, -frames:].float()

    def ret_chance(self, logits: torch.Tensor, shift: float) -> torch.Tensor:
        """Per frame, the chance a session samples `<ret>` (its temperature and top-k), the logit shifted."""
        x = logits.clone()
        if self.suppressed:
            x[:, self.suppressed] = float("-inf")
        x[:, self.model.span.ret_id] += shift
        top = torch.topk(x / self.temperature, self.top_k, dim=-1)
        kept = torch.full_like(x, float("-inf")).scatter(-1, top.indices, top.values)
        return torch.softmax(kept, -1)[:, self.model.span.ret_id]

    def around(self, utterance: Utterance) -> tuple[torch.Tensor, int]:
        """Logits of the room, the utterance and the room after it (the last `KEPT` frames); the speech's end."""
        track = self.assembler.tracks[utterance.profile][0]
        user = torch.cat([track[:, 60:60 + LEAD_FRAMES], utterance.codes, utterance.after], dim=1)
        end = LEAD_FRAMES + utterance.speech_frames
        cut = max(0, user.shape[1] - KEPT)
        return self.logits(user[:, cut:]), end - cut


def take(rng: random.Random) -> tuple[Voice, float]:
    """A development take's voice (held-out or training, 130-190 words a minute, pitch 35-70) and gain."""
    voice = Voice(rng.choice((*HELD_OUT_VOICES, *TRAIN_VOICES)), rng.randint(130, 190), rng.randint(35, 70))
    return voice, rng.uniform(0.3, 1.3)


def spoken(model: LoadedModel, texts: list[str], rng: random.Random, seed: int) -> list[Utterance]:
    """Each text in a take drawn for it, in a room drawn for it, as served."""
    lines = [(text, *take(rng)) for text in texts]
    return speak_and_encode(model.mimi, lines, profiles=[rng.randrange(len(PROFILES)) for _ in lines], seed=seed)


def heard(utterances: list[Utterance]) -> dict[str, object]:
    """What the codec keeps of the speech the model is asked to tell apart: over the utterances' speech frames, the
    distinct codes of each user codebook and the distinct frames (all codebooks together)."""
    codes = torch.cat([u.codes[:, :u.speech_frames] for u in utterances], dim=1)
    return {"speech_frames": codes.shape[1],
            "distinct_codes_by_codebook": [len(torch.unique(row)) for row in codes],
            "distinct_frames": torch.unique(codes, dim=1).shape[1]}


def measure(model: LoadedModel, statements: int, questions: int, follow_ups: int, seed: int,
            split: Split = "held_out") -> dict[str, object]:
    windows = Windows(model)
    rng = random.Random(seed)
    rooms = {}
    for i, profile in enumerate(PROFILES):
        track = served_silence(model.mimi, ROOM_FRAMES, profile, seed=10_000 + seed + i)
        rooms[profile.name] = [windows.logits(track[:, s:s + KEPT]) for s in range(0, ROOM_FRAMES - KEPT + 1, KEPT)]
    said = spoken(model, [draw_statement(rng, split) for _ in range(statements)], rng, seed + 1)
    # Held out: the order every committed result drew its follow-ups in.
    kinds = ("time", "math") if split == "held_out" else follow_up_kinds(split)
    asked = spoken(model, [draw_exchange(rng, split).question for _ in range(questions)]
                   + [draw_follow_up(rng, split, rng.choice(kinds)) for _ in range(follow_ups)],
                   rng, seed + 2)
    around_said = [windows.around(u) for u in said]
    around_asked = [windows.around(u) for u in asked]
    chatter = [logits for logits, _ in around_said]
    hazards = [logits[end:end + ASK_FRAMES] for logits, end in around_asked]

    def at_least_one(chances: torch.Tensor) -> float:
        return 1 - float(torch.prod(1 - chances))

    # Where in a window the rooms' asks fall, unshifted: `<ret>` a minute by `BUCKET` frames after the prefix.
    chances = torch.stack([windows.ret_chance(x, 0.0) for logits in rooms.values() for x in logits[1:]])
    by_frame = [round(float(chances[:, lo:lo + BUCKET].mean()) * 60 / FRAME_S, 1) for lo in range(0, KEPT, BUCKET)]
    rows = []
    for shift in SHIFTS:
        per_room = {name: float(torch.cat([windows.ret_chance(x, shift) for x in logits]).mean()) * 60 / FRAME_S
                    for name, logits in rooms.items()}
        recall = [at_least_one(windows.ret_chance(x, shift)) for x in hazards]
        rows.append({"ret_logit_shift": round(shift, 3),
                     "rets_per_min_by_room": {name: round(v, 1) for name, v in per_room.items()},
                     "rets_per_min_rooms": round(statistics.fmean(per_room.values()), 1),
                     "asks_per_statement": round(statistics.fmean(
                         at_least_one(windows.ret_chance(x, shift)) for x in chatter), 3),
                     "questions_asked": round(statistics.fmean(recall[:questions]), 3),
                     "follow_ups_asked": round(statistics.fmean(recall[questions:]), 3)})
    return {"split": split, "statements": statements, "questions": questions, "follow_ups": follow_ups,
            "heard": heard(said + asked),
            "rows": rows,
            "ret_chance_by_offset": {"bucket_frames": OFFSET_BUCKET, "from": list(OFFSETS),
                                     "statements": by_offset(windows, around_said),
                                     "questions": by_offset(windows, around_asked[:questions])},
            "rooms_rets_per_min_by_frame": {"bucket_frames": BUCKET, "rets_per_min": by_frame}}


def by_offset(windows: Windows, around: list[tuple[torch.Tensor, int]]) -> list[float]:
    """The mean unshifted `<ret>` chance a frame in each `OFFSETS` bucket of frames from the speech's end."""
    sums = dict.fromkeys(OFFSETS, 0.0)
    counts = dict.fromkeys(OFFSETS, 0)
    for logits, end in around:
        for frame, chance in enumerate(windows.ret_chance(logits, 0.0).tolist()):
            start = (frame - end) // OFFSET_BUCKET * OFFSET_BUCKET
            if start in sums:
                sums[start] += chance
                counts[start] += 1
    return [round(sums[o] / counts[o], 3) if counts[o] else 0.0 for o in OFFSETS]


def table(rows: list[dict]) -> str:
    names = list(rows[0]["rets_per_min_by_room"])
    lines = [f"| `<ret>` logit shift | {' | '.join(f'{n} /min' for n in names)} | asks per statement | questions "
             f"asked | follow-ups asked |", "|---" * (len(names) + 4) + "|"]
    lines += [f"| {r['ret_logit_shift']:+.2f} | {' | '.join(str(r['rets_per_min_by_room'][n]) for n in names)} | "
              f"{r['asks_per_statement']:.0%} | {r['questions_asked']:.0%} | {r['follow_ups_asked']:.0%} |"
              for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contextspan bench asks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_trained_checkpoint_flag(parser)
    parser.add_argument("--statements", type=int, default=40)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--follow-ups", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--split", choices=("held_out", "train"), default="held_out",
                        help="the recipes' sentences to ask: held-out (default) or the training ones")
    parser.add_argument("--json", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    checkpoint = trained_checkpoint(args.checkpoint)
    started = time.monotonic()
    model = load_model("contextspan", str(checkpoint), device="cpu", dtype=torch.float32)
    result = measure(model, args.statements, args.questions, args.follow_ups, args.seed, args.split)
    print(table(result["rows"]))
    print(f"rooms, `<ret>` a minute by {BUCKET} frames after the prefix (a session's first window left out): "
          f"{result['rooms_rets_per_min_by_frame']['rets_per_min']}")
    for kind in ("statements", "questions"):
        print(f"`<ret>` chance a frame after {kind}, by {OFFSET_BUCKET} frames from the speech's end "
              f"{list(OFFSETS)}: {result['ret_chance_by_offset'][kind]}")
    print(f"heard: {result['heard']['speech_frames']} speech frames of statements and questions, distinct codes by "
          f"user codebook {result['heard']['distinct_codes_by_codebook']}, distinct frames "
          f"{result['heard']['distinct_frames']}")
    sentences = args.split.replace("_", "-")
    save_json(args.json, {"machine": machine_info("cpu"), "set": f"development ({sentences} recipes, not the test set)",
                          "checkpoint": checkpoint.name, "seed": args.seed,
                          "seconds": round(time.monotonic() - started), **result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
