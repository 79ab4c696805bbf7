#!/usr/bin/env bash
# Build the server image and prove it serves: scripts/image_check.sh [--base IMAGE] [--ca FILE | --no-ca]
#
# 1. A base image: --base IMAGE, else a local Debian base made once with debootstrap from this machine's Debian
#    archive (for machines that reach no image registry), else the Dockerfile's default CUDA image.
# 2. `docker build` (BuildKit, host network) with the CA bundle as a secret (--ca, default the system bundle, which
#    holds a TLS-intercepting proxy's CA where there is one); its time and the image size are recorded.
# 3. Runs it on the tiny profile (host network), waits for the HEALTHCHECK to say healthy, converses with it through
#    the client library (handshake, audio back for the input, a span injected at a forced <ret>), checks that it
#    runs as uid 10001 and that the recording landed in its volume, and that the CA is in no layer.
# The result JSON goes to benchmarks/results/image-check-<machine>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/image_check.py "$@"
