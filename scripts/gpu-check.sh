#!/usr/bin/env bash
# gpu-check.sh: run the hw/cuda/driver tests and benchmarks against a real GPU.
#
# The test binary is built with CGO_ENABLED=0 (purego loads libcuda.so.1 at
# run time), so it needs no Go toolchain, no CUDA toolkit and no C compiler
# where it runs: only glibc (it is dynamically linked against libc/libdl for
# dlopen) and, for the GPU tests to run rather than skip, the NVIDIA driver.
#
# Usage (from the repository root):
#   scripts/gpu-check.sh [all] [OUTDIR]  build here, then run (needs Go)
#   scripts/gpu-check.sh build [BINDIR]  only build BINDIR/driver.test (needs Go)
#   scripts/gpu-check.sh run [OUTDIR]    only run the prebuilt BINDIR/driver.test
#
#   OUTDIR  where gpu-check.txt (the full output) goes; default $OUT, else ./out
#   BINDIR  where the binary is; default $GPU_CHECK_BIN, else ./bin/gpu-check
#   GPU_CHECK_BENCHTIME  -test.benchtime for the benchmarks; default 2000x
#
# On a machine that has only a copy of the repository (e.g. the device
# machine), build first where Go is, carry bin/gpu-check along, and there run
#   scripts/gpu-check.sh run "$OUT"
#
# UCX step: where pkg-config finds UCX (libucx-dev), build also builds
# BINDIR/ucx.test (go test -c -tags ucx ./hw/rdma/ucx, cgo), and run runs its
# CUDA tests (TestCUDAMemoryOverUCX: host and device memory written through
# UCX, device memory registered with its memory type; TestMemoryTypeReachesUCX)
# when that binary is there and the machine's UCX libraries load it. Its
# output goes to OUTDIR/gpu-check-ucx.txt; its summary line says PASS, SKIP
# (no GPU, no UCX, or a UCX without CUDA transports) or FAILED.
#
# Exit status: 0 when everything passed or skipped, else the failing test
# binary's. The last lines say whether a GPU was found, how the UCX step
# went, and whether the run passed.
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}" # the Go release the project builds on (README)

cd "$(dirname "${BASH_SOURCE[0]}")/.."

mode=all
case "${1:-}" in
build | run | all)
	mode=$1
	shift
	;;
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
esac

bindir=${GPU_CHECK_BIN:-./bin/gpu-check}
outdir=${OUT:-./out}
if [[ $mode == build ]]; then
	bindir=${1:-$bindir}
else
	outdir=${1:-$outdir}
fi
bin=$bindir/driver.test
ucxbin=$bindir/ucx.test

build() {
	mkdir -p "$bindir"
	echo "gpu-check: building $bin (CGO_ENABLED=0)"
	CGO_ENABLED=0 go test -c -o "$bin" ./hw/cuda/driver
	if pkg-config --exists ucx 2>/dev/null; then
		echo "gpu-check: building $ucxbin (cgo, -tags ucx, UCX $(pkg-config --modversion ucx))"
		CGO_ENABLED=1 go test -c -tags ucx -o "$ucxbin" ./hw/rdma/ucx
	else
		echo "gpu-check: UCX development files not found (pkg-config ucx): $ucxbin not built"
		rm -f "$ucxbin"
	fi
}

# run_ucx runs the UCX step; it returns the test binary's status, 0 when
# the step is skipped.
run_ucx() {
	local log=$outdir/gpu-check-ucx.txt
	if [[ ! -x $ucxbin ]]; then
		echo "gpu-check: UCX CUDA: SKIP ($ucxbin not built: no UCX development files where it was built)" | tee -a "$outdir/gpu-check.txt"
		return 0
	fi
	{
		echo "# gpu-check UCX step $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
		if command -v ucx_info >/dev/null 2>&1; then
			ucx_info -v 2>&1 | head -1
			echo "# CUDA transports: $(ucx_info -d 2>/dev/null | grep -o 'Transport: cuda[a-z_]*' | sort -u | tr '\n' ' ')"
		else
			echo "# ucx_info: not installed"
		fi
	} >"$log"
	if ldd "$ucxbin" 2>/dev/null | grep -q 'libucp.*not found'; then
		echo "gpu-check: UCX CUDA: SKIP (this machine has no UCX libraries for $ucxbin)" | tee -a "$log" "$outdir/gpu-check.txt"
		return 0
	fi
	echo "gpu-check: running $ucxbin (UCX step), output in $log"
	local rc=0
	"$ucxbin" -test.v -test.count 1 -test.timeout 5m \
		-test.run 'TestCUDAMemoryOverUCX|TestMemoryTypeReachesUCX' 2>&1 | tee -a "$log" || rc=$?
	if [[ $rc -ne 0 ]]; then
		echo "gpu-check: UCX CUDA: FAILED (exit $rc)" | tee -a "$log" "$outdir/gpu-check.txt"
	elif grep -q -- '--- PASS: TestCUDAMemoryOverUCX' "$log"; then
		echo "gpu-check: UCX CUDA: PASS (host and device memory written through UCX)" | tee -a "$log" "$outdir/gpu-check.txt"
	else
		echo "gpu-check: UCX CUDA: SKIP ($(grep -m1 -o -E '(no CUDA driver|GPU found): .*' "$log" || echo 'see the log'))" | tee -a "$log" "$outdir/gpu-check.txt"
	fi
	return "$rc"
}

run() {
	if [[ ! -x $bin ]]; then
		echo "gpu-check: $bin not found; build it first: scripts/gpu-check.sh build" >&2
		exit 2
	fi
	mkdir -p "$outdir"
	local log=$outdir/gpu-check.txt
	{
		echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(uname -sm))"
		if command -v nvidia-smi >/dev/null 2>&1; then
			nvidia-smi -L 2>&1 || true
		else
			echo "# nvidia-smi: not installed"
		fi
	} >"$log"
	echo "gpu-check: running $bin, output in $log"
	local rc=0
	"$bin" -test.v -test.count 1 -test.timeout 10m \
		-test.run . -test.bench . -test.benchmem \
		-test.benchtime "${GPU_CHECK_BENCHTIME:-2000x}" 2>&1 | tee -a "$log" || rc=$?
	if grep -q 'GPU found:' "$log"; then
		echo "gpu-check: GPU found: $(grep -m1 -o 'GPU found: .*' "$log" | sed 's/^GPU found: //')" | tee -a "$log"
	elif grep -q 'no CUDA driver:' "$log"; then
		echo "gpu-check: NO GPU found; GPU tests skipped: $(grep -m1 -o 'no CUDA driver: .*' "$log" | sed 's/^no CUDA driver: //')" | tee -a "$log"
	else
		echo "gpu-check: could not tell whether a GPU was found (see $log)" | tee -a "$log"
	fi
	local urc=0
	run_ucx || urc=$?
	if [[ $rc -eq 0 ]]; then
		rc=$urc
	fi
	if [[ $rc -ne 0 ]]; then
		echo "gpu-check: FAILED (exit $rc)" | tee -a "$log"
	else
		echo "gpu-check: PASS" | tee -a "$log"
	fi
	return "$rc"
}

case $mode in
build) build ;;
run) run ;;
all)
	build
	run
	;;
esac
