package keymetrics

import (
	"fmt"
	"io"
	"math"
	"reflect"

	"github.com/kvstream/kvstream/system"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Print prints the figures an operator checks first after a run:
// batches and bytes, chunk outcomes, timeouts, restarts and the finish and
// exposed-transfer quantiles. Quantiles are estimated from the histogram
// buckets the way PromQL's histogram_quantile does, so they match a
// dashboard, not the exact sample. It prints nothing when g is nil or holds
// no kvstream figures.
func Print(w io.Writer, g prometheus.Gatherer) {
	if g == nil {
		return
	}
	if v := reflect.ValueOf(g); v.Kind() == reflect.Pointer && v.IsNil() {
		return
	}
	mfs, err := g.Gather()
	if err != nil && len(mfs) == 0 {
		fmt.Fprintf(w, "metrics: %v\n", err)
		return
	}
	fam := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		fam[mf.GetName()] = mf
	}
	if fam[system.MetricBatches] == nil && fam[system.MetricChunks] == nil {
		return
	}
	fmt.Fprintf(w, "metrics: batches %.0f ok, %.0f failed; %s in %.0f blocks posted\n",
		sum(fam[system.MetricBatches], "result", "ok"), sum(fam[system.MetricBatches], "result", "failed"),
		formatBytes(sum(fam[system.MetricPostedBytes], "", "")), sum(fam[system.MetricPostedBlocks], "", ""))
	fmt.Fprintf(w, "metrics: chunks %.0f success, %.0f failed, %.0f dropped; timeouts %.0f; submitter restarts %.0f\n",
		sum(fam[system.MetricChunks], "status", "success"), sum(fam[system.MetricChunks], "status", "failed"),
		sum(fam[system.MetricChunks], "status", "dropped"), sum(fam[system.MetricTimeouts], "", ""),
		sum(fam[system.MetricSubmitterRestarts], "", ""))
	fmt.Fprintf(w, "metrics: finish %s; exposed transfer %s\n",
		Quantiles(fam[system.MetricFinishSeconds], "", ""), Quantiles(fam[system.MetricExposedTransfer], "", ""))
	if mf := fam[system.MetricExposedPhase]; mf != nil {
		fmt.Fprintf(w, "metrics: exposed phases: detect %s; post %s; land %s; finish %s\n",
			Quantiles(mf, "phase", "detect"), Quantiles(mf, "phase", "post"),
			Quantiles(mf, "phase", "land"), Quantiles(mf, "phase", "finish"))
	}
	if err != nil {
		fmt.Fprintf(w, "metrics: (partial: %v)\n", err)
	}
}

// sum adds up the counter or gauge series of mf whose label name has value
// (every series when name is empty).
func sum(mf *dto.MetricFamily, name, value string) float64 {
	var s float64
	for _, m := range mf.GetMetric() {
		if name != "" && !hasLabel(m, name, value) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			s += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			s += m.GetGauge().GetValue()
		}
	}
	return s
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name {
			return lp.GetValue() == value
		}
	}
	return false
}

// Quantiles returns "p50 ≈ X, p99 ≈ Y (n samples)" for a histogram family,
// merging its series whose label name has value (every series when name is
// empty; they share kvstream's buckets). Under 100 samples a p99 is the
// maximum, and the buckets only bound it: "max ≤ Y".
func Quantiles(mf *dto.MetricFamily, name, value string) string {
	var n uint64
	cum := map[float64]uint64{}
	var bounds []float64
	for _, m := range mf.GetMetric() {
		h := m.GetHistogram()
		if h == nil || (name != "" && !hasLabel(m, name, value)) {
			continue
		}
		n += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			ub := b.GetUpperBound()
			if _, ok := cum[ub]; !ok {
				bounds = append(bounds, ub)
			}
			cum[ub] += b.GetCumulativeCount()
		}
	}
	if n == 0 {
		return "no samples"
	}
	// Series of one family share their bounds, in increasing order.
	counts := make([]uint64, len(bounds))
	for i, ub := range bounds {
		counts[i] = cum[ub]
	}
	q := func(p float64) string {
		s, ok := BucketQuantile(p, bounds, counts, n)
		if !ok {
			return "> " + duration(s)
		}
		return "≈ " + duration(s)
	}
	if n < 100 {
		top, ok := BucketQuantile(1, bounds, counts, n)
		tail := "≤ " + duration(top)
		if !ok {
			tail = "> " + duration(top)
		}
		return fmt.Sprintf("p50 %s, max %s (%d samples)", q(0.5), tail, n)
	}
	return fmt.Sprintf("p50 %s, p99 %s (%d samples)", q(0.5), q(0.99), n)
}

// BucketQuantile interpolates linearly inside the bucket that holds rank
// p·n, as histogram_quantile does. ok is false when the rank lies beyond the
// last finite bound: then the value is that bound, a lower limit.
func BucketQuantile(p float64, bounds []float64, counts []uint64, n uint64) (v float64, ok bool) {
	rank := p * float64(n)
	lower, below := 0.0, uint64(0)
	for i, ub := range bounds {
		if math.IsInf(ub, 1) {
			break
		}
		if float64(counts[i]) >= rank {
			in := counts[i] - below
			if in == 0 {
				return ub, true
			}
			return lower + (ub-lower)*(rank-float64(below))/float64(in), true
		}
		lower, below = ub, counts[i]
	}
	return lower, false
}

// duration prints seconds with three significant digits in the unit
// that suits them: bucket estimates carry no more precision than that.
func duration(s float64) string {
	switch {
	case s >= 1:
		return fmt.Sprintf("%.3gs", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.3gms", s*1e3)
	}
	return fmt.Sprintf("%.3gµs", s*1e6)
}

func formatBytes(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
