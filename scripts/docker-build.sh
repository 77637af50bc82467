#!/usr/bin/env bash
# Builds raftlockd as a static binary (deploy/raftlockd) and the container
# image around it (FROM scratch: nothing is pulled).
#
#   scripts/docker-build.sh [IMAGE]     IMAGE defaults to raftlockd:local
set -euo pipefail
cd "$(dirname "$0")/.."

image="${1:-raftlockd:local}"
version="$(git describe --always --dirty 2>/dev/null || echo dev)"

echo "building deploy/raftlockd ($version)"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$version" -o deploy/raftlockd ./cmd/raftlockd
echo "building image $image"
docker build -t "$image" deploy
