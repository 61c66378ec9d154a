package workload

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/kvstream/kvstream/system"
)

// Timeline is one mode's run as spans on tracks, in modeled time since the
// start of the run.
type Timeline struct {
	Kernels []Span // the GPU track: one per layer kernel
	Waits   []Span // per submitter: event waits (they overlap: async)
	Batches []Span // per submitter: post → completion (the land phase)
	// Detects and Posts are the other phases of each batch: its event
	// completed on the device → the wait returned, and → posted.
	Detects, Posts []Span
	Finishes       []Span // room tracks: Finish call → return
	ForwardEnds    []time.Duration
}

// Span is one interval on a track.
type Span struct {
	Track      int // submitter or room; 0 on the GPU track
	Name       string
	Start, End time.Duration
	Bytes      float64
	// Args are shown with the span (a finish's exposed phases, in ms).
	Args map[string]float64
}

func buildTimeline(cfg Config, col *collector, t0 time.Time, forwardEnds []time.Time) *Timeline {
	at := func(t time.Time) time.Duration { return time.Duration(float64(t.Sub(t0)) * cfg.TimeScale) }
	tl := &Timeline{}
	for _, name := range col.order {
		k := col.kernels[name]
		tl.Kernels = append(tl.Kernels, Span{Name: name, Start: at(k.Start), End: at(k.End)})
	}
	for _, b := range col.batches {
		label := fmt.Sprintf("room %d chunk %d %s", b.Chunk.Room, b.Chunk.Start, seqName(b.Seq))
		tl.Waits = append(tl.Waits, Span{Track: b.Submitter, Name: "wait " + label, Start: at(b.WaitStart), End: at(b.WaitEnd)})
		tl.Batches = append(tl.Batches, Span{Track: b.Submitter, Name: label, Start: at(b.Posted), End: at(b.Done), Bytes: float64(b.Bytes)})
		if !b.EventDone.IsZero() {
			tl.Detects = append(tl.Detects, Span{Track: b.Submitter, Name: "detect " + label, Start: at(b.EventDone), End: at(b.WaitEnd)})
		}
		tl.Posts = append(tl.Posts, Span{Track: b.Submitter, Name: "post " + label, Start: at(b.WaitEnd), End: at(b.Posted)})
	}
	for _, f := range col.finishes {
		sp := Span{Track: f.room, Name: fmt.Sprintf("finish chunk %d: %s", f.chunk.Start, f.status), Start: at(f.call), End: at(f.ret)}
		if !f.stats.ForwardDone.IsZero() {
			ph := splitExposed(f.stats.ForwardDone, f.stats, f.ret)
			sp.Args = map[string]float64{"exposed_ms": msf(at(f.ret) - at(f.stats.ForwardDone))}
			for i, n := range exposedPhaseNames {
				sp.Args["exposed_"+n+"_ms"] = float64(ph[i]) * cfg.TimeScale / float64(time.Millisecond)
			}
		}
		tl.Finishes = append(tl.Finishes, sp)
	}
	for _, e := range forwardEnds {
		tl.ForwardEnds = append(tl.ForwardEnds, at(e))
	}
	sort.Slice(tl.Batches, func(i, j int) bool { return tl.Batches[i].Start < tl.Batches[j].Start })
	return tl
}

func seqName(seq int) string {
	if seq == system.RestSeq {
		return "rest"
	}
	return fmt.Sprintf("group %d", seq)
}

// traceEvent is the Chrome/Perfetto trace-event format (JSON object form).
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"` // microseconds
	Dur  float64        `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	ID   string         `json:"id,omitempty"`
	S    string         `json:"s,omitempty"` // an instant event's scope
	Args map[string]any `json:"args,omitempty"`
}

const (
	tidGPU        = 1
	tidSubmitter  = 100  // + submitter index: event waits
	tidRoom       = 1000 // + room: finishes
	tidForwardEnd = 2
)

// WriteTrace writes both modes as one Chrome/Perfetto trace: process 1 is
// the per-layer run, process 2 the monolithic one; the GPU track holds the
// layer kernels, room tracks the finishes (one Finish at a time per room,
// so complete slices never overlap there; their args hold the exposed
// phases). A submitter waits on several events at once, so waits and the
// batch phases (detect, post, land) are async slices, one row each.
func (r *Report) WriteTrace(w io.Writer) error {
	var evs []traceEvent
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	for pid, m := range map[int]*ModeReport{1: r.PerLayer, 2: r.Monolithic} {
		if m == nil || m.timeline == nil {
			return fmt.Errorf("no timeline collected (run with Timeline set)")
		}
		name := "per-layer"
		if pid == 2 {
			name = "monolithic"
		}
		evs = append(evs,
			traceEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": name}},
			traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: tidGPU, Args: map[string]any{"name": "GPU compute stream"}},
		)
		tl := m.timeline
		for _, k := range tl.Kernels {
			evs = append(evs, traceEvent{Name: k.Name, Cat: "compute", Ph: "X", Ts: us(k.Start), Dur: us(k.End - k.Start), Pid: pid, Tid: tidGPU})
		}
		seen := map[int]bool{}
		for _, s := range tl.Waits {
			if !seen[tidSubmitter+s.Track] {
				seen[tidSubmitter+s.Track] = true
				evs = append(evs, traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: tidSubmitter + s.Track, Args: map[string]any{"name": fmt.Sprintf("submitter %d", s.Track)}})
			}
		}
		async := func(cat, prefix string, spans []Span, args func(Span) map[string]any) {
			for i, s := range spans {
				id := fmt.Sprintf("%d-%s-%d", pid, prefix, i)
				var a map[string]any
				if args != nil {
					a = args(s)
				}
				evs = append(evs,
					traceEvent{Name: s.Name, Cat: cat, Ph: "b", Ts: us(s.Start), Pid: pid, Tid: tidSubmitter + s.Track, ID: id, Args: a},
					traceEvent{Name: s.Name, Cat: cat, Ph: "e", Ts: us(s.End), Pid: pid, Tid: tidSubmitter + s.Track, ID: id})
			}
		}
		async("event_wait", "w", tl.Waits, nil)
		async("detect", "d", tl.Detects, nil)
		async("post", "p", tl.Posts, nil)
		async("transfer", "t", tl.Batches, func(s Span) map[string]any { return map[string]any{"bytes_moved": s.Bytes, "submitter": s.Track} })
		for _, s := range tl.Finishes {
			if !seen[tidRoom+s.Track] {
				seen[tidRoom+s.Track] = true
				evs = append(evs, traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: tidRoom + s.Track, Args: map[string]any{"name": fmt.Sprintf("room %d", s.Track)}})
			}
			var args map[string]any
			if s.Args != nil {
				args = map[string]any{}
				for k, v := range s.Args {
					args[k] = v
				}
			}
			evs = append(evs, traceEvent{Name: s.Name, Cat: "finish", Ph: "X", Ts: us(s.Start), Dur: us(s.End - s.Start), Pid: pid, Tid: tidRoom + s.Track, Args: args})
		}
		for k, e := range tl.ForwardEnds {
			evs = append(evs, traceEvent{Name: fmt.Sprintf("forward %d ends", k+1), Ph: "i", Ts: us(e), Pid: pid, Tid: tidGPU, S: "p"})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Pid < evs[j].Pid })
	enc := json.NewEncoder(w)
	return enc.Encode(map[string]any{"traceEvents": evs, "displayTimeUnit": "ms"})
}
