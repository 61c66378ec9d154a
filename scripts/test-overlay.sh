#!/usr/bin/env bash
# Prepares the module file `make test` builds its -race tests with
# (`go help build`, -modfile): go.mod with protoactor-go replaced by a copy
# in .overlay/ whose remote/server.go is scripts/testdata/protoactor/server.go.
# It checks that the patched file still fits the module version go.mod asks
# for.
#
# What it patches: protoactor-go's remote.Start sets gRPC's process-wide
# logger (grpclog.SetLoggerV2) every time a node starts. gRPC reads that
# global unsynchronised whenever it logs, from its own goroutines (a server
# starting to serve, a client connection closing), and asks that it be set
# only at init. A deployed process starts one node, before its transfers; a
# test process starts many, one after another and side by side, and the race
# detector reported the write against the gRPC goroutines of another node
# (decode's tests, one full run in about ten on a loaded machine). The copy
# is the same file with the logger set once, in an init function. Builds
# outside `make test` (the command, `go test` by hand) use protoactor as it
# is.
set -euo pipefail
cd "$(dirname "$0")/.."
go="${GO:-go}"
out=.overlay
mod=github.com/asynkron/protoactor-go
# sha256 of the upstream remote/server.go at go.mod's version: when
# protoactor-go is upgraded this stops `make test` until the copy is
# re-derived from the new file (or dropped, once upstream sets the logger
# once).
want=07ca73d9f0fa272039f91c0de8f8cc08614e65205f89be63c73efd3216b03e57

dir=$("$go" list -m -f '{{.Dir}}' "$mod")
if [ -z "$dir" ]; then
  "$go" mod download "$mod"
  dir=$("$go" list -m -f '{{.Dir}}' "$mod")
fi
got=$(sha256sum "$dir/remote/server.go" | cut -d' ' -f1)
if [ "$got" != "$want" ]; then
  echo "test-overlay: $dir/remote/server.go is not the file scripts/testdata/protoactor/server.go was derived from (sha256 $got, want $want): re-derive the copy from it and update want in $0" >&2
  exit 1
fi
# A copy left half made (its files read-only, as in the module cache)
# would stop rm.
[ -d "$out/protoactor-go" ] && chmod -R u+w "$out/protoactor-go"
rm -rf "$out/protoactor-go"
mkdir -p "$out"
cp -r "$dir" "$out/protoactor-go"
chmod -R u+w "$out/protoactor-go"
cp scripts/testdata/protoactor/server.go "$out/protoactor-go/remote/server.go"
cp go.sum "$out/go.sum"
# Relative to the module's root, which go resolves it against with
# -modfile too.
{ cat go.mod; echo; echo "replace $mod => ./$out/protoactor-go"; } >"$out/go.mod"
