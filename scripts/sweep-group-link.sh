#!/usr/bin/env bash
# Sweep group size K against link bandwidth on the DeepSeek-V3-like preset
# (docs/PERFORMANCE.md, "Group size against link bandwidth"). Prints one
# tab-separated row per run: the ideal floor and the exposed time of each
# mode (ms), the ratios to their own floors, the per-layer tail ("max" of
# the 4 requests: a p99 of 4 samples would be the max under another name)
# and the median phases of the per-layer exposed time. Needs python3.
#   scripts/sweep-group-link.sh [KVSTREAM_BINARY]
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}" # the Go release the project builds on (README)
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/kvstream
  go build -o "$bin" ./cmd/kvstream
fi
printf 'link_gbit_per_s\tK\tsubmits/fw\tfloor_ms\tper_layer_exposed_ms\tmax_ms\tratio\tdetect_p50\tpost_p50\tland_p50\tfinish_p50\tmono_floor_ms\tmono_exposed_ms\tmono_ratio\tgain\tbytes_equal\n'
for link in 100 200 400 800; do
  for k in 1 2 4 8 16; do
    "$bin" sim --model dsv3 --requests 4 --prompt-tokens 98304 --chunk-tokens 16384 \
      --group "$k" --link-gbps "$link" --json 2>/dev/null |
      python3 -c '
import json, sys
d = json.load(sys.stdin); p = d["per_layer"]; m = d["monolithic"]; ph = p["exposed_phases_ms"]
print("\t".join(str(x) for x in (d["link_gbit_per_s"], d["group_size"], p["submits_per_forward"],
    "%.3f" % p["floor_ms"], "%.3f" % p["exposed_ms"], "%.3f" % p["exposed_dist_ms"]["max"], "%.2f" % p["ratio_to_floor"],
    "%.3f" % ph["detect"]["p50"], "%.3f" % ph["post"]["p50"], "%.3f" % ph["land"]["p50"], "%.3f" % ph["finish"]["p50"],
    "%.2f" % m["floor_ms"], "%.2f" % m["exposed_ms"], "%.2f" % m["ratio_to_floor"], "%.1f" % d["exposed_gain"], d["bytes_equal"])))'
  done
done
