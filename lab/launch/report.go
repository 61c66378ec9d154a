package launch

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// BatchRow is one batch's outcome in the report.
type BatchRow struct {
	Batch         int     `json:"batch"`
	Decode        string  `json:"decode"`
	Complete      bool    `json:"complete"`
	RoomsComplete int     `json:"rooms_complete"`
	RoomsFailed   int     `json:"rooms_failed"`
	RanksOK       int     `json:"ranks_ok"`
	RanksReported int     `json:"ranks_reported"`
	FailedChunks  int     `json:"failed_chunks"`
	Bytes         uint64  `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	// EndedAfterFaultMs: for a batch in flight when the fault struck, how
	// long after it the last rank and room reported.
	EndedAfterFaultMs float64 `json:"ended_after_fault_ms,omitempty"`
	// RanksFailedAfterFaultMs: the slowest rank's first failed chunk after
	// the fault; RoomsEndedAfterFaultMs: the decode instance's last room
	// end after it.
	RanksFailedAfterFaultMs float64 `json:"ranks_failed_after_fault_ms,omitempty"`
	RoomsEndedAfterFaultMs  float64 `json:"rooms_ended_after_fault_ms,omitempty"`
	Error                   string  `json:"error,omitempty"`
}

// Report is what Up returns (`kvstream up --json` prints it).
type Report struct {
	BytesEqual      bool       `json:"bytes_equal"`
	Complete        bool       `json:"complete"`
	FailedChunks    int        `json:"failed_chunks"`
	Nodes           int        `json:"nodes"`
	PrefillRanks    int        `json:"prefill_ranks"`
	DecodeInstances int        `json:"decode_instances"`
	Transport       string     `json:"transport"`
	Etcd            string     `json:"etcd"`
	Seconds         float64    `json:"seconds"`
	Bytes           uint64     `json:"bytes"`
	AggregateGBps   float64    `json:"aggregate_gbps"`
	Fault           string     `json:"fault,omitempty"`
	FaultNotes      []string   `json:"fault_notes,omitempty"`
	Notes           []string   `json:"notes,omitempty"`
	Batches         []BatchRow `json:"batches"`
	Rows            []Row      `json:"rows"`
	// Drain is set when a signal ended the run early: what was in flight
	// and whether the drain lost any of it.
	Drain *DrainRow `json:"drain,omitempty"`
}

// DrainRow says how a run that was asked to stop ended.
type DrainRow struct {
	Reason string `json:"reason"`
	// InFlight are the batches running when the drain began, Lost those of
	// them that did not complete.
	InFlight int     `json:"in_flight"`
	Lost     int     `json:"lost"`
	Seconds  float64 `json:"seconds"`
	// NotStarted are the batches the drain kept from starting.
	NotStarted int `json:"not_started"`
}

// FailedBatches counts the batches run that did not complete.
func (r *Report) FailedBatches() int {
	n := 0
	for _, b := range r.Batches {
		if !b.Complete {
			n++
		}
	}
	return n
}

// Outcome says how the run ended, for the summary line: "complete: true"
// when every batch planned ran and completed; a drain that lost nothing
// says so rather than "complete: false" (the batches it kept from
// starting were not lost); otherwise "complete: false" and, after a
// drain, what it lost.
func (r *Report) Outcome() string {
	switch d := r.Drain; {
	case r.Complete:
		return "complete: true"
	case d != nil && d.Lost == 0 && r.FailedBatches() == 0:
		return fmt.Sprintf("drained, nothing lost (%d not started)", d.NotStarted)
	case d != nil && d.Lost == 0:
		return fmt.Sprintf("complete: false (%d batches failed before the drain, which lost nothing)", r.FailedBatches())
	case d != nil:
		return fmt.Sprintf("complete: false (the drain lost %d of the %d batches in flight)", d.Lost, d.InFlight)
	}
	return "complete: false"
}

// Text prints the report: a line per batch, the notes, a summary line and
// a row per node.
func (r *Report) Text(w io.Writer) {
	for _, b := range r.Batches {
		line := fmt.Sprintf("up: batch %d on %s: complete %v, rooms %d complete %d failed, ranks ok %d/%d, %.2f s",
			b.Batch, b.Decode, b.Complete, b.RoomsComplete, b.RoomsFailed, b.RanksOK, r.PrefillRanks, b.Seconds)
		if b.RanksFailedAfterFaultMs > 0 {
			line += fmt.Sprintf("; the slowest rank's first failure %.0f ms after the fault", b.RanksFailedAfterFaultMs)
		}
		if b.RoomsEndedAfterFaultMs > 0 && !b.Complete {
			line += fmt.Sprintf("; rooms ended %.0f ms after the fault", b.RoomsEndedAfterFaultMs)
		}
		if b.Error != "" {
			line += "; " + b.Error
		}
		fmt.Fprintln(w, line)
	}
	for _, n := range r.FaultNotes {
		fmt.Fprintln(w, "up:", n)
	}
	for _, n := range r.Notes {
		fmt.Fprintln(w, "up:", n)
	}
	if d := r.Drain; d != nil {
		fmt.Fprintf(w, "up: drained (%s): %d batches in flight, %d lost, %d not started, %.2f s\n", d.Reason, d.InFlight, d.Lost, d.NotStarted, d.Seconds)
	}
	fmt.Fprintf(w, "up: %d prefill ranks x %d decode instances over %s (etcd %s): %d batches, %s, bytes equal: %v, %d chunks failed, %.1f MB in %.2f s, aggregate %.3f GB/s\n",
		r.PrefillRanks, r.DecodeInstances, r.Transport, r.Etcd, len(r.Batches), r.Outcome(), r.BytesEqual, r.FailedChunks,
		float64(r.Bytes)/1e6, r.Seconds, r.AggregateGBps)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\trole\taddress\trooms ok\trooms failed\tpages verified\tbatches\tfailed chunks\tsessions\tetcd calls\tdrained\t")
	for _, n := range r.Rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%v\t\n", n.ID, n.Role, n.Addr, n.RoomsComplete, n.RoomsFailed, n.PagesVerified,
			n.Batches, n.FailedChunks, n.Sessions, n.Lookups, n.Drained)
	}
	_ = tw.Flush()
}
