#!/usr/bin/env bash
# The README's two commands:  scripts/dev.sh serve [contextspan serve flags]   |   scripts/dev.sh test [pytest args]
# Both set up .venv first (idempotent; skipped when nothing changed) and the Debian packages they use.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_VERSION="2.13.0"
MOSHI_VERSION="0.2.13"
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

setup_python() {
    local stamp=.venv/.contextspan-setup
    local want
    want="$(cat pyproject.toml scripts/dev.sh | sha256sum | cut -c1-16)-$1"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
        return
    fi
    [ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
    echo "contextspan: installing Python packages into .venv (torch $TORCH_VERSION, moshi $MOSHI_VERSION)" >&2
    # Without CONTEXTSPAN_TORCH_INDEX, PyPI's default torch build is taken (CUDA on Linux x86_64; it runs on CPU too).
    if [ -n "${CONTEXTSPAN_TORCH_INDEX:-}" ]; then
        .venv/bin/pip install -q "torch==$TORCH_VERSION" --index-url "$CONTEXTSPAN_TORCH_INDEX"
    else
        .venv/bin/pip install -q "torch==$TORCH_VERSION"
    fi
    # moshi pins torch<2.10 although its model code runs on 2.13; its other needs are in pyproject.toml.
    .venv/bin/pip install -q --no-deps "moshi==$MOSHI_VERSION"
    if [ "$1" = test ]; then
        # llama-cpp-python compiles (~8 min, once: pip caches the wheel). A portable build: a native one uses AMX
        # where the CPU has it, which crashes under hypervisors that do not enable it.
        CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF}" \
            .venv/bin/pip install -q -e ".[test]"
    else
        .venv/bin/pip install -q -e .
    fi
    echo "$want" > "$stamp"
}

setup_debian_packages() {
    local missing=()
    command -v espeak-ng >/dev/null || missing+=(espeak-ng)
    command -v sox >/dev/null || missing+=(sox)
    if [ "$1" = test ]; then
        command -v chromium >/dev/null || missing+=(chromium chromium-driver)
        command -v flite >/dev/null || missing+=(flite)  # the behaviour test set's unseen synthesizer
        compgen -G "/usr/lib/*/libopus.so.0" >/dev/null || missing+=(libopus0)  # for fujielab-moshi-client's opuslib
        command -v redis-server >/dev/null || missing+=(redis-server)  # the resume store's tests start their own
    fi
    if [ ${#missing[@]} -gt 0 ]; then
        echo "contextspan: installing Debian packages: ${missing[*]}" >&2
        as_root apt-get update -qq
        DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

export NO_TORCH_COMPILE="${NO_TORCH_COMPILE:-1}"

case "${1:-}" in
    serve)
        shift
        setup_python serve
        profile=()
        # Without a GPU and without --profile: the tiny Context Spanning model trained here (its committed weights;
        # a changed recipe trains once, with a progress bar: espeak-ng and sox speak its questions), which asks
        # for facts and says them.
        if ! printf '%s\n' "$@" | grep -q -- '^--profile' &&
            ! .venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
            setup_debian_packages serve
            profile=(--profile tiny-contextspan-trained)
        fi
        exec .venv/bin/contextspan serve "${profile[@]}" "$@"
        ;;
    test)
        shift
        setup_debian_packages test
        setup_python test
        .venv/bin/ruff check .
        # Two lanes (scripts/test_lanes.py); each names its slowest tests at the end: what to trim when the suite
        # nears CI's hour.
        exec .venv/bin/python scripts/test_lanes.py "$@"
        ;;
    *)
        echo "usage: scripts/dev.sh serve [flags] | scripts/dev.sh test [pytest args]" >&2
        exit 2
        ;;
esac
