#!/usr/bin/env bash
# govulncheck against a local copy of the Go vulnerability database, so that
# CI needs no network beyond the Go module proxy: the OSV files of the
# golang.org/x/vulndb module are indexed by its cmd/indexdb and handed to
# govulncheck as a file:// database. Exits non-zero on any vulnerability the
# code (default build and the ucx build) reaches.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"

# Pinned: bump both when refreshing the database.
GOVULNCHECK_VERSION=v1.9.0
VULNDB_VERSION=v0.0.0-20261105234957-e22db6528018

work="${VULNCHECK_DIR:-$(mktemp -d)}"
mkdir -p "$work"
gobin="$work/bin"
GOBIN="$gobin" go install "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION"

src=$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
[ -d "$src/data/osv" ] || { echo "vulncheck: no OSV data in $src" >&2; exit 1; }
db="$work/db"
if [ ! -f "$db/index/db.json" ]; then
  rm -rf "$db"
  # indexdb is a main package of the vulndb module: run it from a throwaway
  # module so that this project's go.mod is untouched.
  mod="$work/indexdb-mod"
  mkdir -p "$mod"
  (cd "$mod" && [ -f go.mod ] || go mod init vulncheck-indexdb >/dev/null 2>&1)
  (cd "$mod" && GOFLAGS=-mod=mod go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$db")
fi
echo "vulncheck: govulncheck $GOVULNCHECK_VERSION, database golang.org/x/vulndb@$VULNDB_VERSION, $(go version)"
"$gobin/govulncheck" -db "file://$db" ./...
if pkg-config --exists ucx 2>/dev/null; then
  "$gobin/govulncheck" -db "file://$db" -tags ucx ./...
fi
