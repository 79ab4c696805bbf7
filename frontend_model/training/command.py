"""`contextspan train --out DIR`: the trained tiny Context Spanning checkpoint (from the cache, its committed release,
or trained here); `--release` also commits its weights to the source tree."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from frontend_model.training.checkpoint import REPORT
from frontend_model.training.released import WEIGHTS_DIR, release, tiny_contextspan_checkpoint
from frontend_model.training.trainer import TrainConfig


def train_main(argv: list[str]) -> int:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(prog="contextspan train", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the checkpoint to")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--copy-steps", type=int, default=defaults.copy_steps,
                        help="steps of copying apps' spans only, before the mix")
    parser.add_argument("--steps", type=int, default=defaults.steps, help="steps of the mix")
    parser.add_argument("--app-share", type=float, default=defaults.app_share,
                        help="share of the mix's turns where an app pushes a span")
    parser.add_argument("--slip", type=float, default=defaults.slip,
                        help="share of the agent's answer tokens it reads slipped")
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch threads while training")
    parser.add_argument("--workers", type=int, default=defaults.workers,
                        help="processes drawing the batches beside the training (0: inline; the same batches)")
    parser.add_argument("--random-codec", action="store_true",
                        help="hear through the tiny profile's random codec, not the one distilled from Whisper")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $XDG_CACHE_HOME/contextspan")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--release", action="store_true",
                        help=f"also write its trained tensors to {WEIGHTS_DIR} (to commit), replacing older releases")
    args = parser.parse_args(argv)
    config = TrainConfig(seed=args.seed, copy_steps=args.copy_steps, steps=args.steps, app_share=args.app_share,
                         slip=args.slip, threads=args.threads, workers=args.workers,
                         codec=None if args.random_codec else defaults.codec)
    cached = tiny_contextspan_checkpoint(config, args.cache_dir, progress=not args.no_progress)
    shutil.copytree(cached, args.out, dirs_exist_ok=True)
    report = json.loads((args.out / REPORT).read_text())
    print(json.dumps({"checkpoint": str(args.out), "cached": str(cached), **report}, indent=2))
    if args.release:
        print(f"released: {release(cached)} (commit it)")
    print(f"serve it: contextspan serve --profile contextspan --checkpoint {args.out}")
    return 0
