"""`contextspan distil --out DIR`: the tiny codec distilled from Whisper tiny.en's encoder (from the cache, its
committed release, or distilled here: about 45 minutes on 2 cores); `--release` also commits its weights."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from frontend_model.training.codec.distil import CodecConfig
from frontend_model.training.codec.release import REPORT, WEIGHTS_DIR, distilled_codec, release


def distil_main(argv: list[str]) -> int:
    defaults = CodecConfig()
    parser = argparse.ArgumentParser(prog="contextspan distil", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="directory to write the codec to")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--filters", type=int, default=defaults.filters, help="the codec's SEANet width")
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--threads", type=int, default=defaults.threads, help="torch threads while distilling")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $XDG_CACHE_HOME/contextspan")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--release", action="store_true",
                        help=f"also write its tensors to {WEIGHTS_DIR} (to commit), replacing older releases")
    args = parser.parse_args(argv)
    config = CodecConfig(seed=args.seed, filters=args.filters, steps=args.steps, threads=args.threads)
    cached = distilled_codec(config, args.cache_dir, progress=not args.no_progress)
    shutil.copytree(cached, args.out, dirs_exist_ok=True)
    print(json.dumps({"codec": str(args.out), **json.loads((args.out / REPORT).read_text())}, indent=2))
    if args.release:
        print(f"released: {release(cached)} (commit it)")
    return 0
