#!/usr/bin/env bash
# A rolling update of the CPU Swarm stack keeps every call: scripts/swarm_check.sh [--calls N] [--after-s S]
#   [--base IMAGE] [--ca FILE | --no-ca] [--advertise ADDR] [--json FILE]
#
# 1. Builds the stack's images as scripts/image_check.sh builds its own (its functions: a local Debian base made
#    with debootstrap where no registry is reachable, BuildKit, host network, the CA bundle as a build secret): the
#    server (docker/Dockerfile), Redis (docker/Dockerfile.redis) and HAProxy (docker/Dockerfile.haproxy).
# 2. `docker swarm init` (where this machine is in no swarm yet; left again at the end), the API key and the resume
#    secret as Swarm secrets (from stdin: on no command line, in no log), `docker stack deploy` of
#    docker/swarm/stack.cpu.yml (two tiny CPU replicas behind HAProxy, Redis as the resume store), and waits until
#    both replicas' /readyz answer 200.
# 3. N calls (3) through HAProxy with contextspan_client: each streams speech without a pause on the real-time
#    schedule and asks a typed question, whose answer goes in as a span. Then `docker service update --force` (a
#    rolling update: stop-first, one task at a time; each drained replica hands its calls over through Redis) while
#    the calls go on, and 10 s more once every task is replaced.
# 4. Checks each call: one session id throughout, resumed at least once, never closed in a way it could not
#    recover from, agent audio and text after its last resume, and every resume's replayed history reaching past the
#    span's frame. The timings (update, audio gap at each resume) go to
#    benchmarks/results/swarm-rolling-update-cpu.json, passed or not; then `docker stack rm`.
# Needs root (dockerd, debootstrap), Debian's docker.io and a Docker CLI of version 24 or later for `docker stack`
# (the 20.10 CLI wants a `version` key in the file). About 5 minutes once the images are built; not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" scripts/swarm_check.py "$@"
