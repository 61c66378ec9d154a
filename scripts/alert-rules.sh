#!/usr/bin/env bash
# Checks deploy/prometheus/kvstream-rules.yml with promtool: its syntax, its
# unit tests (kvstream-rules.test.yml), and that the tests catch planted
# mistakes (a threshold moved, a label value swapped, a join dropped): a
# mutant the tests pass is a test that cannot fail. Skipped, saying so,
# without promtool (apt-get install prometheus).
set -euo pipefail
cd "$(dirname "$0")/../deploy/prometheus"
if ! command -v promtool >/dev/null; then
	echo "alert rule tests skipped: promtool not installed (apt-get install prometheus)"
	exit 0
fi
promtool check rules kvstream-rules.yml >/dev/null
promtool test rules kvstream-rules.test.yml

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp kvstream-rules.test.yml "$work/"
survived=0
while IFS= read -r edit; do
	[[ -z $edit || $edit == \#* ]] && continue
	sed "$edit" kvstream-rules.yml >"$work/kvstream-rules.yml"
	if cmp -s kvstream-rules.yml "$work/kvstream-rules.yml"; then
		echo "mutant does not apply (the rules changed?): $edit"
		survived=1
	elif promtool test rules "$work/kvstream-rules.test.yml" >/dev/null 2>&1; then
		echo "mutant survived the rule tests: $edit"
		survived=1
	fi
done <<'MUTANTS'
s/> 0.01$/> 0.1/
s/phase=~"detect|post|finish"/phase=~"post|finish"/
s/> 0.025$/> 0.25/
s/increase(kvstream_timeouts_total\[10m\])) > 0/increase(kvstream_timeouts_total[10m])) > 1/
s/\[10m\])) > 3/[10m])) > 4/
s/reason="device"/reason="endpoint"/
s/min(kvstream_healthy) == 0/max(kvstream_healthy) == 2/
s/deriv(sum(kvstream_active_contexts)\[30m:\]) > 0/deriv(sum(kvstream_active_contexts)[30m:]) >= 0/
s/(kvstream_decode_pages_kept_out) > 0/(kvstream_decode_pages_kept_out) > 4/
s/outcome="lost"/outcome="complete"/
s/reason=~"version|bad_input/reason=~"draining|bad_input/
s/reason=~"limit|busy|room_limit"/reason=~"busy|room_limit"/
s/(sum by (instance, job) (kvstream_decode_sessions_open) > 0)/(sum by (instance, job) (kvstream_decode_sessions_open) >= 0)/
s/outcome=~"failed|dropped|verify|bad_input|lost|timeout"/outcome=~"failed|dropped|verify|bad_input|lost|timeout|released"/
s/outcome="failed"}\[10m\])) > 0/outcome="failed"}[10m])) > 1/
s/\[15m\])) > 2/[15m])) > 3/
s/ or sum by (instance, job) (kvstream_node_batches_in_flight) > 0//
s/kvstream_node_registered) == 0/kvstream_node_registered) >= 0/
MUTANTS
[[ $survived == 0 ]] && echo "alert rules: every planted mistake caught"
exit $survived
