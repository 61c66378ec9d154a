# kvstream: build, test, benchmark.
GO ?= go
PKGS := ./...

.PHONY: all build test vet fmt bench run fuzz

all: build

build:
	$(GO) build $(PKGS)

vet:
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

test: vet
	$(GO) test -race -count=1 -timeout 8m $(PKGS)

# The main job: a realistic prefill→decode workload, per layer vs monolithic.
run:
	$(GO) run ./cmd/kvstream sim

bench:
	$(GO) test -run='^$$' -bench=. -benchmem $(PKGS)

# A short run of every fuzz target (the corpus under testdata/fuzz is committed).
FUZZTIME ?= 10s
fuzz:
	@for t in $$($(GO) test -list '^Fuzz' ./cp | grep ^Fuzz); do \
		echo "fuzz cp $$t"; $(GO) test ./cp -run='^$$' -fuzz="^$$t$$" -fuzztime=$(FUZZTIME) || exit 1; done
