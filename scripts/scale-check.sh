#!/usr/bin/env bash
# --scale changes only the memory the sim holds (bytes per page are divided
# by it; page, block and message counts and the modeled link stay real), so
# the modeled figures must not move with it (docs/PERFORMANCE.md, "Scale
# and time scale"). Prints one row per scale; needs python3.
#   scripts/scale-check.sh [KVSTREAM_BINARY]
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}" # the Go release the project builds on (README)
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/kvstream
  go build -o "$bin" ./cmd/kvstream
fi
printf 'scale\tper_layer_exposed_ms\tratio\tland_p50_ms\tmono_exposed_ms\tmono_ratio\tmono_land_p50_ms\tbytes_equal\n'
for scale in 6 18 72; do
  "$bin" sim --scale "$scale" --json 2>/dev/null |
    python3 -c '
import json, sys
d = json.load(sys.stdin); p = d["per_layer"]; m = d["monolithic"]
print("\t".join(str(x) for x in (d["scale"], "%.3f" % p["exposed_ms"], "%.2f" % p["ratio_to_floor"],
    "%.3f" % p["exposed_phases_ms"]["land"]["p50"], "%.2f" % m["exposed_ms"], "%.2f" % m["ratio_to_floor"],
    "%.2f" % m["exposed_phases_ms"]["land"]["p50"], d["bytes_equal"])))'
done
