package scalebench

import (
	"fmt"
	"io"
	"math"
	"strings"
)

// Metric is one figure of a row, by its JSON name.
type Metric struct {
	Name string
	Of   func(Row) (float64, bool)
}

// Metrics are the figures the slopes and the plot follow.
var Metrics = []Metric{
	{"layer_end_ns", func(r Row) (float64, bool) { return r.LayerEndNs, true }},
	{"boundary_ns", func(r Row) (float64, bool) { return r.BoundaryNs, true }},
	{"boundary_cpu_ns_per_context", func(r Row) (float64, bool) { return r.BoundaryCPUNsPerContext, true }},
	{"boundary_allocs", func(r Row) (float64, bool) { return r.BoundaryAllocs, true }},
	{"allocs_per_forward", func(r Row) (float64, bool) { return r.AllocsPerForward, true }},
	{"bytes_per_room", func(r Row) (float64, bool) { return r.BytesPerRoom, true }},
	{"end_cpu_ns_per_room", func(r Row) (float64, bool) { return r.EndCPUNsPerRoom, true }},
	{"plan_ms", func(r Row) (float64, bool) { return r.PlanMs, true }},
	{"writes_per_group", func(r Row) (float64, bool) { return r.WritesPerGroup, true }},
	{"ns_per_write", func(r Row) (float64, bool) { return r.NsPerWrite, true }},
	{"exposed_over_floor", func(r Row) (float64, bool) {
		if r.ExposedOverFloor == nil {
			return 0, false
		}
		return *r.ExposedOverFloor, true
	}},
}

// Axes are the axes in the order a report and the plot give them.
var Axes = []string{AxisRooms, AxisDestinations, AxisLayers, AxisFragmentation}

// Slope is a metric's fitted growth along an axis: the exponent b of
// metric ∝ value^b (least squares on log-log), over the axis's points
// where the metric is positive.
type Slope struct {
	Axis     string  `json:"axis"`
	Metric   string  `json:"metric"`
	Exponent float64 `json:"exponent"`
	Points   int     `json:"points"`
}

// Slopes fits every metric along every axis of rep with two points or more.
func Slopes(rep *Report) []Slope {
	var out []Slope
	for _, axis := range Axes {
		for _, m := range Metrics {
			xs, ys := series(rep, axis, m)
			if len(xs) < 2 {
				continue
			}
			out = append(out, Slope{Axis: axis, Metric: m.Name, Exponent: fit(xs, ys), Points: len(xs)})
		}
	}
	return out
}

// series returns the log of an axis's values and of a metric's positive
// figures along it.
func series(rep *Report, axis string, m Metric) (xs, ys []float64) {
	for _, r := range rep.Rows {
		if r.Axis != axis || r.Value <= 0 {
			continue
		}
		if v, ok := m.Of(r); ok && v > 0 {
			xs, ys = append(xs, math.Log(float64(r.Value))), append(ys, math.Log(v))
		}
	}
	return xs, ys
}

func fit(xs, ys []float64) float64 {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(ys))
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx == 0 {
		return 0
	}
	return sxy / sxx
}

// WriteSVG draws rep as four log-log panels, one per axis: each metric
// divided by its figure at the axis's first point, so that a line's slope
// is its growth exponent (flat: constant; 1: proportional).
func WriteSVG(w io.Writer, rep *Report) error {
	const (
		pw, ph   = 460.0, 300.0 // a panel
		ml, mt   = 50.0, 30.0   // its plot area's margins
		pwInner  = pw - ml - 20
		phInner  = ph - mt - 40
		legendH  = 120.0
		yMinDecs = -2.0 // 1/100 of the first point
		yMaxDecs = 4.0  // 10 000 times
	)
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" font-family="sans-serif" font-size="11">`+"\n", 2*pw, 2*ph+legendH)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, axis := range Axes {
		ox, oy := float64(i%2)*pw, float64(i/2)*ph
		var lo, hi float64 = math.Inf(1), math.Inf(-1)
		for _, r := range rep.Rows {
			if r.Axis == axis && r.Value > 0 {
				lo, hi = math.Min(lo, math.Log10(float64(r.Value))), math.Max(hi, math.Log10(float64(r.Value)))
			}
		}
		fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="13" font-weight="bold">%s (log-log; each metric ÷ its value at the first point)</text>`+"\n", ox+ml, oy+18, axis)
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", ox+ml, oy+mt, pwInner, phInner)
		if math.IsInf(lo, 0) {
			continue
		}
		if hi == lo {
			hi = lo + 1
		}
		px := func(v float64) float64 { return ox + ml + (math.Log10(v)-lo)/(hi-lo)*pwInner }
		py := func(ratio float64) float64 {
			d := math.Max(yMinDecs, math.Min(yMaxDecs, math.Log10(ratio)))
			return oy + mt + (yMaxDecs-d)/(yMaxDecs-yMinDecs)*phInner
		}
		for d := yMinDecs; d <= yMaxDecs; d++ {
			y := py(math.Pow(10, d))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%g×</text>`+"\n",
				ox+ml, y, ox+ml+pwInner, y, ox+ml-4, y+4, math.Pow(10, d))
		}
		for _, r := range rep.Rows {
			if r.Axis == axis && r.Value > 0 {
				x := px(float64(r.Value))
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%d</text>`+"\n", x, oy+mt+phInner+14, r.Value)
			}
		}
		for k, m := range Metrics {
			var pts []string
			var first float64
			for _, r := range rep.Rows {
				v, ok := m.Of(r)
				if r.Axis != axis || r.Value <= 0 || !ok || v <= 0 {
					continue
				}
				if first == 0 {
					first = v
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(float64(r.Value)), py(v/first)))
			}
			if len(pts) > 1 {
				fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[k%len(colors)], strings.Join(pts, " "))
			}
		}
	}
	for k, m := range Metrics {
		x, y := 20+float64(k%3)*300, 2*ph+20+float64(k/3)*22
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="3"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			x, y, x+24, y, colors[k%len(colors)], x+30, y+4, m.Name)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
