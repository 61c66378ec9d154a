package decode_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/trace"
	"github.com/kvstream/kvstream/trace/tracetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeTraceScenario is a decode session recorded as a trace in
// testdata/traces and replayed by TestDecodeTraceScenariosReplay.
type decodeTraceScenario struct {
	name  string
	about []string // the file's comment: what happened
	// record runs the session with the server recording into w, and
	// closes the server (which writes the trace).
	record func(t *testing.T, w *bytes.Buffer)
	// expect checks the replay's outcome beyond "no divergence": the
	// rooms and sessions end as they did when recorded.
	expect func(t *testing.T, out *decode.ReplayOutcome)
}

var decodeTraceScenarios = []decodeTraceScenario{
	{
		name: "lost_prefill",
		about: []string{
			"A failure, as a decode server records it: a prefill process reports room 1's first chunk and exits (no",
			"goodbye): its session actor is reported gone, then the server's heartbeats find its node lost, its access",
			"to the pool is revoked and room 1 fails (ErrPrefillLost). Prefill p1 completes room 2 and reports room 3's",
			"only chunk FAILED (the room fails). The serving stack releases rooms 1 to 3 and expects room 4 on room 1's",
			"pages, quiet since the revocation: p1 completes it and says goodbye (its verdict: room 3 failed); the",
			"server drains and closes.",
		},
		record: recordLostPrefill,
		expect: func(t *testing.T, out *decode.ReplayOutcome) {
			assert.Equal(t, []string{"1 lost", "2 complete", "3 failed", "4 complete"}, roomOutcomes(out))
			assert.Contains(t, out.Rooms[0].Err, "lost")
			assert.Contains(t, out.Rooms[2].Err, "finish timed out")
			assert.Equal(t, 2, out.Sessions)
			assert.Equal(t, map[string]int{"lost": 1, "failed": 1}, out.SessionsEnded)
		},
	},
	{
		name: "group",
		about: []string{
			"A CP group of two ranks (shared KV, pages of 4 tokens) whose first Hello sizes the pool: both ranks report",
			"both chunks of room 7, complete. Room 9, which no rank reports, fails when its timer (Config.RoomTimeout,",
			"1 s) fires. Rank 0 reports room 8's only chunk, then the serving stack disconnects rank 1 (evicted): room 8,",
			"which still needs rank 1's pages, fails (ErrPrefillLost). Rank 0 says goodbye and leaves; the server closes.",
		},
		record: recordGroup,
		expect: func(t *testing.T, out *decode.ReplayOutcome) {
			assert.Equal(t, []string{"7 complete", "9 timeout", "8 lost"}, roomOutcomes(out))
			assert.Contains(t, out.Rooms[1].Err, "not complete within 1s (Config.RoomTimeout)")
			assert.Contains(t, out.Rooms[2].Err, "evicted by the operator")
			assert.Equal(t, 2, out.Sessions)
			assert.Equal(t, 1, out.SessionsEnded["lost"])
		},
	},
}

func roomOutcomes(out *decode.ReplayOutcome) []string {
	var s []string
	for _, r := range out.Rooms {
		s = append(s, fmt.Sprintf("%d %s", r.Room, r.Outcome))
	}
	return s
}

// recordLostPrefill records the lost_prefill scenario. The lost prefill is
// a process of its own (twoproc_test.go's "vanish" role): a second node in
// this process would race inside protoactor's remote.Start.
func recordLostPrefill(t *testing.T, w *bytes.Buffer) {
	ctx := waitCtx(t)
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	defer tr.Close()
	pool, err := hostmem.Alloc(buffers * itemLen * pages)
	require.NoError(t, err)
	defer pool.Free()
	// Heartbeats that find a silent prefill within 2 s (a loaded test
	// machine must not miss six in a row of a live one).
	node, err := decode.ListenConfig(decode.NodeConfig{Listen: "127.0.0.1:0", Heartbeat: decode.HeartbeatWithin(2 * time.Second)})
	require.NoError(t, err)
	defer node.Close(context.Background())
	srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), ByeGrace: time.Minute, Trace: w,
		Admit: func(string, map[string]string) error { return nil }, Verify: func(*decode.Session, decode.Chunk) error { return nil }})
	require.NoError(t, err)
	defer srv.Close(context.Background())
	require.NoError(t, srv.Expect(1, []int{0, 1, 2, 3}))
	require.NoError(t, srv.Expect(2, []int{4, 5, 6, 7}))
	require.NoError(t, srv.Expect(3, []int{8, 9, 10, 11}))

	// The prefill that vanishes reports room 1's first chunk and exits.
	pre := exec.Command(os.Args[0], "-test.run=^$")
	pre.Env = append(os.Environ(), roleEnv+"=vanish "+srv.Addr())
	pre.Stdout, pre.Stderr = os.Stderr, os.Stderr
	require.NoError(t, pre.Run(), "the prefill process failed (its stderr above)")
	_, err = srv.Wait(ctx, 1)
	require.ErrorIs(t, err, decode.ErrPrefillLost)

	c1, err := decode.Dial(ctx, node, decode.DialConfig{Decode: srv.Addr(), Buffers: prefillLayout(itemLen), PageSize: 4, Name: "p1"})
	require.NoError(t, err)
	ss1, err := srv.Accept(ctx)
	require.NoError(t, err)
	lost, err := srv.Accept(ctx) // the vanished prefill's, accepted second
	require.NoError(t, err)
	if lost.Prefill() == "p1" {
		lost, ss1 = ss1, lost
	}
	_, err = lost.Wait(ctx)
	require.ErrorIs(t, err, decode.ErrPrefillLost)
	require.NoError(t, c1.Notify(ctx, notice(2, 0, 2, 4, false, system.Succeeded, nil)))
	require.NoError(t, c1.Notify(ctx, notice(2, 2, 4, 4, true, system.Succeeded, nil)))
	room, err := srv.Wait(ctx, 2)
	require.NoError(t, err)
	require.True(t, room.Complete)
	require.NoError(t, c1.Notify(ctx, notice(3, 0, 4, 8, true, system.Failed, errors.New("finish timed out"))))
	_, err = srv.Wait(ctx, 3)
	require.ErrorIs(t, err, decode.ErrChunkFailed)
	for room := uint64(1); room <= 3; room++ {
		require.NoError(t, srv.Release(room))
	}
	// Room 1's pages are quiet: the lost prefill's access was revoked.
	require.NoError(t, srv.Expect(4, []int{0, 1, 2, 3}))
	require.NoError(t, c1.Notify(ctx, notice(4, 0, 4, 0, true, system.Succeeded, nil)))
	_, err = srv.Wait(ctx, 4)
	require.NoError(t, err)
	_, err = c1.Bye(ctx, nil)
	require.ErrorIs(t, err, decode.ErrChunkFailed, "the verdict: room 3 failed")
	require.NoError(t, c1.Close(ctx))
	_, err = ss1.Wait(ctx)
	require.ErrorIs(t, err, decode.ErrChunkFailed)
	_, err = srv.State()
	require.NoError(t, err)
	require.NoError(t, srv.Drain(ctx))
	require.NoError(t, srv.Close(ctx))
}

// recordGroup records the group scenario.
func recordGroup(t *testing.T, w *bytes.Buffer) {
	ctx := waitCtx(t)
	tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
	require.NoError(t, err)
	defer tr.Close()
	pool := sizedPool(t)
	node, err := decode.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	defer node.Close(context.Background())
	// Rooms not complete within a second fail: room 9, which no rank
	// reports. Rooms 7 and 8 end well within theirs.
	srv, err := decode.New(node, tr, decode.Config{Group: group2, ByeGrace: time.Minute, RoomTimeout: time.Second, Trace: w,
		Size: func([]decode.PrefillBuffer) ([]decode.Buffer, error) { return decodeBuffers(pool), nil }})
	require.NoError(t, err)
	defer srv.Close(context.Background())
	r := &rig{node: node, srv: srv, tr: tr}
	c0 := r.dialRank(t, 0)
	ss0, err := srv.Accept(ctx)
	require.NoError(t, err)
	c1 := r.dialRank(t, 1)
	require.NoError(t, srv.Expect(7, []int{4, 5, 6, 7, 8, 9, 10, 11}))
	for _, ch := range [][2]int{{0, 4}, {4, 8}} {
		require.NoError(t, c0.Notify(ctx, rankNotice(0, 7, ch[0], ch[1], 4, ch[1] == 8, system.Succeeded)))
	}
	for _, ch := range [][2]int{{4, 8}, {0, 4}} {
		require.NoError(t, c1.Notify(ctx, rankNotice(1, 7, ch[0], ch[1], 4, ch[1] == 8, system.Succeeded)))
	}
	room, err := srv.Wait(ctx, 7)
	require.NoError(t, err)
	require.True(t, room.Complete)
	require.NoError(t, srv.Expect(9, []int{12, 13}))
	_, err = srv.Wait(ctx, 9)
	require.ErrorIs(t, err, decode.ErrChunkFailed)
	require.ErrorContains(t, err, "Config.RoomTimeout")
	require.NoError(t, srv.Expect(8, []int{0, 1, 2, 3}))
	require.NoError(t, c0.Notify(ctx, rankNotice(0, 8, 0, 4, 0, true, system.Succeeded)))
	require.NoError(t, srv.Disconnect("rank-1", errors.New("evicted by the operator")))
	_, err = srv.Wait(ctx, 8)
	require.ErrorIs(t, err, decode.ErrPrefillLost)
	_, _ = c0.Bye(ctx, nil) // its room 8 failed: the verdict says so
	_, err = ss0.Wait(ctx)
	require.ErrorIs(t, err, decode.ErrPrefillLost, "room 8 failed for rank 1's loss")
	require.NoError(t, srv.Close(ctx))
}

const decodeTraceDir = "testdata/traces"

// TestWriteDecodeTraces regenerates testdata/traces (run with
// KVSTREAM_WRITE_TRACES=1); the committed files are what the replay tests
// read.
func TestWriteDecodeTraces(t *testing.T) {
	if os.Getenv("KVSTREAM_WRITE_TRACES") == "" {
		t.Skip("set KVSTREAM_WRITE_TRACES=1 to regenerate decode/testdata/traces")
	}
	require.NoError(t, os.MkdirAll(decodeTraceDir, 0o755))
	for _, s := range decodeTraceScenarios {
		var b, rec bytes.Buffer
		fmt.Fprintf(&b, "# kvstream decode trace: %s\n", s.name)
		for _, l := range s.about {
			fmt.Fprintf(&b, "# %s\n", l)
		}
		b.WriteString("# Recorded by TestWriteDecodeTraces (decode/trace_test.go); replayed by TestDecodeTraceScenariosReplay.\n")
		b.WriteString("# Line 1 is the header (side decode, the core's rules); then one record per message the server's core took, with its effects.\n")
		s.record(t, &rec)
		b.Write(rec.Bytes())
		require.NoError(t, os.WriteFile(filepath.Join(decodeTraceDir, s.name+".jsonl"), b.Bytes(), 0o644))
	}
}

// readDecodeTrace reads a committed decode trace.
func readDecodeTrace(t *testing.T, name string) []byte {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(decodeTraceDir, name+".jsonl"))
	require.NoError(t, err, "regenerate with KVSTREAM_WRITE_TRACES=1 go test ./decode -run TestWriteDecodeTraces")
	return raw
}

// replayBytes replays a trace's text, streamed as kvstream replay does.
func replayBytes(t *testing.T, raw []byte) *decode.ReplayOutcome {
	t.Helper()
	rd, err := trace.NewReader(bytes.NewReader(raw))
	require.NoError(t, err)
	out, err := decode.Replay(rd)
	require.NoError(t, err)
	return out
}

// TestDecodeTraceScenariosReplay replays every committed decode trace
// through a fresh core: no divergence, every record replayed, and the
// rooms and sessions end as they did (the lost_prefill trace is a failure:
// it replays as one).
func TestDecodeTraceScenariosReplay(t *testing.T) {
	for _, s := range decodeTraceScenarios {
		t.Run(s.name, func(t *testing.T) {
			raw := readDecodeTrace(t, s.name)
			out := replayBytes(t, raw)
			require.Nil(t, out.Divergence, "%s", out)
			tr, err := trace.Read(bytes.NewReader(raw))
			require.NoError(t, err)
			assert.Equal(t, len(tr.Records), out.Records)
			assert.Equal(t, out.Records, out.Replayed, "every record was stepped into the core")
			assert.Zero(t, out.InFlight, "the server closed: every revocation answered")
			s.expect(t, out)
		})
	}
}

// TestDecodeTraceRecordedNowReplays records every scenario afresh and
// replays it, from its text and from memory: recording stays replayable.
func TestDecodeTraceRecordedNowReplays(t *testing.T) {
	for _, s := range decodeTraceScenarios {
		t.Run(s.name, func(t *testing.T) {
			var w bytes.Buffer
			s.record(t, &w)
			out := replayBytes(t, w.Bytes())
			require.Nil(t, out.Divergence, "%s", out)
			s.expect(t, out)
			tr, err := trace.Read(bytes.NewReader(w.Bytes()))
			require.NoError(t, err)
			assert.Equal(t, trace.SideDecode, tr.Header.Side)
			assert.Equal(t, system.Version, tr.Header.EngineVersion, "kvstream's version, as the engine writes it")
		})
	}
}

// decodeNamedLater are the fields whose change may be caught where the
// state it changed is read, a later record than the changed one: the
// replay reports the first record whose effects differ, and the changed
// message may be answered the same (a changed page that is not free is
// caught at once).
var decodeNamedLater = map[string]string{
	"ExpectMsg.Room":  "Expect is answered the same for any free room id: the room it declared differs where a notice for it is checked",
	"ExpectMsg.Pages": "as ExpectMsg.Room, for free pages: a notice's pages are checked against the room's",
	"ExpectMsg.From":  "as ExpectMsg.Room, for the identity a notice must come from",
	"ByeMsg.Reply":    "the shell's name for a goodbye's answer comes back when the answer goes out, once the session's access is revoked",
	"ReleaseMsg.Room": "Release is answered the same for any room that exists: the room it released differs where a later call names either",
	"NoticeMsg.Notice": "the mutation changes the notice's Bytes, which a successful chunk's answer does not show: they show where its room ends or is looked up " +
		"(at once when Verify is on: the CallVerify names the chunk)",
}

// decodeAllowedNoOps are the fields whose change no replay can notice,
// and why. A change of any other field is a divergence naming the changed
// record (or, for decodeNamedLater, a later one).
var decodeAllowedNoOps = map[string]string{
	"t_ns": "a record's time is when the actor took the message, which no decision of the core depends on",
	// The mutation changes the first field of the first buffer by name,
	// its address.
	"SizedMsg.Buffers": "a pool buffer's address is the shell's: the core keeps the pool's geometry",
}

// TestDecodeTraceEveryMutationIsCaught: a decode replay cannot be vacuous.
// The recorded traces (the committed ones, and lost_prefill recorded
// afresh) are mutated in every way (tracetest.Mutations): each record
// deleted, each record duplicated, adjacent records of different types
// swapped (a decode trace is one actor's), each record's seq shifted, and
// one field of each kind of record changed (every field of its message,
// its id, its time, its first effect). Every mutation is a divergence, or
// an error reading the record, that names the mutated record, but those
// listed in decodeNamedLater (caught at a later record) and
// decodeAllowedNoOps (each with the reason it changes nothing a replay can
// know).
func TestDecodeTraceEveryMutationIsCaught(t *testing.T) {
	traces := map[string][]byte{}
	for _, s := range decodeTraceScenarios {
		traces[s.name] = readDecodeTrace(t, s.name)
	}
	var fresh bytes.Buffer
	recordLostPrefill(t, &fresh)
	traces["lost_prefill recorded now"] = fresh.Bytes()
	for name, raw := range traces {
		t.Run(name, func(t *testing.T) {
			tr, err := trace.Read(bytes.NewReader(raw))
			require.NoError(t, err)
			base, err := decode.Replay(tr.Stream())
			require.NoError(t, err)
			require.Nil(t, base.Divergence, "%s", base)
			caught, later, allowed := 0, 0, 0
			for _, m := range tracetest.Mutations(tr, tracetest.DifferentTypes) {
				out, err := decode.Replay(m.Trace.Stream())
				var said string
				switch {
				case err != nil:
					said = err.Error()
				case out.Divergence != nil:
					d := out.Divergence
					said = fmt.Sprintf("divergence at record %d: %s", d.Seq, d.Reason)
				}
				if _, ok := decodeAllowedNoOps[m.Field]; ok && said == "" {
					t.Logf("allowed no-op: %s", m.What)
					allowed++
					continue
				}
				if !assert.NotEmpty(t, said, "%s: replayed clean", m.What) {
					continue
				}
				if _, ok := decodeNamedLater[m.Field]; ok {
					require.NotNil(t, out.Divergence, "%s: %s", m.What, said)
					assert.GreaterOrEqual(t, out.Divergence.Seq, m.Seq, "%s: caught there or later", m.What)
					t.Logf("caught at record %d: %s", out.Divergence.Seq, m.What)
					later++
					continue
				}
				if _, noOp := decodeAllowedNoOps[m.Field]; !noOp {
					assert.True(t, tracetest.NamesRecord(said, m.Seq), "%s: the divergence does not name record %d:\n%s", m.What, m.Seq, said)
				}
				caught++
			}
			t.Logf("%d records: %d mutations caught at the mutated record, %d at a later one, %d allowed no-ops", len(tr.Records), caught, later, allowed)
			assert.Positive(t, caught)
		})
	}
}

// TestDecodeTraceRecordsEveryKind: the scenarios, together, record every
// kind of message the core takes, so that the mutations reach every
// kind's fields.
func TestDecodeTraceRecordsEveryKind(t *testing.T) {
	kinds := map[string]bool{}
	for _, s := range decodeTraceScenarios {
		tr, err := trace.Read(bytes.NewReader(readDecodeTrace(t, s.name)))
		require.NoError(t, err)
		for _, r := range tr.Records {
			kinds[r.Type] = true
		}
	}
	for _, k := range []string{"HelloMsg", "NoticeMsg", "ByeMsg", "DepartedMsg", "PeerLostMsg", "RevokedMsg", "TimerMsg", "ExpectMsg", "ReleaseMsg",
		"DisconnectMsg", "LookupMsg", "DrainMsg", "CloseMsg", "StateMsg", "AdmittedMsg", "SizedMsg", "AccessMsg", "VerifiedMsg"} {
		assert.True(t, kinds[k], "no scenario records a %s", k)
	}
}

// TestTraceFromTheEnvironment: KVSTREAM_TRACE, which the engine reads
// too, makes a Server record to the path with ".decode" appended, so that
// an engine and a Server in one process never write the same file; a
// Server with a Name appends it, and a second Server of the same name in
// the process gets a number: no two Servers write one file.
func TestTraceFromTheEnvironment(t *testing.T) {
	require.Equal(t, system.EnvTrace, decode.EnvTrace, "one variable for both sides")
	dir := t.TempDir()
	base := filepath.Join(dir, "incident.jsonl")
	t.Setenv(decode.EnvTrace, base)
	serve := func(name string) {
		tr, err := loopback.NewFabric(loopback.Options{}).NewTransport("decode")
		require.NoError(t, err)
		defer tr.Close()
		pool, err := hostmem.Alloc(buffers * itemLen * pages)
		require.NoError(t, err)
		defer pool.Free()
		node, err := decode.Listen("127.0.0.1:0", nil)
		require.NoError(t, err)
		defer node.Close(context.Background())
		srv, err := decode.New(node, tr, decode.Config{Buffers: decodeBuffers(pool), Name: name})
		require.NoError(t, err)
		require.NoError(t, srv.Expect(1, []int{0, 1}))
		require.NoError(t, srv.Close(waitCtx(t)))
	}
	serve("")
	serve("")
	serve("rank-3")
	for _, p := range []string{base + ".decode", base + ".decode.2", base + ".decode-rank-3"} {
		raw, err := os.ReadFile(p)
		require.NoError(t, err, "%s was not written", p)
		out := replayBytes(t, raw)
		require.Nil(t, out.Divergence, "%s: %s", p, out)
		assert.Equal(t, 3, out.Records, "%s: Expect, Close and the State Close asks for", p)
	}
	_, err := os.Stat(base)
	assert.True(t, os.IsNotExist(err), "the engine's file is the engine's alone")
}

// TestTraceConfig: the trace's options are checked at New, naming the
// value; DumpTrace writes what was recorded so far, and is an error when
// the Server does not record.
func TestTraceConfig(t *testing.T) {
	tr, bufs, node := newServerParts(t)
	var w bytes.Buffer
	_, err := decode.New(node, tr, decode.Config{Buffers: bufs, Trace: &w, TracePath: "x"})
	assert.ErrorIs(t, err, decode.ErrBadInput)
	assert.ErrorContains(t, err, `Config.Trace and Config.TracePath "x": set one of them`)
	_, err = decode.New(node, tr, decode.Config{Buffers: bufs, TracePath: filepath.Join(t.TempDir(), "no", "such", "dir")})
	assert.ErrorIs(t, err, decode.ErrBadInput)
	assert.ErrorContains(t, err, "Config.TracePath: the trace file")
	_, err = decode.New(node, tr, decode.Config{Buffers: bufs, Trace: &w, TraceCapacity: -1})
	assert.ErrorContains(t, err, "TraceCapacity -1: must not be negative")
	_, err = decode.New(node, tr, decode.Config{Buffers: bufs, MaxChunksPerRoom: -1})
	assert.ErrorIs(t, err, decode.ErrBadInput)
	assert.ErrorContains(t, err, "MaxChunksPerRoom -1: must not be negative")

	srv, err := decode.New(node, tr, decode.Config{Buffers: bufs, Trace: &w, TraceCapacity: 2})
	require.NoError(t, err)
	require.NoError(t, srv.Expect(1, []int{0}))
	require.NoError(t, srv.Expect(2, []int{1}))
	require.NoError(t, srv.Release(1))
	var dump bytes.Buffer
	require.NoError(t, srv.DumpTrace(&dump))
	got, err := trace.Read(&dump)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), got.Header.Dropped, "the ring keeps the last two records")
	assert.Equal(t, decode.DefaultMaxChunksPerRoom, got.Header.Decode.MaxChunksPerRoom, "the header carries the rules, defaults applied")
	require.Len(t, got.Records, 2)
	assert.Equal(t, "ReleaseMsg", got.Records[1].Type)
	_, err = decode.Replay(got.Stream())
	assert.ErrorContains(t, err, "the ring dropped the first 1 records", "a core is replayed from the server's start")
	require.NoError(t, srv.Close(waitCtx(t)))
	assert.Positive(t, w.Len(), "written at Close")

	quiet, err := decode.New(node, tr, decode.Config{Buffers: bufs, Name: "quiet"})
	require.NoError(t, err)
	err = quiet.DumpTrace(&dump)
	assert.ErrorIs(t, err, decode.ErrBadInput)
	assert.ErrorContains(t, err, "tracing is off")
	require.NoError(t, quiet.Close(waitCtx(t)))
}

// TestDecodeReplayRefusesOtherTraces: an engine's trace is not a decode
// server's, and says so.
func TestDecodeReplayRefusesOtherTraces(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "tests", "testdata", "traces", "partial_last_group.jsonl"))
	require.NoError(t, err)
	rd, err := trace.NewReader(bytes.NewReader(raw))
	require.NoError(t, err)
	_, err = decode.Replay(rd)
	assert.ErrorContains(t, err, `side "": not a decode server's trace`)
}

// FuzzReplayDecode: whatever a decode trace file holds, the replay never
// panics and allocates within the header's bounds: it ends with an outcome
// or an error, and an error about a record names its line.
func FuzzReplayDecode(f *testing.F) {
	for _, s := range decodeTraceScenarios {
		if raw, err := os.ReadFile(filepath.Join(decodeTraceDir, s.name+".jsonl")); err == nil {
			f.Add(raw)
		}
	}
	hdr := `{"kvstream_trace":2,"side":"decode","decode":{"server":"s","max_sessions":2,"max_rooms_per_session":2,"bye_grace_ns":1,"max_pool_bytes":4096,"pool":[{"name":"K","item_len":64,"pages":4}]},"records":%d}` + "\n"
	f.Add([]byte(fmt.Sprintf(hdr, 1) + `{"seq":1,"actor":"decode","id":"s","type":"ExpectMsg","msg":{"Room":1,"Pages":[0,1]},"effects":["Reply {\"Drained\":false,\"Ended\":false,\"Err\":null,\"Room\":{\"Chunks\":null,\"Complete\":false,\"ID\":0,\"Pages\":null},\"State\":{\"Closed\":false,\"Draining\":false,\"Pooled\":false,\"Quarantined\":0,\"Rooms\":0,\"Sessions\":0,\"Tainted\":false}}"]}` + "\n"))
	f.Add([]byte(fmt.Sprintf(hdr, 2) + `{"seq":1,"actor":"decode","id":"s","type":"TimerMsg","msg":{"ID":1}}` + "\n" + `{"seq":2,"actor":"decode","id":"s","type":"SizedMsg","msg":{"Buffers":[{"Pages":99999999999}]}}` + "\n"))
	f.Add([]byte(fmt.Sprintf(hdr, 1) + `{"seq":1,"actor":"decode","id":"s","type":"NoticeMsg","msg":{"Notice":{"Positions":[1,2,3],"DstPages":[0],"Status":"SUCCEEDED","End":1e300}}}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rd, err := trace.NewReader(bytes.NewReader(data))
		if err != nil {
			return
		}
		out, err := decode.Replay(rd)
		switch {
		case err != nil:
			if !strings.HasPrefix(err.Error(), "trace line ") && !strings.HasPrefix(err.Error(), "trace header") {
				t.Fatalf("a replay error names neither a line nor the header: %v", err)
			}
		case out == nil:
			t.Fatal("no outcome and no error")
		default:
			_ = out.String()
		}
	})
}
