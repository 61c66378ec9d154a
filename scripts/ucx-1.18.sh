#!/usr/bin/env bash
# The UCX transport's tests against Debian 13's UCX 1.18.1 as well as the
# 1.13.1 that `make test` uses: a Debian 13 chroot (debootstrap, minbase,
# with libucx-dev) in which the package's tests build and run against that
# UCX, with this machine's Go, module cache and checkout bind-mounted. It
# then runs the fault that aborted a decode on both versions (a decode
# SIGSTOPped 15 s while its prefill streams; over UCX's RMA the decode
# aborts when it resumes) in the default write mode, which must survive.
#
# Needs root (debootstrap, chroot, bind mounts) and the Debian mirror. When
# either is missing it says so and exits 0: the step is an addition to
# `make test`, which runs everything against 1.13.1. A failed test exits
# non-zero. The chroot is kept in UCX118_DIR (default
# /var/tmp/kvstream-trixie) for the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
root="${UCX118_DIR:-/var/tmp/kvstream-trixie}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

skip() { echo "ucx-1.18: skipped: $*"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "needs root (debootstrap, chroot, mounts)"
command -v debootstrap >/dev/null || skip "no debootstrap (apt-get install debootstrap)"

if [ ! -x "$root/usr/bin/ucx_info" ] || [ ! -f "$root/usr/include/pthread.h" ]; then
  rm -rf "$root"
  mkdir -p "$root"
  if ! debootstrap --variant=minbase --include=libucx-dev,ucx-utils,pkg-config,gcc,libc6-dev \
      trixie "$root" "$mirror" >"$root.log" 2>&1; then
    tail -5 "$root.log"
    rm -rf "$root"
    skip "debootstrap of Debian 13 failed (no mirror?): see above"
  fi
fi

gomod=$(go env GOMODCACHE)
goroot=$(go env GOROOT)
repo=$(pwd)
mounts=()
cleanup() {
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() { # bind SRC DST: mount SRC at DST inside the chroot
  mkdir -p "$root$2"
  mount --bind "$1" "$root$2" || skip "cannot bind-mount $1 (no mount privilege?)"
  mounts+=("$root$2")
}
for d in /proc /sys /dev; do bind "$d" "$d"; done
bind "$goroot" /opt/go
bind "$gomod" /opt/gomod
bind "$repo" /src

# Everything the tests need is in the module cache already (`make test`
# downloaded it): no network from inside.
run() {
  chroot "$root" /usr/bin/env -i PATH=/opt/go/bin:/usr/bin:/bin HOME=/root \
    GOTOOLCHAIN="$GOTOOLCHAIN" GOMODCACHE=/opt/gomod GOPROXY=off GOFLAGS=-buildvcs=false \
    GOCACHE=/root/.cache/go-build /bin/bash -c "cd /src && $1"
}
echo "ucx-1.18: $(run 'pkg-config --modversion ucx') in $root"
run 'go test -race -count=1 -timeout 5m -tags ucx ./hw/rdma/ucx/'
run 'go build -tags ucx -o /tmp/kvstream-ucx118 ./cmd/kvstream'

# The pause: a decode stopped for longer than its prefill's heartbeat bound,
# then resumed with the prefill's writes still in its sockets.
run '
export UCX_TLS=tcp
/tmp/kvstream-ucx118 decode --listen 127.0.0.1:0 > /tmp/dec.log 2>&1 & dp=$!
for i in $(seq 100); do addr=$(sed -n "s/.*listening on \([^ ]*\) .*/\1/p" /tmp/dec.log); [ -n "$addr" ] && break; sleep 0.1; done
[ -n "$addr" ] || { cat /tmp/dec.log; exit 1; }
/tmp/kvstream-ucx118 prefill --decode "$addr" --heartbeat 3s --model small --requests 256 --prompt-tokens 8192 --chunk-tokens 1024 > /tmp/pre.log 2>&1 & pp=$!
for i in $(seq 300); do grep -q "forward 2/" /tmp/pre.log 2>/dev/null && break; sleep 0.1; done
grep -q "forward 2/" /tmp/pre.log || { echo "ucx-1.18: the prefill never got going:"; tail -3 /tmp/pre.log; exit 1; }
kill -STOP $dp; sleep 8; kill -CONT $dp; sleep 3
if ! kill -0 $dp 2>/dev/null; then echo "ucx-1.18: the decode died after its pause:"; grep -m1 -A8 -iE "assertion|fatal error|panic:|signal" /tmp/dec.log; exit 1; fi
kill $pp 2>/dev/null; wait $pp 2>/dev/null; kill $dp; wait $dp 2>/dev/null
echo "ucx-1.18: a decode paused past its prefill'"'"'s heartbeat bound resumed and served on"
'
