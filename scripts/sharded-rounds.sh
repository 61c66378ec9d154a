#!/usr/bin/env bash
# The sharded pairings of docs/PERFORMANCE.md ("Sharded runs"), run round
# robin (so that a noisy minute of the VM spreads over every pairing, not
# one), then one row per pairing: medians (and ranges) over the rounds of
# each run's per-layer and monolithic exposed time ÷ floor, the range of the
# runs' request p50s ÷ floor, and the monolithic / per-layer gain on the
# runs' means and on their request p50s. Needs python3.
#   scripts/sharded-rounds.sh [ROUNDS (default 4)] [KVSTREAM_BINARY]
set -euo pipefail
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}" # the Go release the project builds on (README)
cd "$(dirname "$0")/.."
rounds=${1:-4}
bin=${2:-}
out=$(mktemp -d)
if [ -z "$bin" ]; then
  bin=$out/kvstream
  go build -o "$bin" ./cmd/kvstream
fi
pairings=(
  "--model llama70b --prefill-tp 4 --decode-tp 4"
  "--model llama70b --prefill-tp 4 --decode-tp 8"
  "--model llama70b --prefill-tp 8 --decode-tp 8"
  "--model llama70b --prefill-tp 8 --decode-tp 8 --group 4"
  "--model llama70b --prefill-tp 4 --prefill-pp 2 --decode-tp 8"
  "--model llama70b --prefill-tp 4 --prefill-pp 2 --decode-tp 8 --group 4"
  "--model llama70b --prefill-tp 1 --prefill-pp 3 --decode-tp 2 --decode-pp 2"
  "--model llama70b --prefill-tp 1 --prefill-pp 3 --decode-tp 2 --decode-pp 2 --group 4"
  "--model llama70b --prefill-tp 8 --decode-tp 16"
  "--model dsv3 --prefill-tp 8 --decode-tp 8"
  "--model dsv3 --prefill-tp 8 --decode-tp 16"
)
for ((r = 1; r <= rounds; r++)); do
  for i in "${!pairings[@]}"; do
    # shellcheck disable=SC2086 # each pairing is a list of flags
    "$bin" sim ${pairings[$i]} --no-progress --json >"$out/r$r-p$i.json" 2>"$out/r$r-p$i.err" ||
      echo "round $r, ${pairings[$i]}: failed (see $out/r$r-p$i.err)" >&2
    echo "round $r pairing $i done, load $(cut -d' ' -f1 /proc/loadavg)" >&2
  done
done
printf '%s\n' "${pairings[@]}" >"$out/pairings"
python3 - "$out" <<'EOF'
import glob, json, statistics as st, sys
out = sys.argv[1]
names = open(out + "/pairings").read().splitlines()
print("| pairing | runs | per-layer floor | per-layer ÷ floor | request p50s ÷ floor | mono floor | mono ÷ floor | mono / per-layer (run means) | same, request p50s | bytes equal |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
rng = lambda v: "%.2f (%.2f-%.2f)" % (st.median(v), min(v), max(v))
for i, name in enumerate(names):
    pl, p50, mo, gain, gain50, eq = [], [], [], [], [], []
    floor = mfloor = 0.0
    for f in sorted(glob.glob("%s/r*-p%d.json" % (out, i))):
        try:
            d = json.load(open(f))
        except ValueError:
            continue  # a failed run: reported above
        x, m = d["per_layer"], d["monolithic"]
        floor, mfloor = x["floor_ms"], m["floor_ms"]
        pl.append(x["ratio_to_floor"]); p50.append(x["ratio_to_floor_dist"]["p50"]); mo.append(m["ratio_to_floor"])
        gain.append(m["exposed_ms"] / x["exposed_ms"])
        gain50.append(m["exposed_dist_ms"]["p50"] / x["exposed_dist_ms"]["p50"])
        eq.append(d["bytes_equal"])
    if not pl:
        print("| %s | 0 | | | | | | | | |" % name)
        continue
    print("| %s | %d | %.3f | %s | %.2f-%.2f | %.2f | %s | %.1f | %.1f | %s |" % (
        name, len(pl), floor, rng(pl), min(p50), max(p50), mfloor, rng(mo), st.median(gain), st.median(gain50), all(eq)))
EOF
