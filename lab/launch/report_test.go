package launch

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestReportText: a line per batch (with the fault's timings and the
// first error), the notes, the drain, the summary and a row per node.
func TestReportText(t *testing.T) {
	r := &Report{PrefillRanks: 2, DecodeInstances: 1, Transport: "ucx", Etcd: "http://127.0.0.1:1", Seconds: 2, Bytes: 3e6,
		AggregateGBps: 0.0015, Complete: false, BytesEqual: true, FailedChunks: 4,
		Batches: []BatchRow{
			{Batch: 0, Decode: "decode-0", Complete: true, RoomsComplete: 2, RanksOK: 2, Seconds: 1.25},
			{Batch: 1, Decode: "decode-0", RoomsFailed: 2, RanksFailedAfterFaultMs: 812, RoomsEndedAfterFaultMs: 40, Error: "decode instance decode-0 exited", Seconds: 3},
		},
		FaultNotes: []string{"kill-decode: SIGKILL decode-0 (pid 9) at the first forward of batch 1"},
		Notes:      []string{"batch 2 and later not started: draining"},
		Drain:      &DrainRow{Reason: "terminated", InFlight: 1, Lost: 0, NotStarted: 2, Seconds: 0.5},
		Rows:       []Row{{ID: "decode-0", Role: "decode", Addr: "127.0.0.1:5", RoomsComplete: 2, PagesVerified: 2250, Lookups: 0, Drained: true}},
	}
	var b bytes.Buffer
	r.Text(&b)
	want := `up: batch 0 on decode-0: complete true, rooms 2 complete 0 failed, ranks ok 2/2, 1.25 s
up: batch 1 on decode-0: complete false, rooms 0 complete 2 failed, ranks ok 0/2, 3.00 s; the slowest rank's first failure 812 ms after the fault; rooms ended 40 ms after the fault; decode instance decode-0 exited
up: kill-decode: SIGKILL decode-0 (pid 9) at the first forward of batch 1
up: batch 2 and later not started: draining
up: drained (terminated): 1 batches in flight, 0 lost, 2 not started, 0.50 s
up: 2 prefill ranks x 1 decode instances over ucx (etcd http://127.0.0.1:1): 2 batches, complete: false (1 batches failed before the drain, which lost nothing), bytes equal: true, 4 chunks failed, 3.0 MB in 2.00 s, aggregate 0.002 GB/s
node      role    address      rooms ok  rooms failed  pages verified  batches  failed chunks  sessions  etcd calls  drained  
decode-0  decode  127.0.0.1:5  2         0             2250            0        0              0         0           true     
`
	assert.Equal(t, want, b.String())
}

// TestReportOutcome: the summary says how the run ended, and a drain that
// lost nothing says it drained instead of "complete: false".
func TestReportOutcome(t *testing.T) {
	ok := BatchRow{Complete: true}
	for _, tc := range []struct {
		name string
		r    Report
		want string
	}{
		{"every batch", Report{Complete: true, Batches: []BatchRow{ok, ok}}, "complete: true"},
		{"drained, nothing lost", Report{Batches: []BatchRow{ok}, Drain: &DrainRow{InFlight: 1, NotStarted: 3}}, "drained, nothing lost (3 not started)"},
		{"drained after a failure", Report{Batches: []BatchRow{ok, {}}, Drain: &DrainRow{NotStarted: 2}},
			"complete: false (1 batches failed before the drain, which lost nothing)"},
		{"the drain lost", Report{Batches: []BatchRow{ok, {}}, Drain: &DrainRow{InFlight: 2, Lost: 1}}, "complete: false (the drain lost 1 of the 2 batches in flight)"},
		{"a failure", Report{Batches: []BatchRow{ok, {}}}, "complete: false"},
	} {
		assert.Equal(t, tc.want, tc.r.Outcome(), tc.name)
	}
}
