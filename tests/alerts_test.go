package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

var (
	rulesFile     = filepath.Join("..", "deploy", "prometheus", "kvstream-rules.yml")
	ruleTestsFile = filepath.Join("..", "deploy", "prometheus", "kvstream-rules.test.yml")
	observability = filepath.Join("..", "docs", "OBSERVABILITY.md")
)

type ruleFile struct {
	Groups []struct {
		Rules []struct {
			Alert string `yaml:"alert"`
			Expr  string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

type ruleTests struct {
	Tests []struct {
		Cases []struct {
			Alert string `yaml:"alertname"`
			Exp   []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// TestAlertRules checks what promtool cannot: that every metric a rule
// reads exists (a rule on a misspelt name never fires, and promtool's tests
// feed it the same misspelling), that every alert is documented, and that
// every alert has a test in which it fires. scripts/alert-rules.sh runs the
// tests themselves.
func TestAlertRules(t *testing.T) {
	var rules ruleFile
	b, err := os.ReadFile(rulesFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &rules))
	var cases ruleTests
	b, err = os.ReadFile(ruleTestsFile)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, &cases))
	doc, err := os.ReadFile(observability)
	require.NoError(t, err)

	// The metrics the docs list: the first cell of each table row.
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(kvstream_[a-z_]+)` \\|").FindAllSubmatch(doc, -1) {
		documented[string(m[1])] = true
	}
	require.NotEmpty(t, documented, "no metric table in %s", observability)
	alertsDoc, _, _ := strings.Cut(string(doc[strings.Index(string(doc), "## Alerts"):]), "\n## Per-request")

	fires := map[string]bool{}
	for _, g := range cases.Tests {
		for _, c := range g.Cases {
			if len(c.Exp) > 0 {
				fires[c.Alert] = true
			}
		}
	}

	metric := regexp.MustCompile(`kvstream_[a-z_]+`)
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert, "a rule without an alert name: %q", r.Expr)
			alerts = append(alerts, r.Alert)
			for _, m := range metric.FindAllString(r.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suffix)
				}
				assert.True(t, documented[base], "%s reads %s, which %s does not list", r.Alert, m, observability)
			}
			assert.True(t, strings.Contains(alertsDoc, "| `"+r.Alert+"` |"), "%s is not in the alerts table of %s", r.Alert, observability)
			assert.True(t, fires[r.Alert], "%s has no test in %s in which it fires", r.Alert, ruleTestsFile)
		}
	}
	require.GreaterOrEqual(t, len(alerts), 17)
	for _, m := range regexp.MustCompile("(?m)^\\| `(Kvstream[A-Za-z]+)` \\|").FindAllStringSubmatch(alertsDoc, -1) {
		assert.True(t, slices.Contains(alerts, m[1]), "%s documents %s, which %s does not define", observability, m[1], rulesFile)
	}
}
