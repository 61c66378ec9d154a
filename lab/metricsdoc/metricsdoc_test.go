package metricsdoc

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const doc = "## Metrics\n\n| metric | type | labels | meaning |\n| --- | --- | --- | --- |\n" +
	"| `x_total` | counter | `reason` = `a` \\| `b` | X. |\n" +
	"| `y_seconds` | histogram | `part`, `phase` = `p` | Y. |\n" +
	"| `z` | gauge | – | Z. |\n\n## Other\n\n| `w` | gauge | – | not this section |\n"

const scrape = `# HELP x_total X.
# TYPE x_total counter
x_total{reason="a"} 0
x_total{reason="b"} 3
# TYPE y_seconds histogram
y_seconds_bucket{part="group",phase="p",le="0.1"} 1
y_seconds_sum{part="group",phase="p"} 0.05
y_seconds_count{part="group",phase="p"} 1
# TYPE z gauge
z 1
`

// TestCompareAgreesAndCatchesDrift: the documentation and the scrape
// agree; each planted drift (an undocumented label, a missing value, an
// extra value, a type, a family on either side) is reported.
func TestCompareAgreesAndCatchesDrift(t *testing.T) {
	d, err := parseDoc(strings.NewReader(doc), "Metrics")
	require.NoError(t, err)
	require.Len(t, d, 3, "only the section's table")
	s, err := Scrape(scrape)
	require.NoError(t, err)
	assert.Empty(t, Compare(d, s, []string{""}))

	for plant, want := range map[string]string{
		`x_total{reason="b"} 3`:      `x_total: label reason has the values [a] served, [a b] documented`,
		`z 1`:                        `z: documented, not served`,
		`x_total{reason="a"} 0`:      `x_total: label reason has the values [b] served, [a b] documented`,
		"# TYPE z gauge":             `series "z 1" has no # TYPE`,
		"# TYPE y_seconds histogram": `series "y_seconds_bucket{part=\"group\",phase=\"p\",le=\"0.1\"} 1" has no # TYPE`,
	} {
		s, err := Scrape(strings.Replace(scrape, plant+"\n", "", 1))
		if err != nil {
			assert.Contains(t, err.Error(), want, "removing %q", plant)
			continue
		}
		assert.Contains(t, Compare(d, s, []string{""}), want, "removing %q", plant)
	}
	for extra, want := range map[string]string{
		"x_total{reason=\"c\"} 1\n":               `x_total: label reason has the values [a b c] served, [a b] documented`,
		"# TYPE run_total counter\nrun_total 1\n": "run_total: served, not documented",
		"z{run=\"per_layer\"} 1\n":                "z: served with the undocumented label run",
		"# TYPE z counter\n":                      "z: documented as a gauge, served as a counter",
	} {
		s, err := Scrape(scrape + extra)
		require.NoError(t, err)
		assert.Contains(t, Compare(d, s, []string{""}), want, "adding %q", extra)
	}
	assert.Empty(t, Compare(d, map[string]Metric{}, []string{"q_"}), "other prefixes are not compared")
	assert.Empty(t, Compare(d, map[string]Metric{"x_total": d["x_total"], "y_seconds": d["y_seconds"]}, []string{""}, "z"), "absent by leave")
}
