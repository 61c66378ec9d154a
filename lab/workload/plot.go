package workload

import (
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Rows of a panel, bottom to top.
const (
	rowFinish = iota
	rowLink
	rowGPU
)

// WritePNG draws forward and transfer for both modes, one above the other,
// on the same modeled time axis: the GPU's layer kernels, the batches on the
// link (post to completion), each room's finishes, and a mark at every
// request's TTFT. Per layer, transfers sit under the compute; monolithic,
// they start after each forward.
func (r *Report) WritePNG(w io.Writer) error {
	pl, mo := r.PerLayer.timeline, r.Monolithic.timeline
	if pl == nil || mo == nil {
		return fmt.Errorf("no timeline collected (run with Timeline set)")
	}
	end := max(pl.end(), mo.end())
	top := panel(fmt.Sprintf("per-layer (K = %d): exposed transfer %.2f ms, TTFT %.1f ms", r.GroupSize, r.PerLayer.ExposedMs, r.PerLayer.TTFTMs), pl, r.PerLayer, end)
	bottom := panel(fmt.Sprintf("monolithic post-forward send: exposed transfer %.2f ms, TTFT %.1f ms", r.Monolithic.ExposedMs, r.Monolithic.TTFTMs), mo, r.Monolithic, end)
	bottom.X.Label.Text = fmt.Sprintf("modeled time (ms) - %s, %d requests x %d tokens, link %g Gb/s", r.Model, r.Requests, r.PromptTokens, r.LinkGbitPerS)

	img := vgimg.New(16*vg.Inch, 7*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter, PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 4 * vg.Millimeter}
	cs := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(cs[0][0])
	bottom.Draw(cs[1][0])
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

func (tl *Timeline) end() float64 {
	var e time.Duration
	for _, s := range tl.Kernels {
		e = max(e, s.End)
	}
	for _, s := range tl.Batches {
		e = max(e, s.End)
	}
	for _, s := range tl.Finishes {
		e = max(e, s.End)
	}
	return msf(e)
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var (
	gpuColors  = []color.Color{color.RGBA{R: 70, G: 110, B: 180, A: 255}, color.RGBA{R: 120, G: 160, B: 220, A: 255}}
	linkColor  = color.NRGBA{R: 230, G: 120, B: 30, A: 110}
	finishCol  = color.NRGBA{R: 60, G: 160, B: 80, A: 160}
	ttftColor  = color.RGBA{R: 200, G: 30, B: 30, A: 255}
	rowHeights = 0.7
)

func panel(title string, tl *Timeline, m *ModeReport, end float64) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Min, p.X.Max = 0, end*1.02
	p.Y.Min, p.Y.Max = -0.6, 2.6
	p.Y.Tick.Marker = plot.ConstantTicks{{Value: rowFinish, Label: "finish"}, {Value: rowLink, Label: "link"}, {Value: rowGPU, Label: "GPU"}}
	p.Add(&spans{spans: tl.Kernels, row: rowGPU, color: func(i int, s Span) color.Color {
		return gpuColors[forwardIndex(tl, s)%2]
	}})
	p.Add(&spans{spans: tl.Batches, row: rowLink, color: func(int, Span) color.Color { return linkColor }})
	p.Add(&spans{spans: tl.Finishes, row: rowFinish, color: func(int, Span) color.Color { return finishCol }})
	var ttft []float64
	for _, rr := range m.PerRequest {
		ttft = append(ttft, rr.TTFTMs)
	}
	p.Add(&marks{at: ttft})
	return p
}

func forwardIndex(tl *Timeline, s Span) int {
	for k, e := range tl.ForwardEnds {
		if s.End <= e {
			return k
		}
	}
	return len(tl.ForwardEnds)
}

// spans draws intervals as bars on one row.
type spans struct {
	spans []Span
	row   float64
	color func(int, Span) color.Color
}

func (b *spans) Plot(c draw.Canvas, p *plot.Plot) {
	x, y := p.Transforms(&c)
	lo, hi := y(b.row-rowHeights/2), y(b.row+rowHeights/2)
	for i, s := range b.spans {
		x0, x1 := x(msf(s.Start)), x(msf(s.End))
		if x1-x0 < 0.5 { // keep sub-pixel spans visible
			x1 = x0 + 0.5
		}
		c.FillPolygon(b.color(i, s), []vg.Point{{X: x0, Y: lo}, {X: x1, Y: lo}, {X: x1, Y: hi}, {X: x0, Y: hi}})
	}
}

// marks draws a vertical line per TTFT.
type marks struct{ at []float64 }

func (m *marks) Plot(c draw.Canvas, p *plot.Plot) {
	x, y := p.Transforms(&c)
	sty := draw.LineStyle{Color: ttftColor, Width: vg.Points(1.2), Dashes: []vg.Length{vg.Points(3), vg.Points(2)}}
	for _, t := range m.at {
		c.StrokeLine2(sty, x(t), y(-0.55), x(t), y(2.55))
	}
}
