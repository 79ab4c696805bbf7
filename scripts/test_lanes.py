"""The whole suite in two lanes on one machine (`scripts/dev.sh test`).

`tests/frontend_model` (exact float32 equivalences, loading, training: CPU-bound, no clock in any outcome) runs at
the lowest CPU priority beside the rest (servers in real time, the browser, benchmarks), so that it takes what the
real-time tests leave of the machine's cores and never their frames' time. Arguments that name a test path run one
pytest as given; options alone go to both lanes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BESIDE = "tests/frontend_model"
NO_TESTS = 5  # pytest's exit code when a selection is empty
# While the real-time tests keep both cores busy (CPU-bound benchmarks, or a host with a core taken), the lane beside
# them waits: its hang guard is sized for that wait, not for its tests (the longest about a minute alone).
BESIDE_TIMEOUT_S = 2400
PYTEST = [sys.executable, "-m", "pytest", "-m", "", "--durations=30"]


# pytest's options whose value is the next argument (`-k tests` names no path)
VALUED = {"-k", "-m", "-p", "-c", "-o", "-r", "-W", "--deselect", "--ignore", "--ignore-glob", "--maxfail",
          "--durations", "--timeout", "--junitxml", "--basetemp", "--rootdir", "--confcutdir", "--log-level"}


def names_tests(args: list[str], root: Path = ROOT) -> bool:
    """Whether the arguments choose tests by path (`tests/e2e`, `tests/x.py::test_y`) rather than by options."""
    values = {i + 1 for i, arg in enumerate(args) if arg in VALUED}
    return any(i not in values and not arg.startswith("-") and (root / arg.split("::")[0]).exists()
               for i, arg in enumerate(args))


def outcome(codes: list[int]) -> int:
    """The suite's exit code: the first lane's failure, else 0; a lane whose options selected nothing fails only
    where no lane ran a test."""
    ran = [code for code in codes if code != NO_TESTS]
    if not ran:
        return NO_TESTS
    return next((code for code in ran if code), 0)


def run_lanes(args: list[str]) -> int:
    with tempfile.NamedTemporaryFile("w+", prefix="contextspan-lane-", suffix=".log", delete=False) as log:
        print(f"contextspan: {BESIDE} runs beside the other tests at the lowest CPU priority (its output: {log.name}, "
              "shown at the end)", flush=True)
        started = time.monotonic()
        beside = subprocess.Popen([*PYTEST, "-p", "no:cacheprovider", f"--timeout={BESIDE_TIMEOUT_S}", *args, BESIDE],
                                  cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, preexec_fn=lambda: os.nice(19))
        try:
            rest = subprocess.call([*PYTEST, *args, f"--ignore={BESIDE}"], cwd=ROOT)
            rest_s = time.monotonic() - started
            if beside.poll() is None:
                print(f"\ncontextspan: waiting for {BESIDE}", flush=True)
            beside_code = beside.wait()
        finally:
            if beside.poll() is None:
                beside.terminate()
                beside.wait()
        log.seek(0)
        print(f"\n{'=' * 30} {BESIDE} {'=' * 30}\n{log.read()}", flush=True)
    Path(log.name).unlink()
    print(f"contextspan: the other tests exited {rest} after {rest_s / 60:.1f} min; {BESIDE} exited {beside_code}; "
          f"the suite took {(time.monotonic() - started) / 60:.1f} min", flush=True)
    return outcome([rest, beside_code])


def main(args: list[str]) -> int:
    if names_tests(args):
        return subprocess.call([*PYTEST, *args], cwd=ROOT)
    return run_lanes(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
