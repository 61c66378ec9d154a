#!/usr/bin/env bash
# Sweep group size K against link bandwidth on the DeepSeek-V3-like preset
# (docs/PERFORMANCE.md, "Group size against link bandwidth"). Prints one
# tab-separated row per run. Needs python3 for the JSON.
#   scripts/sweep-group-link.sh [KVSTREAM_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-}
if [ -z "$bin" ]; then
  bin=$(mktemp -d)/kvstream
  go build -o "$bin" ./cmd/kvstream
fi
printf 'link_gbps\tK\tsubmits/fw\tfloor_ms\tper_layer_exposed_ms\tp99_ms\tratio\tmono_exposed_ms\tgain\tbytes_equal\n'
for link in 100 200 400 800; do
  for k in 1 2 4 8 16; do
    "$bin" sim --model dsv3 --requests 4 --prompt-tokens 98304 --chunk-tokens 16384 \
      --group "$k" --link-gbps "$link" --json 2>/dev/null |
      python3 -c '
import json, sys
d = json.load(sys.stdin); p = d["per_layer"]; m = d["monolithic"]
print("\t".join(str(x) for x in (d["link_gbps"], d["group_size"], p["submits_per_forward"],
    "%.2f" % d["floor_ms"], "%.2f" % p["exposed_ms"], "%.2f" % p["exposed"]["p99"],
    "%.2f" % p["ratio_to_floor"], "%.2f" % m["exposed_ms"], "%.1f" % d["exposed_gain"], d["bytes_equal"])))'
  done
done
