#!/usr/bin/env bash
# Builds raftlockd as a static binary (deploy/raftlockd) and the container
# image around it (FROM scratch: nothing is pulled).
#
#   scripts/docker-build.sh [IMAGE]     IMAGE defaults to raftlockd:local
set -euo pipefail
cd "$(dirname "$0")/.."

image="${1:-raftlockd:local}"
version="$(git describe --always --dirty 2>/dev/null || echo dev)"

# The binary runs in the engine's Linux, whatever this machine runs (macOS
# with Docker Desktop, an arm64 engine): build for its OS and architecture.
arch="$(docker version --format '{{.Server.Arch}}' 2>/dev/null || go env GOARCH)"

echo "building deploy/raftlockd ($version, linux/$arch)"
CGO_ENABLED=0 GOOS=linux GOARCH="$arch" go build -trimpath -ldflags "-s -w -X main.version=$version" -o deploy/raftlockd ./cmd/raftlockd
echo "building image $image"
docker build -t "$image" deploy
