"""`contextspan bench gc`: what one full garbage collection holds a loaded server for, with what loading made frozen
out of collections (as served, `server/ops/collector.py`) and not, side by side in one process.

The server is the app `contextspan serve` builds with its default settings (model, backend, Whisper), loaded through
its own startup. A collection holds the GIL: the model's tick and the event loop wait for all of it, and the frame is
80 ms. `--ballast N` adds N small objects that live as long as the process, made before the server freezes what it
holds, as a notebook or the test suite holds them.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.report import machine_info, save_json
from server.ops.collector import freeze_loaded


def full_collections(repeats: int) -> dict[str, Any]:
    """Wall times of `repeats` full collections, with the objects they walk."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return {"objects_walked": len(gc.get_objects()), "median_ms": round(statistics.median(times) * 1e3, 2),
            "max_ms": round(max(times) * 1e3, 2)}


async def measure(repeats: int, ballast: int) -> dict[str, Any]:
    from server.app.routes import create_app
    from server.settings import ServerSettings

    app = create_app(ServerSettings())
    async with app.router.lifespan_context(app):
        state = app.state.server
        while state.model is None and state.load_error is None:
            await asyncio.sleep(0.1)
        if state.load_error is not None:
            raise SystemExit(f"the server did not load: {state.load_error}")
        kept = [[i] for i in range(ballast)]  # lists: the collector tracks every one
        gc.unfreeze()
        unfrozen = full_collections(repeats)
        frozen_count = freeze_loaded()
        frozen = full_collections(repeats)
        del kept
        return {"model": state.model.description, "ballast": ballast, "frozen_objects": frozen_count,
                "unfrozen": unfrozen, "frozen": frozen}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7, help="full collections timed each way")
    parser.add_argument("--ballast", type=int, default=0, help="long-lived objects the process holds besides")
    parser.add_argument("--json", type=Path, help="write the result here (benchmarks/results/...)")
    args = parser.parse_args(argv)
    result = asyncio.run(measure(args.repeats, args.ballast))
    print(f"{result['model']}, ballast {args.ballast}")
    print(f"{'':>10} {'objects walked':>15} {'median ms':>10} {'max ms':>8}")
    for name in ("unfrozen", "frozen"):
        row = result[name]
        print(f"{name:>10} {row['objects_walked']:>15} {row['median_ms']:>10} {row['max_ms']:>8}")
    save_json(args.json, {"bench": "gc", "machine": machine_info(), "repeats": args.repeats, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
