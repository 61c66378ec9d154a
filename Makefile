# kvstream: build, test, benchmark.
SHELL := /bin/bash
GO ?= go
# The Go release the project builds and tests on: one with no known
# standard-library vulnerability (go.mod's toolchain line asks for it, and a
# machine's own Go fetches it from the module proxy when told to).
export GOTOOLCHAIN ?= go1.27.3
PKGS := ./...

.PHONY: all build test vet fmt bench run fuzz test-ucx test-ucx-1.18 test-alerts proto vulncheck overlay

all: build

build:
	$(GO) build $(PKGS)

# vet also refuses a file gofmt would change (the file is named).
vet:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change: $$unformatted (make fmt)"; exit 1; fi
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

# The control plane's messages. Needs protoc (apt-get install
# protobuf-compiler) and protoc-gen-go at go.mod's protobuf version
# (go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12).
proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc --go_out=. --go_opt=paths=source_relative messages/wire/wire.proto

# The tests run under the race detector, with protoactor-go's remote
# server.go patched to set gRPC's logger once at init instead of at every
# node start, a write that raced with the gRPC goroutines of a test's other
# nodes (scripts/test-overlay.sh says why and checks that the patch fits).
RACE := -race -modfile=.overlay/go.mod

overlay:
	@GO="$(GO)" scripts/test-overlay.sh

# The whole suite under -race. The reliability suite runs on its own so that
# its summary line is printed; the UCX transport's tests (and buildinfo's
# ucx-tagged TestReadUCX) run when libucx is installed (pkg-config ucx), and
# say so when not. The command's UCX tests
# start processes that mostly wait (heartbeats, drains, etcd): they run three
# at a time. The alert rules' tests run when promtool is installed.
test: vet overlay
	$(GO) test $(RACE) -count=1 -timeout 8m -skip '^TestReliability$$' $(PKGS)
	set -o pipefail; $(GO) test $(RACE) -count=1 -timeout 4m -run '^TestReliability$$' -v ./tests \
		| grep -E '^(reliability:|--- FAIL|FAIL|ok|panic)|reliability_test.go'
	@$(MAKE) --no-print-directory test-ucx
	@$(MAKE) --no-print-directory test-alerts

# deploy/prometheus's alert rules: promtool's unit tests, and planted
# mistakes they must catch (skipped, saying so, without promtool).
test-alerts:
	scripts/alert-rules.sh

test-ucx: overlay
	@if pkg-config --exists ucx 2>/dev/null; then \
		$(GO) vet -tags ucx ./hw/rdma/ucx/ ./cmd/kvstream/ ./lab/xferbench/ ./lab/buildinfo/ && \
		$(GO) test $(RACE) -count=1 -timeout 5m -tags ucx ./hw/rdma/ucx/ ./lab/xferbench/ ./lab/buildinfo/ && \
		$(GO) test $(RACE) -count=1 -timeout 2m -tags ucx -run 'UCX' ./tests/ && \
		$(GO) test $(RACE) -count=1 -timeout 6m -parallel 3 -tags ucx -run 'TwoProcess|AcrossProcesses|PeerKilled|UCX|Perftest|Readme|ClaimPattern' ./cmd/kvstream/; \
	else \
		echo "ucx tests skipped: libucx not installed (apt-get install libucx-dev ucx-utils)"; \
	fi

# The UCX transport's tests against Debian 13's UCX 1.18.1 in a chroot
# (root and the Debian mirror; skipped, saying so, without them).
test-ucx-1.18:
	scripts/ucx-1.18.sh

# The main job: a realistic prefill→decode workload, per layer vs monolithic.
run:
	$(GO) run ./cmd/kvstream sim

bench:
	$(GO) test -p 1 -run='^$$' -bench=. -benchmem $(PKGS)

# A short run of every fuzz target (seed corpora under testdata/fuzz are
# committed and also run by `make test`). The budget is a count of
# executions, not a duration: with a duration, Go 1.26's fuzz coordinator can
# fail a target with a bare "context deadline exceeded" when the time runs out
# while a worker is mid-call (golang/go#75804, fixed in Go 1.27), a flake that
# failed CI with no crasher written. A count has no deadline to race.
FUZZTIME ?= 50000x
fuzz:
	@for pkg in ./cp ./cp/reshard ./system ./trace ./lab/replay ./netsec ./decode ./decode/internal/core ./lab/simsession; do \
		for t in $$($(GO) test -list '^Fuzz' $$pkg | grep ^Fuzz); do \
			echo "fuzz $$pkg $$t"; $(GO) test $$pkg -run='^$$' -fuzz="^$$t$$" -fuzztime=$(FUZZTIME) || exit 1; \
		done; \
	done

# Known vulnerabilities that the code reaches, offline: the OSV data of the
# golang.org/x/vulndb module (from the module proxy), indexed by its
# cmd/indexdb, is govulncheck's database. Fails on any finding.
vulncheck:
	scripts/vulncheck.sh
