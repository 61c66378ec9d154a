package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/rdmafault"
	"github.com/kvstream/kvstream/lab/replay"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/trace"
	"github.com/kvstream/kvstream/trace/tracetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// traceScenario is one scenario of the commit log, recorded as a trace in
// tests/testdata/traces and replayed by TestTraceScenariosReplay.
type traceScenario struct {
	name  string
	about []string // the file's comment header
	opts  func() rigOpts
	run   func(t *testing.T, r *rig)
	// expect checks the replay beyond "no divergence".
	expect func(t *testing.T, tr *trace.Trace, out *replay.Outcome)
}

func neverFirstEvent(e sim.EventInfo) sim.Fault {
	if e.Seq == 1 {
		return sim.NeverComplete
	}
	return sim.NoFault
}

var traceScenarios = []traceScenario{
	{
		name:  "mtp_78_hooks_79_buffers",
		about: []string{"78 hook layers over 79 buffers (the MTP layer fires no hook), K = 8: ten group submits,", "the last of six layers, and the MTP buffer sent after the forward's end event."},
		opts:  func() rigOpts { return rigOpts{geom: testbed.MLA(79, 16, 16), hooks: 78, group: 8} },
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 9, end: 20, last: true, src: []int{0, 1, 5, 6, 7}, total: 5, infos: oneInfo("d0", []int{3, 4, 5, 9, 10})})
			r.forward(testbed.Write{Room: 9, SrcPages: []int{0, 1, 5, 6, 7}, Tokens: 20})
			r.finish(9)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			subs := effectsOf(tr, "chunk", "Submit")
			require.Len(t, subs, 11)
			assert.Contains(t, subs[9], `"Buffers":[72,73,74,75,76,77]`, "the last group is partial")
			assert.Contains(t, subs[10], `"Buffers":[78],`)
			assert.Contains(t, subs[10], `"Seq":-1`, "the MTP buffer goes as the rest")
			assert.Equal(t, map[string]int{"SUCCESS": 1}, out.Statuses)
		},
	},
	{
		name:  "later_forwards_refire",
		about: []string{"A chunk of room 1 stays unfinished while two later forwards re-fire every layer for rooms 2", "and 3: its finish target stays at one submit per group (the seed saw targets of 3042-5538)."},
		opts:  func() rigOpts { return rigOpts{geom: testbed.MLA(16, 16, 64), hooks: 16, group: 4} },
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			for i := 0; i < 2; i++ {
				room, src := uint64(2+i), []int{10 + 2*i, 11 + 2*i}
				r.register(chunk{room: room, end: 8, last: true, src: src, total: 2, infos: oneInfo("d0", []int{20 + 2*i, 21 + 2*i})})
				r.forward(testbed.Write{Room: room, SrcPages: src, Tokens: 8})
			}
			for room := uint64(1); room <= 3; room++ {
				r.finish(room)
			}
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			var room1 []string
			for _, rec := range tr.Records {
				if rec.Actor == trace.Chunk && strings.HasPrefix(rec.ID, "1:") && rec.Type == "GroupReady" {
					room1 = append(room1, trace.Canonical(rec.Msg))
				}
			}
			require.Len(t, room1, 4, "room 1's chunk handled only its own forward's groups")
			for _, m := range room1 {
				assert.Contains(t, m, `"Forward":1,`)
			}
			assert.Equal(t, 3, out.Forwards)
		},
	},
	{
		name:  "chunked_fifo_late_chunk",
		about: []string{"Room 4 is prefilled in three chunks; chunk 0 is finished only after chunk 1 registered (late):", "chunks finish in send order, and chunk N > 0 lands on its own pages (positions are absolute)."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.KV(3, 16, 64), hooks: 3, group: 2, cp: cp.CP{Size: 4, Rank: 1}}
		},
		run: func(t *testing.T, r *rig) {
			src, dst := seqPages(20, 12), seqPages(0, 12)
			for k := 0; k < 3; k++ {
				r.register(chunk{room: 4, start: 16 * k, end: 16 * (k + 1), last: k == 2, src: src[4*k : 4*k+4], total: 12, infos: oneInfo("d0", dst)})
				r.forward(testbed.Write{Room: 4, PageStart: 4 * k, SrcPages: src[4*k : 4*k+4], Tokens: 16})
			}
			for k := 0; k < 3; k++ {
				assert.Equal(t, 16*k, r.finish(4).Chunk.Start)
			}
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			require.Len(t, out.Results, 3)
			for k, res := range out.Results {
				assert.True(t, strings.HasPrefix(res.Chunk, fmt.Sprintf("4:%d-", 16*k)), "chunk %d ends in send order: %s", k, res.Chunk)
			}
		},
	},
	{
		name:  "two_info_fallback",
		about: []string{"Under the reference rule (SingleDestinationPerLayer), room 1 has two real decode destinations: the register guard sends it monolithically,", "one rest batch per destination after the forward; room 2 has one and streams per layer."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.MLA(4, 16, 64), hooks: 4, group: 2, decodes: 2, single: true}
		},
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2,
				infos: []system.DecodeInfo{{Peer: "d0", DstPages: []int{0, 1}}, {Peer: "d1", DstPages: []int{2, 3}}}})
			r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2, infos: oneInfo("d0", []int{4, 5})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8}, testbed.Write{Room: 2, SrcPages: []int{2, 3}, Tokens: 8})
			r.finish(1)
			r.finish(2)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			var mono []string
			for _, rec := range tr.Records {
				if rec.Actor == trace.Chunk && strings.HasPrefix(rec.ID, "1:") {
					mono = append(mono, filter(rec.Effects, "Submit")...)
				}
			}
			require.Len(t, mono, 2)
			assert.Contains(t, mono[0], `"Dest":0`)
			assert.Contains(t, mono[1], `"Dest":1`)
			assert.Equal(t, map[string]int{"SUCCESS": 2}, out.Statuses)
		},
	},
	{
		name:  "two_destinations_per_layer",
		about: []string{"Room 1 has two real decode destinations and streams per layer to both: one batch per group per destination,", "one context, one Finish."},
		opts:  func() rigOpts { return rigOpts{geom: testbed.MLA(4, 16, 64), hooks: 4, group: 2, decodes: 2} },
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2,
				infos: []system.DecodeInfo{{Peer: "d0", DstPages: []int{0, 1}}, {Peer: "d1", DstPages: []int{2, 3}}}})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			r.finish(1)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			subs := effectsOf(tr, "chunk", "Submit")
			require.Len(t, subs, 4, "2 groups x 2 destinations")
			for i, s := range subs {
				assert.Contains(t, s, fmt.Sprintf(`"Dest":%d`, i%2))
				assert.Contains(t, s, fmt.Sprintf(`"Seq":%d`, i/2))
			}
			assert.Equal(t, map[string]int{"SUCCESS": 1}, out.Statuses)
		},
	},
	{
		name:  "partial_last_group",
		about: []string{"Ten hook layers in groups of four: boundaries at layers 3, 7 and 9, the last group of two."},
		opts:  func() rigOpts { return rigOpts{geom: testbed.MLA(10, 16, 64), hooks: 10, group: 4} },
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{6, 7})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			r.finish(1)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			subs := effectsOf(tr, "chunk", "Submit")
			require.Len(t, subs, 3)
			assert.Contains(t, subs[2], `"Buffers":[8,9]`)
		},
	},
	{
		name:  "submit_failure",
		about: []string{"The transport refuses the second batch: the chunk fails closed and reports FAILED."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.MLA(8, 16, 64), hooks: 8, group: 2, netFaults: func(b rdmafault.BatchInfo) rdmafault.Fault {
				if b.Seq == 2 {
					return rdmafault.Fault{Kind: rdmafault.PostError}
				}
				return rdmafault.Fault{}
			}}
		},
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			_, err := r.eng.Finish(context.Background(), 1)
			require.Error(t, err)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			assert.Equal(t, map[string]int{"FAILED": 1}, out.Statuses)
			assert.Contains(t, out.Results[0].Err, "injected error")
		},
	},
	{
		name:  "wait_failure",
		about: []string{"Waiting on the first group's event fails: the failure propagates, FAILED."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.MLA(4, 16, 64), hooks: 4, group: 4, gpuFaults: func(e sim.EventInfo) sim.Fault {
				if e.Seq == 1 {
					return sim.WaitError
				}
				return sim.NoFault
			}}
		},
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			_, err := r.eng.Finish(context.Background(), 1)
			require.True(t, errors.Is(err, system.ErrEventWait))
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			assert.Equal(t, map[string]int{"FAILED": 1}, out.Statuses)
			assert.Contains(t, out.Results[0].Err, "injected wait error")
		},
	},
	{
		name:  "timeout",
		about: []string{"The first group's event never completes: at its deadline the chunk tears down what is in", "flight (Teardown), answers when the teardown reported (TornDown), FAILED within the timeout."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.MLA(4, 16, 64), hooks: 4, group: 2, timeout: 200 * time.Millisecond, gpuFaults: neverFirstEvent}
		},
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
			r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
			_, err := r.eng.Finish(context.Background(), 1)
			require.True(t, errors.Is(err, system.ErrTimeout))
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			assert.Equal(t, map[string]int{"FAILED": 1}, out.Statuses)
			assert.Contains(t, out.Results[0].Err, "not complete within the timeout")
			require.NotEmpty(t, effectsOf(tr, "chunk", "Teardown"))
		},
	},
	{
		name:  "abort_mid_forward",
		about: []string{"Room 1 is dropped while its forward runs (after layer 2 of 6): DROPPED, and room 2 of the", "same forward still succeeds."},
		opts: func() rigOpts {
			return rigOpts{geom: testbed.MLA(6, 16, 64), hooks: 6, group: 2, layerTime: time.Millisecond}
		},
		run: func(t *testing.T, r *rig) {
			r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
			r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2, infos: oneInfo("d0", []int{4, 5})})
			fw, err := r.eng.BeginForward()
			require.NoError(t, err)
			for l := 0; l < 6; l++ {
				require.NoError(t, r.stream.Launch(sim.Kernel{Duration: time.Millisecond, Run: func() {}}))
				require.NoError(t, fw.LayerEnd(l))
				if l == 2 {
					require.NoError(t, r.eng.Drop(context.Background(), 1))
				}
			}
			require.NoError(t, fw.End())
			r.finish(2)
		},
		expect: func(t *testing.T, tr *trace.Trace, out *replay.Outcome) {
			assert.Equal(t, map[string]int{"DROPPED": 1, "SUCCESS": 1}, out.Statuses)
		},
	},
}

// effectsOf returns the effects of one type recorded by actors of a kind.
func effectsOf(tr *trace.Trace, kind, effect string) []string {
	var out []string
	for _, rec := range tr.Records {
		if rec.Actor == kind {
			out = append(out, filter(rec.Effects, effect)...)
		}
	}
	return out
}

func filter(effs []string, name string) []string {
	var out []string
	for _, e := range effs {
		if strings.HasPrefix(e, name+" ") {
			out = append(out, e)
		}
	}
	return out
}

const traceDir = "testdata/traces"

// record runs a scenario with tracing on and returns the trace's text.
func (s traceScenario) record(t *testing.T) []byte {
	var buf bytes.Buffer
	o := s.opts()
	o.trace = &buf
	r := newRig(t, o)
	s.run(t, r)
	require.NoError(t, r.eng.Close())
	return buf.Bytes()
}

// TestWriteTraceScenarios regenerates tests/testdata/traces (run with
// KVSTREAM_WRITE_TRACES=1); the committed files are what the replay test
// reads.
func TestWriteTraceScenarios(t *testing.T) {
	if os.Getenv("KVSTREAM_WRITE_TRACES") == "" {
		t.Skip("set KVSTREAM_WRITE_TRACES=1 to regenerate tests/testdata/traces")
	}
	require.NoError(t, os.MkdirAll(traceDir, 0o755))
	for _, s := range traceScenarios {
		var b bytes.Buffer
		fmt.Fprintf(&b, "# kvstream message trace: %s\n", s.name)
		for _, l := range s.about {
			fmt.Fprintf(&b, "# %s\n", l)
		}
		b.WriteString("# Recorded by TestWriteTraceScenarios (tests/trace_test.go); replayed by TestTraceScenariosReplay.\n")
		b.WriteString("# Line 1 is the header; then one record per message an actor handled, with its core's effects.\n")
		b.Write(s.record(t))
		require.NoError(t, os.WriteFile(filepath.Join(traceDir, s.name+".jsonl"), b.Bytes(), 0o644))
	}
}

// TestTraceScenariosReplay replays every committed scenario trace through
// the functional cores (no divergence, and the scenario's expected
// effects) and through a real engine (same statuses, bytes equal).
func TestTraceScenariosReplay(t *testing.T) {
	for _, s := range traceScenarios {
		t.Run(s.name, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(traceDir, s.name+".jsonl"))
			require.NoError(t, err, "regenerate with KVSTREAM_WRITE_TRACES=1 go test ./tests -run TestWriteTraceScenarios")
			// The replays stream the file, as kvstream replay does.
			open := func() (trace.Stream, error) { return trace.NewReader(bytes.NewReader(raw)) }
			s0, err := open()
			require.NoError(t, err)
			out, err := replay.Cores(s0)
			require.NoError(t, err)
			require.Nil(t, out.Divergence, "%s", out)
			tr, err := trace.Read(bytes.NewReader(raw))
			require.NoError(t, err)
			assert.Equal(t, len(tr.Records), out.Records, "every record was replayed")
			s.expect(t, tr, out)

			eo, err := replay.Engine(context.Background(), open)
			require.NoError(t, err)
			assert.Empty(t, eo.Mismatch, "recorded %v, replayed %v", eo.Recorded, eo.Replayed)
			assert.Equal(t, eo.Recorded, eo.Replayed)
		})
	}
}

// TestTraceRecordedNowReplays records every scenario afresh and replays it:
// the recording path itself stays replayable.
func TestTraceRecordedNowReplays(t *testing.T) {
	for _, s := range traceScenarios {
		tr, err := trace.Read(bytes.NewReader(s.record(t)))
		require.NoError(t, err, s.name)
		out, err := replay.Cores(tr.Stream())
		require.NoError(t, err, s.name)
		require.Nil(t, out.Divergence, "%s: %s", s.name, out)
		s.expect(t, tr, out)
	}
}

// mutate returns a copy of a trace with one edit.
func mutate(tr *trace.Trace, edit func(recs []trace.Record) []trace.Record) *trace.Trace {
	recs := append([]trace.Record(nil), tr.Records...)
	return &trace.Trace{Header: tr.Header, Records: edit(recs)}
}

// renumber numbers records one after the other, as a recorder does in the
// order actors begin handling messages.
func renumber(recs []trace.Record) []trace.Record {
	for i := range recs {
		recs[i].Seq = uint64(i + 1)
	}
	return recs
}

func indexOf(recs []trace.Record, from int, match func(trace.Record) bool) int {
	for i := from; i < len(recs); i++ {
		if match(recs[i]) {
			return i
		}
	}
	return -1
}

// TestTraceEveryMutationIsCaught: a replay cannot be vacuous. Recorded
// traces (the scenarios of the commit log, and a sim run) are mutated in
// every way: each record deleted, each record duplicated, adjacent records
// of different actors swapped, a record's number shifted, and one field of
// each kind of record changed (every field of its message and its first
// effect). Every mutation is a divergence, or an error reading the record,
// that names the mutated record, but the mutations listed in allowedNoOps,
// each with the reason it changes nothing a replay can know.
func TestTraceEveryMutationIsCaught(t *testing.T) {
	traces := map[string]*trace.Trace{}
	for _, name := range []string{"later_forwards_refire", "chunked_fifo_late_chunk", "submit_failure", "two_destinations_per_layer"} {
		raw, err := os.ReadFile(filepath.Join(traceDir, name+".jsonl"))
		require.NoError(t, err)
		tr, err := trace.Read(bytes.NewReader(raw))
		require.NoError(t, err)
		traces[name] = tr
	}
	traces["sim"] = simTrace(t)
	for name, tr := range traces {
		t.Run(name, func(t *testing.T) {
			base, err := replay.Cores(tr.Stream())
			require.NoError(t, err)
			require.Nil(t, base.Divergence, "%s", base)
			caught, allowed := 0, 0
			for _, m := range tracetest.Mutations(tr, tracetest.DifferentActors) {
				out, err := replay.Cores(m.Trace.Stream())
				var said string
				switch {
				case err != nil:
					said = err.Error()
				case out.Divergence != nil:
					said = out.Divergence.String()
				}
				if _, ok := allowedNoOps[m.Field]; ok && said == "" {
					allowed++
					continue
				}
				if !assert.NotEmpty(t, said, "%s: replayed clean", m.What) {
					continue
				}
				_, later := namedLater[m.Field]
				if _, noOp := allowedNoOps[m.Field]; !later && !noOp {
					assert.True(t, tracetest.NamesRecord(said, m.Seq), "%s: the divergence does not name record %d:\n%s", m.What, m.Seq, said)
				}
				caught++
			}
			t.Logf("%d records: %d mutations caught, %d allowed no-ops", len(tr.Records), caught, allowed)
		})
	}
}

// namedLater are the fields whose change is a divergence where the chunk
// reports them, which may be a later record than the changed one.
var namedLater = map[string]string{
	"Submitted.Bytes":     "counted in the chunk's statistics, reported in its finish answer",
	"Submitted.Blocks":    "as Submitted.Bytes",
	"Submitted.WaitStart": "the event wait's time, reported in the chunk's statistics",
	"Submitted.WaitEnd":   "as Submitted.WaitStart",
	"Submitted.PostedAt":  "the post's time, reported in the chunk's statistics",
	"Submitted.Posted":    "whether a batch was posted shows where its completion arrives, and in the statistics",
	"BatchDone.Seq":       "a completion is the transport's word: one that names another batch in flight is caught when that batch's own completion comes (a stray)",
	"BatchDone.Dest":      "as BatchDone.Seq",
}

// allowedNoOps are the fields whose change a replay may not notice, and
// why (where it does, it may name the record that reports them). A change
// of any other field is a divergence that names the changed record.
var allowedNoOps = map[string]string{
	"Waited.Seq":       "a submitter's Waited notes what the hardware did; its outcome reaches the chunk as the Submitted the replay checks",
	"Waited.Dest":      "as Waited.Seq",
	"Waited.Err":       "as Waited.Seq",
	"Waited.Chunk":     "as Waited.Seq",
	"RegisterCall.End": "a chunk's end is floored to its page unless it is the last chunk: an end within the same page registers the same chunk with the same plan",
	"t_ns":             "a record's time is when it was handled, which no decision depends on",
	"sender":           "the sending actor is what protoactor reported for a request, a label: the replay knows the real sender from the effects",
	// The pool's size bounds the pages a plan may name and changes no
	// decision of the engine's cores while every named page is inside it.
	"AddPeerCall.Pages": "a larger or smaller decode pool holding every page the plans name changes no plan",
	// Finish and Drop carry the caller's timeout; the cores' outcomes do
	// not depend on it (the timer it arms fires as a recorded Timeout).
	"Finish.Timeout": "the finish timeout is armed as a timer, whose firing is its own recorded message",
	"Drop.Timeout":   "as Finish.Timeout",
	// Times the façade stamps for the report decide nothing.
	"Begin.At": "a forward's start time is for reports",
	"End.At":   "a forward's end time is for reports",
	// A completion's time is reported in the chunk's statistics (a
	// divergence where it reports them), and decides nothing once the
	// chunk ended.
	"BatchDone.At": "a completion's time is for reports",
}

// simTrace records a small sim run's per-layer trace.
func simTrace(t *testing.T) *trace.Trace {
	t.Helper()
	var buf bytes.Buffer
	cfg := workload.Defaults()
	cfg.Preset = workload.Presets["small"]
	cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = 2, 256, 128, 16, 4
	cfg.Record = &buf
	_, err := workload.Run(context.Background(), cfg, zap.NewNop())
	require.NoError(t, err)
	tr, err := trace.Read(&buf)
	require.NoError(t, err)
	return tr
}

// TestTraceDivergencePrintsExcerpts: a divergence on a record carrying a
// megabyte of text prints a bounded excerpt of each side, never the whole
// record.
func TestTraceDivergencePrintsExcerpts(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(traceDir, "later_forwards_refire.jsonl"))
	require.NoError(t, err)
	tr, err := trace.Read(bytes.NewReader(raw))
	require.NoError(t, err)
	i := indexOf(tr.Records, 0, func(r trace.Record) bool { return r.Actor == trace.Chunk && r.Type == "GroupReady" })
	require.GreaterOrEqual(t, i, 0)
	big := strings.Repeat("e", 1<<20)
	tr.Records[i].Msg = map[string]any{"Err": big, "Event": "ev:1", "Forward": 1, "Group": 0}
	tr.Records[i].Effects = []string{"Submit " + big}

	out, err := replay.Cores(tr.Stream())
	require.NoError(t, err)
	require.NotNil(t, out.Divergence, "a GroupReady no actor sent is a divergence")
	require.Greater(t, len(out.Divergence.Recorded[0]), 1<<20, "the divergence keeps the whole line")
	text := out.String()
	assert.Less(t, len(text), 2*(replay.MaxExcerptLines+2)*(replay.MaxExcerpt+40)+1000, "printed: a bounded excerpt")
	assert.Contains(t, text, fmt.Sprintf("… (%d bytes)", len(out.Divergence.Recorded[0])), "the excerpt says how long the line was")
	assert.Contains(t, text, "divergence at record")
}

// TestTraceChunkHandlesNothingAfterItEnded: a chunk stops as it ends
// (ChunkEnded), so what reaches it later (a submitter's late Submitted, a
// timer) is dropped unhandled, and the replay counts it in flight. A
// recording that shows an ended chunk handling a message is a divergence.
func TestTraceChunkHandlesNothingAfterItEnded(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "traces", "timeout.jsonl"))
	require.NoError(t, err)
	tr, err := trace.Read(bytes.NewReader(raw))
	require.NoError(t, err)
	out, err := replay.Cores(tr.Stream())
	require.NoError(t, err)
	require.Nil(t, out.Divergence, "%s", out)
	require.Equal(t, map[string]int{"FAILED": 1}, out.Statuses)

	ended := indexOf(tr.Records, 0, func(r trace.Record) bool { return len(filter(r.Effects, "ChunkEnded")) > 0 })
	require.GreaterOrEqual(t, ended, 0)
	chunk := tr.Records[ended]
	require.Equal(t, trace.Chunk, chunk.Actor)
	late := mutate(tr, func(recs []trace.Record) []trace.Record {
		timer := trace.Record{Actor: trace.Chunk, ID: chunk.ID, Type: "Timeout", Msg: map[string]any{}}
		return renumber(append(recs[:ended+1:ended+1], append([]trace.Record{timer}, recs[ended+1:]...)...))
	})
	out, err = replay.Cores(late.Stream())
	require.NoError(t, err)
	require.NotNil(t, out.Divergence, "an ended chunk handles nothing")
	assert.Equal(t, "Timeout", out.Divergence.Type)
	assert.Contains(t, out.Divergence.Reason, "after it ended")
}
