"""The GPU check that `scripts/gpu_check.sh run` starts once the wheels are installed: phases in priority order inside
a time budget, each skipped when too little of the budget is left, every outcome logged, and a summary against the
targets and against Kyutai's per-frame work measured in the same run. A device machine is lent for minutes, so what
matters most runs first, and everything lands in four files under --out: `install.log` (from gpu_check.sh),
`gpu_check.log`, `gpu_check-<device>.json` and `gpu_check-<device>.md` (the table benchmarks/README.md shows).

`equivalence` (a phase, also a subcommand) checks one-pass injection against the columns fed one by one, and the
CUDA-graphed step against the eager one, on the tiny and the random 7B models. `table RESULTS.json --write FILE`
puts a results file's table between the markers in FILE (benchmarks/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a file: the repository's packages are importable without an install

from frontend_model.frame import FRAME_S  # noqa: E402

DEFAULT_BUDGET_S = 480.0
LOG_TAIL_LINES = 150  # of each phase's output kept in the log
TARGETS_MS = {  # random 7B, bf16
    "step_p99": 15.0,  # a plain step
    "span600_step_p99": 40.0,  # a 600-frame span and the next step
    "tick64_span256_p99": 70.0,  # a tick of 64 sessions with a 256-frame span injected
}
BATCH_MAX_SPAN_FRAMES = 256  # the batch and load phases' --max-span-frames (the tick target's span)
# The load phase serves the most sessions whose batched tick kept this at P99, of the 80 ms frame (it runs without ASR:
# no spans; a span in every tick, as the batch phase measures, would leave one session).
LOAD_TICK_LIMIT_MS = 60.0
TABLE_BEGIN = "<!-- gpu-check: written by scripts/gpu_check.py table; do not edit by hand -->"
TABLE_END = "<!-- gpu-check: end -->"
ENGINE_TESTS = ["tests/frontend_model/test_engine_equivalence.py", "tests/frontend_model/test_batch_engine.py",
                "tests/frontend_model/test_batch_model.py", "tests/frontend_model/test_batch_codec.py",
                "tests/frontend_model/test_window.py", "tests/frontend_model/test_history.py"]
BF16_TESTS = ["tests/frontend_model/test_bf16_tolerance.py"]


@dataclass(frozen=True)
class Sizes:
    """What the phases run: the real check on a GPU, or the tiny profile at the smallest sizes that still exercise
    every phase for the CPU dry run (a loaded 2-core machine)."""

    profile: str
    engine_tests: list[str]
    bf16_tests: list[str]  # pytest arguments
    equivalence_profiles: str
    equivalence_frames: int
    span_frames: str
    span_repeats: int
    batch_sessions: str
    batch_span_frames: int
    batch_ticks: int
    batch_rounds: int
    load_profile: str
    load_sessions: int  # when the batch phase measured nothing to choose from
    load_seconds: float
    reduced: list[str]  # `--reduced` for the layout and Kyutai phases (CPU: the tiny widths)
    layout_frames: str
    kyutai_frames: int
    profile_args: list[str]
    window_minutes: str  # conversations whose replay and window refill are timed

    @staticmethod
    def for_run(dry_run: bool) -> Sizes:
        if dry_run:
            return Sizes("tiny", ["tests/frontend_model/test_batch_codec.py"],
                         ["-k", "prefill and dep_q8", *BF16_TESTS], "tiny", 11, "0,11", 2, "2,1", 8, 2, 1,
                         "tiny", 2, 2.0, ["--reduced"], "8", 4,
                         ["--frames", "4,8", "--repeats", "2"], "0.5")
        return Sizes("moshi-7b", ENGINE_TESTS, BF16_TESTS, "tiny,moshi-7b", 64, "0,16,64,256,600", 30,
                     "64,48,32,16,4,1", 256, 30, 1, "moshi-7b", 16, 15.0, [], "16,64,256,600", 200, [], "1,4")


@dataclass
class PhaseResult:
    name: str
    outcome: str  # passed, failed, timed out, skipped
    seconds: float = 0.0
    returncode: int | None = None
    why: str = ""
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    name: str
    min_s: float  # skipped when less of the budget is left (never when 0)
    max_s: float  # killed past this (or past the budget left)
    command: Callable[[Path], list[str]] | None = None  # a subprocess, given the scratch folder
    env: dict[str, str] = field(default_factory=dict)
    result_file: str | None = None  # JSON the command writes into the scratch folder, kept in the results
    inline: Callable[[], dict[str, Any]] | None = None  # or run here


class Log:
    def __init__(self, path: Path) -> None:
        self.file = path.open("w")

    def __call__(self, line: str = "") -> None:
        print(line, flush=True)
        self.file.write(line + "\n")
        self.file.flush()


def environment(device: str) -> dict[str, Any]:
    """What the numbers depend on: the GPU, its driver, torch and CUDA, and the installed versions."""
    import importlib.metadata as md
    import platform

    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                            "cpu_count": os.cpu_count(), "torch": torch.__version__, "cuda": torch.version.cuda,
                            "device": device, "cuda_available": torch.cuda.is_available()}
    if device.startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        free, total = torch.cuda.mem_get_info(torch.device(device))
        info.update(gpu=props.name, gpu_memory_gib=round(total / 2**30, 1), gpu_free_gib=round(free / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", cudnn=torch.backends.cudnn.version())
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    info["packages"] = {}
    for name in ("moshi", "numpy", "sphn", "sentencepiece", "fastapi", "uvicorn", "pydantic", "pytest"):
        try:
            info["packages"][name] = md.version(name)
        except md.PackageNotFoundError:
            info["packages"][name] = None
    return info


def device_slug(env: dict[str, Any], dry_run: bool) -> str:
    name = env.get("gpu") or env["device"]
    slug = re.sub(r"[^a-z0-9]+", "-", str(name).lower()).strip("-")
    return f"{slug}-dry-run" if dry_run else slug


def phases(args: argparse.Namespace, sizes: Sizes) -> list[Phase]:
    py, device = sys.executable, args.device
    bench = [py, "-m", "server.cli", "bench"]
    test_env = {"CONTEXTSPAN_TEST_DEVICE": device}

    def pytest(selection: list[str]) -> Callable[[Path], list[str]]:
        return lambda _: [py, "-m", "pytest", "-m", "", "-q", "--tb=short", "-p", "no:cacheprovider", *selection]

    def batch(scratch: Path, name: str, prefill: str) -> list[str]:
        return [*bench, "batch", "--profile", sizes.profile, "--device", device, "--sessions",
                sizes.batch_sessions, "--span-frames", str(sizes.batch_span_frames), "--ticks", str(sizes.batch_ticks),
                "--rounds", str(sizes.batch_rounds), "--prefill", prefill, "--json", str(scratch / name)]

    # 64 sessions' rings widened by the server's default 640 span frames do not fit an H200 beside the weights
    # (docs/operations.md, GPU sizing); widened by the 256 the target's span needs, they do.
    batch_env = {"CONTEXTSPAN_MAX_SPAN_FRAMES": str(BATCH_MAX_SPAN_FRAMES)}

    def load(scratch: Path) -> list[str]:
        sessions = load_sessions(scratch / "batch_graphs.json", sizes.load_sessions)
        return [*bench, "load", "--profile", sizes.load_profile, "--device", device, "--sessions", str(sessions),
                "--seconds", str(sizes.load_seconds), "--no-asr", "--page-ms", "40",  # pages the server can align
                "--json", str(scratch / "load.json")]

    return [
        Phase("environment", 0, 60, inline=lambda: environment(device)),  # always: it explains the rest
        Phase("engine, batch and codec tests (float32, TF32 off)", 30, 200,
              pytest(sizes.engine_tests), test_env),
        Phase("bf16 tolerance tests", 20, 90, pytest(sizes.bf16_tests), test_env),
        Phase("one-pass vs stepwise, graphed vs eager", 30, 120,
              lambda s: [py, __file__, "equivalence", "--device", device, "--profiles", sizes.equivalence_profiles,
                         "--frames", str(sizes.equivalence_frames),
                         "--json", str(s / "equivalence.json")], result_file="equivalence.json"),
        Phase("Context Spanning layout at 7B (checkpoint path)", 60, 180,
              lambda s: [*bench, "layout", "--device", device, *sizes.reduced, "--dir", str(s), "--frames",
                         sizes.layout_frames, "--json", str(s / "layout.json")], result_file="layout.json"),
        Phase("bench span", 40, 120,
              lambda s: [*bench, "span", "--profile", sizes.profile, "--device", device, "--frames",
                         sizes.span_frames, "--repeats", str(sizes.span_repeats), "--no-stepwise",
                         "--exit-trials", "2", "--json", str(s / "span.json")], result_file="span.json"),
        Phase("bench batch, CUDA graphs", 40, 150, lambda s: batch(s, "batch_graphs.json", "chunked"), batch_env,
              result_file="batch_graphs.json"),
        Phase("Kyutai's per-frame work (moshi LMGen, batch 1)", 30, 90,
              lambda s: [*bench, "kyutai", "--profile", "moshi-7b", "--device", device, *sizes.reduced,
                         "--frames", str(sizes.kyutai_frames), "--json", str(s / "kyutai.json")],
              result_file="kyutai.json"),
        Phase("bench load (real server)", 60, 180, load, batch_env, result_file="load.json"),
        Phase(WINDOW_PHASE, 40, 150,
              lambda s: [py, __file__, "window", "--device", device, "--profile", sizes.profile, "--minutes",
                         sizes.window_minutes, "--json", str(s / "window.json")], result_file="window.json"),
        Phase("bench batch, eager", 40, 120, lambda s: batch(s, "batch_eager.json", "one-pass"),
              {"NO_CUDA_GRAPH": "1", **batch_env}, result_file="batch_eager.json"),
        Phase("profile of a span + step", 30, 90,
              lambda s: [py, __file__, "profile", "--device", device, *sizes.reduced, *sizes.profile_args,
                         "--json", str(s / "profile.json")], result_file="profile.json"),
    ]


def selected(every: list[Phase], only: list[str]) -> list[Phase]:
    """Every phase; or the environment, then those whose names contain one of `only`, in that order."""
    if not only:
        return every
    chosen = every[:1]
    for key in only:
        chosen += [phase for phase in every if key in phase.name and phase not in chosen]
    return chosen


def load_sessions(batch_json: Path, fallback: int) -> int:
    """The most sessions whose batched tick kept LOAD_TICK_LIMIT_MS at P99 in the batch phase."""
    if not batch_json.exists():
        return fallback
    rows = json.loads(batch_json.read_text()).get("rows", [])
    held = [r["sessions"] for r in rows if r["tick"]["p99_ms"] <= LOAD_TICK_LIMIT_MS]
    return max(held, default=min((r["sessions"] for r in rows), default=fallback))


def run_phase(phase: Phase, left_s: float, scratch: Path, log: Log, extra_env: dict[str, str]) -> PhaseResult:
    if phase.min_s > 0 and left_s < phase.min_s:
        return PhaseResult(phase.name, "skipped", why=f"{left_s:.0f} s of the budget left, it needs {phase.min_s:.0f}")
    start = time.monotonic()
    if phase.inline is not None:
        try:
            data = phase.inline()
        except Exception as exc:
            return PhaseResult(phase.name, "failed", time.monotonic() - start, why=f"{type(exc).__name__}: {exc}")
        log(json.dumps(data, indent=2))
        return PhaseResult(phase.name, "passed", time.monotonic() - start, data=data)
    assert phase.command is not None
    command = phase.command(scratch)
    limit = min(phase.max_s, left_s)
    log("$ " + " ".join(command))
    # The repository first, then whatever path the install set (gpu_check.sh: the carried wheels), never replaced.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, **extra_env, **phase.env, PYTHONPATH=path)
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=limit)
        output, returncode, outcome = done.stdout + done.stderr, done.returncode, "passed" if done.returncode == 0 \
            else "failed"
    except subprocess.TimeoutExpired as exc:
        output = _text(exc.stdout) + _text(exc.stderr)
        returncode, outcome = None, "timed out"
    lines = output.splitlines()
    log("\n".join(lines if outcome != "passed" else lines[-LOG_TAIL_LINES:]))  # all of a failure: no second try
    data: dict[str, Any] = {}
    if phase.result_file and (scratch / phase.result_file).exists():
        data = json.loads((scratch / phase.result_file).read_text())
    why = "" if outcome == "passed" else (f"over {limit:.0f} s" if returncode is None else (lines or [""])[-1])
    return PhaseResult(phase.name, outcome, time.monotonic() - start, returncode, why, data)


def _text(out: bytes | str | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def target_rows(results: dict[str, PhaseResult]) -> list[dict[str, Any]]:
    """Each target with the measured value: the sizes asked for on a GPU, the largest measured in a dry run."""
    rows: list[dict[str, Any]] = []

    def add(name: str, what: str, value: float | None) -> None:
        target = TARGETS_MS[name]
        met = None if value is None else value <= target
        rows.append({"target": name, "what": what, "p99_ms": value, "limit_ms": target, "met": met})

    span = results.get("bench span")
    span_rows = span.data.get("rows", []) if span else []
    plain = next((r for r in span_rows if r["frames"] == 0), None)
    add("step_p99", "plain step", plain["span_plus_step"]["p99_ms"] if plain else None)
    longest = max((r for r in span_rows if r["frames"] > 0), key=lambda r: r["frames"], default=None)
    keys = (("one pass", "span_plus_step"), ("chunked", "chunked_plus_step"))
    ways = {way: longest[key]["p99_ms"] for way, key in keys if longest and key in longest}
    faster = min(ways, key=ways.__getitem__, default=None)
    add("span600_step_p99", f"{longest['frames'] if longest else '?'}-frame span + step ({faster or '?'}, the faster)",
        ways[faster] if faster else None)
    for phase in ("bench batch, CUDA graphs", "bench batch, eager"):
        batch = results.get(phase)
        batch_rows = batch.data.get("rows", []) if batch else []
        widest = max(batch_rows, key=lambda r: r["sessions"], default=None)
        frames = batch.data.get("span_frames", 256) if batch else 256
        sessions = widest["sessions"] if widest else 64  # what the target asks for, where nothing was measured
        refused = (batch.data.get("out_of_memory") or {}).get("sessions") if batch else None
        why = f" (out of memory at {refused} sessions)" if refused else ""
        add("tick64_span256_p99", f"{phase}: tick of {sessions} sessions + {frames}-frame span{why}",
            widest["tick_with_span"]["p99_ms"] if widest else None)
    return rows


KYUTAI_PHASE = "Kyutai's per-frame work (moshi LMGen, batch 1)"
WINDOW_PHASE = "window refill and history replay"


def anchor(results: dict[str, PhaseResult]) -> dict[str, Any] | None:
    """Ours beside Kyutai's, measured in this run on the same random model. Kyutai's server steps one session per
    process (encode, `LMGen.step`, decode a frame); ours steps every session in one batched tick of the same work.
    One session: our whole frame at batch 1 (`bench span`) against Kyutai's. Capacity: sessions x frames per second
    at the widest batch (1000 / tick P50 each) over Kyutai's 1000 / frame P50; real time: the most sessions whose
    tick P99 keeps the frame, over Kyutai's one per process."""
    kyutai, batch, span = (results.get(name) for name in (KYUTAI_PHASE, "bench batch, CUDA graphs", "bench span"))
    if not kyutai or "frame" not in kyutai.data:
        return None
    frame_ms, k = 1000 * FRAME_S, kyutai.data["frame"]
    kyutai_fps, kyutai_real_time = 1000 / k["p50_ms"], int(k["p99_ms"] <= frame_ms)
    out: dict[str, Any] = {"kyutai_frame_p50_ms": k["p50_ms"], "kyutai_frame_p99_ms": k["p99_ms"],
                           "kyutai_frames_per_s": kyutai_fps, "kyutai_real_time_sessions": kyutai_real_time}
    if span and "frame" in span.data:
        ours = span.data["frame"]
        out.update(ours_frame_p50_ms=ours["p50_ms"], ours_frame_p99_ms=ours["p99_ms"],
                   one_session_ratio=k["p50_ms"] / ours["p50_ms"])
    rows = batch.data.get("rows", []) if batch else []
    if rows:
        best = max(rows, key=lambda r: r["sessions"] / r["tick"]["p50_ms"])
        ours_fps = 1000 * best["sessions"] / best["tick"]["p50_ms"]
        real_time = max((r["sessions"] for r in rows if r["tick"]["p99_ms"] <= frame_ms), default=0)
        out.update(ours_sessions=best["sessions"], ours_tick_p50_ms=best["tick"]["p50_ms"], ours_frames_per_s=ours_fps,
                   capacity_ratio=ours_fps / kyutai_fps, ours_real_time_sessions=real_time,
                   real_time_ratio=real_time / kyutai_real_time if kyutai_real_time else None)
    return out


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} ms"


def markdown(report: dict[str, Any]) -> str:
    """The table benchmarks/README.md shows: where it ran, each target, Kyutai beside us, each phase."""
    env = report["environment"]
    where = f"{env.get('gpu') or env['device']}, torch {env.get('torch')} (CUDA {env.get('cuda')})"
    kind = "dry run: tiny sizes on a CPU, not GPU numbers" if report["dry_run"] else "random 7B, bf16"
    runs = report.get("runs", 1)
    calls = f" in {runs} calls (a phase's last run is shown)" if runs > 1 else ""
    lines = [f"GPU check on {where}; {kind}; {report['elapsed_s']:.0f} s of a {report['budget_s']:.0f} s budget"
             f"{calls}.", "",
             "| target | measured (P99) | limit | verdict |", "|---|---|---|---|"]
    for t in report["targets"]:
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "missed")
        lines.append(f"| {t['what']} | {_ms(t['p99_ms'])} | {t['limit_ms']:.0f} ms | {verdict} |")
    a = report.get("anchor")
    if a:
        lines += ["", "| per GPU, same lease, same random model | Kyutai (moshi `LMGen`, one session a process) | "
                  "contextspan | ours / Kyutai |", "|---|---|---|---|"]
        if "ours_frame_p50_ms" in a:
            lines.append(f"| one session's frame: encode + step + decode | P50 {_ms(a['kyutai_frame_p50_ms'])}, P99 "
                         f"{_ms(a['kyutai_frame_p99_ms'])} | P50 {_ms(a['ours_frame_p50_ms'])}, P99 "
                         f"{_ms(a['ours_frame_p99_ms'])} | {a['one_session_ratio']:.2f}x the speed |")
        if "capacity_ratio" in a:
            lines += [f"| one batched tick of the same work | | P50 {_ms(a['ours_tick_p50_ms'])} "
                      f"({a['ours_sessions']} sessions) | |",
                      f"| sessions x frames per second (capacity) | {a['kyutai_frames_per_s']:.0f} | "
                      f"{a['ours_frames_per_s']:.0f} | {a['capacity_ratio']:.1f}x |",
                      f"| sessions kept in real time (tick P99 <= 80 ms) | {a['kyutai_real_time_sessions']} | "
                      f"{a['ours_real_time_sessions']} | "
                      f"{'-' if a['real_time_ratio'] is None else format(a['real_time_ratio'], '.0f') + 'x'} |"]
        else:
            lines.append(f"| sessions x frames per second (capacity) | {a['kyutai_frames_per_s']:.0f} | not measured "
                         "(the batch phase failed) | - |")
    window = next((p for p in report["phases"] if p["name"] == WINDOW_PHASE and p.get("data")), None)
    if window:
        lines += ["", "| conversation | history | replay into a fresh engine (P50) | refill of the window after the "
                  "prefix in one tick (P50) | built ahead: a chunk's feed (P50) | swap (P50) |",
                  "|---|---|---|---|---|---|"]
        for r in window["data"]["rows"]:
            refill = (f"{_ms(r['refill']['p50_ms'])} ({r['refill_keep_frames']} frames)" if "refill" in r
                      else "not measured")
            chunks = ", ".join(f"{_ms(c['p50_ms'])} ({c['frames']} frames)" for c in r.get("ahead_chunks", []))
            swap = _ms(r["ahead_swap"]["p50_ms"]) if "ahead_swap" in r else "not measured"
            lines.append(f"| {r['minutes']:g} min ({r['frames']} frames) | {r['history_bytes'] / 1024:.0f} KiB, "
                         f"{r['bytes_per_s']:.0f} B/s | {_ms(r['replay']['p50_ms'])} | {refill} | "
                         f"{chunks or 'not measured'} | {swap} |")
    lines += ["", "| phase | outcome | seconds | call |", "|---|---|---|---|"]
    for phase in report["phases"]:
        why = f" ({phase['why'][:160]})" if phase["why"] else ""
        lines.append(f"| {phase['name']} | {phase['outcome']}{why} | {phase['seconds']:.0f} | {phase.get('run', 1)} |")
    return "\n".join(lines) + "\n"


def merged(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Runs of one lease as one report: a phase's later run replaces its earlier one (a second call after fixes),
    except that a later failure does not hide an earlier pass: the pass is kept and the failure said beside it. The
    targets and the comparison with Kyutai are worked out again from the phases kept."""
    phases: dict[str, dict[str, Any]] = {}
    for number, report in enumerate(reports, 1):
        for phase in report["phases"]:
            earlier = phases.get(phase["name"])
            if phase["name"] == "environment" and earlier:
                continue
            if earlier and earlier["outcome"] == "passed" and phase["outcome"] != "passed":
                earlier["why"] = f"call {number} {phase['outcome']}: {phase['why']}"
                continue
            phases[phase["name"]] = {**phase, "run": number}
    results = {name: PhaseResult(**{k: v for k, v in phase.items() if k != "run"}) for name, phase in phases.items()}
    last = reports[-1]
    return {**last, "budget_s": sum(r["budget_s"] for r in reports),
            "elapsed_s": sum(r["elapsed_s"] for r in reports), "runs": len(reports),
            "phases": list(phases.values()), "targets": target_rows(results), "anchor": anchor(results)}


def write_table(results: list[Path], target: Path) -> None:
    text = target.read_text()
    head, rest = text.split(TABLE_BEGIN)
    table = markdown(merged([json.loads(path.read_text()) for path in results]))
    target.write_text(f"{head}{TABLE_BEGIN}\n{table}{TABLE_END}{rest.split(TABLE_END, 1)[1]}")


def run(args: argparse.Namespace) -> int:
    started = float(os.environ.get("GPU_CHECK_STARTED", time.time()))  # the install counts against the budget
    args.out.mkdir(parents=True, exist_ok=True)
    log = Log(args.out / "gpu_check.log")
    sizes = Sizes.for_run(args.dry_run)
    log(f"gpu_check run: device {args.device}, budget {args.budget:.0f} s, dry run {args.dry_run}")
    results: dict[str, PhaseResult] = {}
    # A dry run checks the plumbing, not speed: one torch thread per process does not oversubscribe a shared CPU.
    extra_env = {"OMP_NUM_THREADS": "1"} if args.dry_run else {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        for phase in selected(phases(args, sizes), args.only):
            left = args.budget - (time.time() - started)
            log(f"\n=== {phase.name} ({left:.0f} s of the budget left)")
            result = run_phase(phase, left, Path(tmp), log, extra_env)
            results[phase.name] = result
            log(f"=== {phase.name}: {result.outcome} in {result.seconds:.1f} s {result.why}".rstrip())
    env = results["environment"].data or {"device": args.device}
    targets = target_rows(results)
    report = {"dry_run": args.dry_run, "device": args.device, "budget_s": args.budget,
              "elapsed_s": round(time.time() - started, 1), "sizes": asdict(sizes), "environment": env,
              "phases": [asdict(r) for r in results.values()], "targets": targets, "anchor": anchor(results)}
    path = args.out / f"gpu_check-{device_slug(env, args.dry_run)}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    log("\n=== summary" + (" (dry run: tiny sizes on a CPU, the targets are for random 7B on a GPU)"
                          if args.dry_run else ""))
    for r in results.values():
        log(f"{r.outcome:>9}  {r.seconds:6.1f} s  {r.name}" + (f": {r.why}" if r.why else ""))
    for t in targets:
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "MISSED")
        value = "-" if t["p99_ms"] is None else f"{t['p99_ms']:.2f}"
        log(f"target {t['target']}: {t['what']}: P99 {value} ms (limit {t['limit_ms']:.0f} ms) {verdict}")
    a = report["anchor"] or {}
    if "capacity_ratio" in a:
        log(f"Kyutai, one session a process: frame P50 {a['kyutai_frame_p50_ms']:.2f} ms; ours at "
            f"{a['ours_sessions']} sessions: tick P50 {a['ours_tick_p50_ms']:.2f} ms; sessions x frames/s "
            f"{a['ours_frames_per_s']:.0f} vs {a['kyutai_frames_per_s']:.0f}: {a['capacity_ratio']:.1f}x; "
            f"real time {a['ours_real_time_sessions']} vs {a['kyutai_real_time_sessions']}")
    log(f"results: {path.name}; {report['elapsed_s']:.0f} s of {args.budget:.0f}")
    return 0 if all(r.outcome == "passed" for r in results.values()) else 1


# equivalence ---------------------------------------------------------------------------------------------------
def equivalence(args: argparse.Namespace) -> int:
    """Next-step text logits after a span injected in one pass against the same columns fed one by one and against
    the span in graphed power-of-two chunks, and after steps and a span under CUDA graphs against eager, per
    profile, within `benchmarks.span_latency.logit_tolerance`."""
    import torch
    from moshi.utils.compile import no_cuda_graph

    from benchmarks.span_latency import logit_tolerance, next_step_logits
    from frontend_model.engine.chunked_prefill import SpanPrefill
    from frontend_model.loading.loader import load_model
    from server.settings import ServerSettings

    max_span = ServerSettings().max_span_frames  # the rings as served
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name in args.profiles.split(","):
        profile, reduced = name.removesuffix("-reduced"), name.endswith("-reduced")
        dtype = torch.float32 if profile == "tiny" else torch.bfloat16
        model = load_model(profile, device=args.device, dtype=dtype, reduced=reduced)
        one_pass = next_step_logits(model, args.frames, SpanPrefill.ONE_PASS, max_span)
        chunked = next_step_logits(model, args.frames, SpanPrefill.CHUNKED, max_span)
        stepwise = next_step_logits(model, args.frames, None, max_span)
        with no_cuda_graph():
            eager = next_step_logits(model, args.frames, SpanPrefill.ONE_PASS, max_span)
        scale = float(one_pass.abs().max())
        tolerance = logit_tolerance(dtype, scale)
        row = {"profile": name, "dtype": str(dtype), "frames": args.frames, "max_abs_logit": scale,
               "tolerance": tolerance, "one_pass_vs_stepwise": float((one_pass - stepwise).abs().max()),
               "chunked_vs_one_pass": float((chunked - one_pass).abs().max()),
               "graphed_vs_eager": float((one_pass - eager).abs().max()),
               "graphs": model.device.type == "cuda"}
        row["passed"] = all(row[k] <= tolerance for k in ("one_pass_vs_stepwise", "chunked_vs_one_pass",
                                                           "graphed_vs_eager"))
        rows.append(row)
        print(json.dumps(row), flush=True)
        del model
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    Path(args.json).write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


# profile ---------------------------------------------------------------------------------------------------------
def profile(args: argparse.Namespace) -> int:
    """Where a span + step's time goes on the random 7B: the span's write alone, the step after it and a plain
    step, each timed between device syncs; then torch.profiler over a few spans + steps, the operators that take
    the most device time and the most host time."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from benchmarks.span_latency import span_of_frames, summarise
    from frontend_model.engine.calibration import device_sync, time_call
    from frontend_model.engine.engine import GREEDY, Engine
    from frontend_model.loading.loader import load_model
    from server.settings import ServerSettings

    model = load_model("moshi-7b", device=args.device, reduced=args.reduced)
    sync, user = device_sync(model.device), torch.tensor(model.span.sine_codes)
    cuda = model.device.type == "cuda"
    result: dict[str, Any] = {"frames": args.frames, "device": str(model.device)}
    with Engine(model, GREEDY, max_span_frames=ServerSettings().max_span_frames) as engine:
        for _ in range(8):
            engine.step(user)
        result["plain_step"] = summarise([time_call(lambda: engine.step(user), sync) for _ in range(args.repeats)])
        for frames in args.frames:
            block = span_of_frames(model, frames)
            write, after = [], []
            for _ in range(args.repeats):
                write.append(time_call(lambda b=block: engine.inject(b), sync))
                after.append(time_call(lambda: engine.step(user), sync))
            result[f"span{frames}_write"], result[f"span{frames}_step_after"] = summarise(write), summarise(after)
        block = span_of_frames(model, args.frames[-1])
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        with torch_profile(activities=activities) as prof:
            for _ in range(3):
                engine.inject(block)
                engine.step(user)
                sync()
    averages = prof.key_averages()
    tables = {"by_device_time": averages.table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                               row_limit=25, max_name_column_width=70),
              "by_host_time": averages.table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=70)}
    result.update(tables)
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}: P50 {value['p50_ms']:.2f} ms, P99 {value['p99_ms']:.2f} ms", flush=True)
    for name, table in tables.items():
        print(f"--- {name} (3 x span of {args.frames[-1]} + step)\n{table}", flush=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


# window -----------------------------------------------------------------------------------------------------------
def window(args: argparse.Namespace) -> int:
    """What a long call costs on the random 7B: a session's history written to bytes and replayed into a fresh engine
    (issue 36: resume), and a full window refilled after its prefix (issue 37: the window that keeps the persona),
    each timed between device syncs after a conversation of `--minutes` (prefix, then spans up to that length); and
    the resumed slot's decoder warm-up (its receptive field of agent frames through the batched codec, graphed on a
    GPU: the other sessions' frames wait for it)."""
    import torch

    from benchmarks.span_latency import span_of_frames, summarise
    from frontend_model.engine.calibration import device_sync, time_call
    from frontend_model.engine.codec import BatchFrameCodec, decoder_receptive_field
    from frontend_model.engine.engine import GREEDY, Engine
    from frontend_model.engine.history import SessionHistory, replay, start_recording
    from frontend_model.engine.window import refill_window
    from frontend_model.loading.loader import load_model
    from frontend_model.span.build import build_prefix
    from server.settings import ServerSettings

    model = load_model(args.profile, device=args.device, reduced=args.reduced)
    sync, user = device_sync(model.device), torch.tensor(model.span.sine_codes)
    max_span = ServerSettings().max_span_frames
    prefix = build_prefix("You are a helpful travel assistant called Ada.", model.tokenizer, model.span, None,
                          model.lm.delays)
    assert prefix is not None
    result: dict[str, Any] = {"profile": args.profile, "device": str(model.device), "rows": []}
    warm = decoder_receptive_field(model.mimi)
    spoken = torch.randint(0, model.lm.card, (model.span.agent_codebooks, warm))
    codec = BatchFrameCodec(model.mimi, 1)
    codec.open()
    try:
        result["decoder_warmup"] = {"frames": warm, **summarise(
            [time_call(partial(codec.warm_decoder, 0, spoken), sync) for _ in range(args.repeats)])}
    finally:
        codec.close()
    print(json.dumps({"decoder_warmup": result["decoder_warmup"]}), flush=True)
    for minutes in args.minutes:
        frames = round(minutes * 60 / FRAME_S)
        with Engine(model, GREEDY, max_span_frames=max_span) as engine:
            start_recording(engine)
            engine.prefill(prefix)
            prefix_frames = int(engine._state().offsets[0])
            engine.step(user)
            while (left := frames - int(engine._state().offsets[0])) > 2:
                engine.inject(span_of_frames(model, min(left - 2, max_span)))
                engine.step(user)
            engine.step(user)
            history = SessionHistory.of(engine)
            blob = history.to_bytes()
            row: dict[str, Any] = {"minutes": minutes, "frames": history.offset, "prefix_frames": prefix_frames,
                                   "history_bytes": len(blob), "bytes_per_s": len(blob) / (history.offset * FRAME_S)}
            context = model.lm.context or 0
            keep = min(history.offset, context) - prefix_frames - args.margin
            if keep > 0 and history.offset <= context + max_span:
                columns = history.columns[:, -keep:]
                row["refill_keep_frames"] = keep
                row["refill"] = summarise([time_call(partial(refill_window, engine, 0, prefix_frames, columns), sync)
                                           for _ in range(args.repeats)])
                row["step_after_refill"] = summarise([time_call(lambda: engine.step(user), sync)])
                row.update(window_ahead(engine, prefix_frames, keep, args.repeats, sync))
        replays, after = [], []
        for _ in range(args.repeats):
            with Engine(model, GREEDY, max_span_frames=max_span) as fresh:
                replays.append(time_call(lambda f=fresh, b=blob: replay(f, SessionHistory.from_bytes(b)), sync))
                after.append(time_call(lambda f=fresh: f.step(user), sync))
        row["replay"], row["step_after_replay"] = summarise(replays), summarise(after)
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def window_ahead(engine: Any, prefix_frames: int, keep: int, repeats: int, sync: Any) -> dict[str, Any]:
    """The same window built ahead on a shadow row (what the server does by default): one chunk's feed at the sizes
    a batch of 1 to 16 would use, the rest fed at once, and the swap into the session's row."""
    from benchmarks.span_latency import summarise
    from frontend_model.engine.calibration import time_call
    from frontend_model.engine.window import WindowAhead
    from server.batching.window_policy import WindowPolicy

    policy = WindowPolicy.for_context(engine.model.lm.context or 0)
    largest = 1 << (engine.max_span_frames.bit_length() - 1)
    offset = int(engine._state().offsets[0])
    out: dict[str, Any] = {"ahead_chunks": []}
    for chunk in sorted({policy.ahead_chunk(slots, largest) for slots in (1, 4, 16)}):
        ahead = WindowAhead(engine, chunk)
        try:
            ahead.begin(0, prefix_frames, offset - keep)
            fed = [time_call(lambda a=ahead, c=chunk: a.feed(c), sync) for _ in range(repeats)]
            out["ahead_chunks"].append({"frames": chunk, **summarise(fed)})
            out["ahead_finish_frames"] = keep - repeats * chunk
            out["ahead_finish"] = summarise([time_call(lambda a=ahead: a.feed(keep), sync)])
            out["ahead_swap"] = summarise([time_call(ahead.swap, sync)])
        finally:
            ahead.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="every phase in priority order within the budget")
    run_parser.add_argument("--out", type=Path, required=True)
    run_parser.add_argument("--device", default=None, help="default: cuda, or cpu in a dry run")
    run_parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S, help="seconds, the install included")
    run_parser.add_argument("--dry-run", action="store_true", help="tiny profile, small sizes (a CPU check)")
    run_parser.add_argument("--only", type=lambda v: v.split(","), default=[],
                            help="comma list: run only the phases whose names contain one of these, in this order "
                            "(a second call after fixes), the environment first")
    eq = commands.add_parser("equivalence", help="one-pass vs stepwise and graphed vs eager next-step logits")
    eq.add_argument("--device", default="cuda")
    eq.add_argument("--profiles", default="tiny,moshi-7b", help="comma list; a -reduced suffix means --reduced")
    eq.add_argument("--frames", type=int, default=64, help="span frames")
    eq.add_argument("--json", type=Path, required=True)
    prof = commands.add_parser("profile", help="where a span + step's time goes (torch.profiler)")
    prof.add_argument("--device", default="cuda")
    prof.add_argument("--reduced", action="store_true", help="the tiny widths (a CPU)")
    prof.add_argument("--frames", type=lambda v: [int(x) for x in v.split(",")], default=[16, 256])
    prof.add_argument("--repeats", type=int, default=10)
    prof.add_argument("--json", type=Path, required=True)
    win = commands.add_parser("window", help="a history's replay and a window's refill after a long conversation")
    win.add_argument("--device", default="cuda")
    win.add_argument("--profile", default="moshi-7b")
    win.add_argument("--reduced", action="store_true", help="the tiny widths (a CPU)")
    win.add_argument("--minutes", type=lambda v: [float(x) for x in v.split(",")], default=[1.0, 4.0])
    win.add_argument("--margin", type=int, default=64, help="frames of the context left free after a refill")
    win.add_argument("--repeats", type=int, default=3)
    win.add_argument("--json", type=Path, required=True)
    table = commands.add_parser("table", help="put a results file's table between the markers of a Markdown file")
    table.add_argument("results", type=Path, nargs="+", help="one run's results, or several of one lease in order")
    table.add_argument("--write", type=Path, default=ROOT / "benchmarks" / "README.md")
    args = parser.parse_args(argv)
    if args.command == "table":
        write_table(args.results, args.write)
        return 0
    if args.command == "run" and args.device is None:
        args.device = "cpu" if args.dry_run else "cuda"
    if args.command == "profile":
        return profile(args)
    if args.command == "window":
        return window(args)
    return run(args) if args.command == "run" else equivalence(args)


if __name__ == "__main__":
    sys.exit(main())
