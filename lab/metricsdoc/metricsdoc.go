package metricsdoc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
)

// Metric is one family: its type and, per label, the values documented or
// seen (nil values: the documentation lists none).
type Metric struct {
	Type   string
	Labels map[string][]string
}

// Doc reads the metric tables of the section titled section ("## " +
// section) of the Markdown file at path: rows whose first cell is a
// `metric_name`, second its type, third its labels ("–" for none, else
// comma-separated `label` or `label` = `v1` \| `v2`).
func Doc(path, section string) (map[string]Metric, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseDoc(f, section)
}

var (
	tick  = regexp.MustCompile("`([^`]+)`")
	label = regexp.MustCompile("^`([a-z_]+)`(?:\\s*=\\s*(.+))?$")
)

func parseDoc(r io.Reader, section string) (map[string]Metric, error) {
	out := map[string]Metric{}
	in := false
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = strings.TrimPrefix(line, "## ") == section
			continue
		}
		if !in || !strings.HasPrefix(line, "| `") {
			continue
		}
		// Cells are split on " | ": "\|" inside a cell is an escaped bar.
		cells := strings.Split(strings.ReplaceAll(strings.Trim(line, "|"), `\|`, "\x00"), "|")
		if len(cells) < 4 {
			return nil, fmt.Errorf("row %q: want metric, type, labels, meaning", line)
		}
		name := tick.FindStringSubmatch(cells[0])
		if name == nil {
			return nil, fmt.Errorf("row %q names no metric", line)
		}
		m := Metric{Type: strings.TrimSpace(cells[1]), Labels: map[string][]string{}}
		if ls := strings.TrimSpace(cells[2]); ls != "–" && ls != "-" {
			for _, l := range splitLabels(ls) {
				g := label.FindStringSubmatch(strings.TrimSpace(l))
				if g == nil {
					return nil, fmt.Errorf("row %q: label %q", line, l)
				}
				var vals []string
				if g[2] != "" {
					for _, v := range strings.Split(g[2], "\x00") {
						vm := tick.FindStringSubmatch(strings.TrimSpace(v))
						if vm == nil {
							return nil, fmt.Errorf("row %q: value %q of label %s", line, v, g[1])
						}
						vals = append(vals, vm[1])
					}
					sort.Strings(vals)
				}
				m.Labels[g[1]] = vals
			}
		}
		out[name[1]] = m
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no metric table under %q", "## "+section)
	}
	return out, nil
}

// splitLabels splits "`a`, `b` = `x` \x00 `y`" at the commas between
// labels.
func splitLabels(s string) []string { return strings.Split(s, ",") }

// Scrape reads a Prometheus text exposition: every family's type and the
// label values of its series (histogram buckets' le and summaries'
// quantile left out).
func Scrape(text string) (map[string]Metric, error) {
	out := map[string]Metric{}
	seen := map[string]map[string]map[string]bool{}
	hasSeries := map[string]bool{}
	for _, line := range strings.Split(text, "\n") {
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			parts := strings.Fields(f)
			if len(parts) != 2 {
				return nil, fmt.Errorf("line %q", line)
			}
			out[parts[0]] = Metric{Type: parts[1], Labels: map[string][]string{}}
			seen[parts[0]] = map[string]map[string]bool{}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, labels, err := series(line)
		if err != nil {
			return nil, err
		}
		fam := name
		if _, ok := out[fam]; !ok {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, suf); ok {
					if _, ok := out[b]; ok {
						fam = b
					}
				}
			}
		}
		if _, ok := out[fam]; !ok {
			return nil, fmt.Errorf("series %q has no # TYPE", line)
		}
		hasSeries[fam] = true
		for k, v := range labels {
			if k == "le" || k == "quantile" {
				continue
			}
			if seen[fam][k] == nil {
				seen[fam][k] = map[string]bool{}
			}
			seen[fam][k][v] = true
		}
	}
	for fam := range out {
		if !hasSeries[fam] {
			delete(out, fam) // a TYPE line without a series serves nothing
		}
	}
	for fam, ls := range seen {
		if _, ok := out[fam]; !ok {
			continue
		}
		for k, vs := range ls {
			var vals []string
			for v := range vs {
				vals = append(vals, v)
			}
			sort.Strings(vals)
			out[fam].Labels[k] = vals
		}
	}
	return out, nil
}

var seriesRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+`)
var pairRe = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

func series(line string) (string, map[string]string, error) {
	g := seriesRe.FindStringSubmatch(line)
	if g == nil {
		return "", nil, fmt.Errorf("series line %q", line)
	}
	labels := map[string]string{}
	for _, p := range pairRe.FindAllStringSubmatch(g[2], -1) {
		labels[p[1]] = p[2]
	}
	return g[1], labels, nil
}

// Compare lists how scrape differs from doc for the families whose name
// starts with one of prefixes: each documented family must be served
// (but for those in absentOK) with its type and exactly its labels, every
// documented value of a label must have a series and no series may carry
// a value the documentation does not list; each served family must be
// documented.
func Compare(doc, scrape map[string]Metric, prefixes []string, absentOK ...string) []string {
	var diffs []string
	ours := func(name string) bool {
		return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) })
	}
	for name, d := range doc {
		if !ours(name) {
			continue
		}
		s, ok := scrape[name]
		if !ok {
			if !slices.Contains(absentOK, name) {
				diffs = append(diffs, fmt.Sprintf("%s: documented, not served", name))
			}
			continue
		}
		if s.Type != d.Type {
			diffs = append(diffs, fmt.Sprintf("%s: documented as a %s, served as a %s", name, d.Type, s.Type))
		}
		for l, dv := range d.Labels {
			sv, ok := s.Labels[l]
			if !ok {
				diffs = append(diffs, fmt.Sprintf("%s: documented label %s has no series", name, l))
				continue
			}
			if dv != nil && !slices.Equal(dv, sv) {
				diffs = append(diffs, fmt.Sprintf("%s: label %s has the values %v served, %v documented", name, l, sv, dv))
			}
		}
		for l := range s.Labels {
			if _, ok := d.Labels[l]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s: served with the undocumented label %s", name, l))
			}
		}
	}
	for name := range scrape {
		if _, ok := doc[name]; !ok && ours(name) {
			diffs = append(diffs, fmt.Sprintf("%s: served, not documented", name))
		}
	}
	sort.Strings(diffs)
	return diffs
}
