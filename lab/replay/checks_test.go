package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// edited is a copy of tr edited by f, renumbered from dropped+1 with its
// header's record count fixed, as a reviewer edits a trace file.
func edited(t *testing.T, tr *trace.Trace, f func(recs []trace.Record) []trace.Record) *trace.Trace {
	t.Helper()
	recs := deepCopy(t, tr.Records)
	recs = f(recs)
	for i := range recs {
		recs[i].Seq = tr.Header.Dropped + uint64(i) + 1
	}
	out := &trace.Trace{Header: tr.Header, Records: recs}
	out.Header.Records = len(recs)
	return out
}

// deepCopy copies records, numbers kept exact.
func deepCopy(t *testing.T, recs []trace.Record) []trace.Record {
	t.Helper()
	b, err := json.Marshal(recs)
	require.NoError(t, err)
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var out []trace.Record
	require.NoError(t, dec.Decode(&out))
	return out
}

// without deletes the records of the given sequence numbers.
func without(seqs ...uint64) func([]trace.Record) []trace.Record {
	return func(recs []trace.Record) []trace.Record {
		var out []trace.Record
		for _, r := range recs {
			keep := true
			for _, s := range seqs {
				keep = keep && r.Seq != s
			}
			if keep {
				out = append(out, r)
			}
		}
		return out
	}
}

func replayed(t *testing.T, tr *trace.Trace) *Outcome {
	t.Helper()
	out, err := Cores(tr.Stream())
	require.NoError(t, err)
	return out
}

// TestLostMessageIsNeverSilent: the reviewer's reproductions, from the
// timeout scenario: a submitter's Work and its Waited deleted, or the
// room's ChunkDone and the manager's RoomIdle deleted. Neither can be told
// from a valid trace by what the trace holds (chunked_fifo_late_chunk, a
// valid trace written at Close, ends with its last ChunkDone unhandled: the
// room stopped with it in its mailbox), so neither is a divergence; the
// summary names the message sent and never handled.
func TestLostMessageIsNeverSilent(t *testing.T) {
	tr := scenarioTrace(t, "timeout")
	for _, c := range []struct {
		name string
		seqs []uint64
		want []string
	}{
		{"lost Work", []uint64{18, 26}, []string{`to submitter/*, sent by chunk/1:0-8#1 at record 12: Work {"Buffers":[0,1],"Chunk":"1:0-8#1"`}},
		{"lost ChunkDone", []uint64{25, 27}, []string{`to room/1, sent by chunk/1:0-8#1 at record 24: ChunkDone {"Result":{"Chunk":"1:0-8#1"`}},
	} {
		out := replayed(t, edited(t, tr, without(c.seqs...)))
		require.Nil(t, out.Divergence, c.name)
		assert.Positive(t, out.InFlight, c.name)
		s := out.String()
		assert.Contains(t, s, "messages sent and never handled", c.name)
		for _, w := range c.want {
			assert.Contains(t, s, w, c.name)
		}
	}
	// The valid trace says what it left in flight too.
	out := replayed(t, scenarioTrace(t, "chunked_fifo_late_chunk"))
	require.Nil(t, out.Divergence)
	assert.Contains(t, out.String(), "1 messages sent and never handled")
	assert.Contains(t, out.String(), "to room/4, sent by chunk/4:32-48#3 at record 72: ChunkDone")
}

// TestDroppedRingStillDiverges: a trace whose ring dropped records unrelated
// to what it holds (numbered from dropped+1) replays whole, skipping
// nothing; a change planted in any record with effects of a whole actor is
// still a divergence at that record.
func TestDroppedRingStillDiverges(t *testing.T) {
	for _, name := range scenarioNames(t) {
		tr := scenarioTrace(t, name)
		shifted := edited(t, &trace.Trace{Header: func() trace.Header { h := tr.Header; h.Dropped = 3; return h }(), Records: tr.Records},
			func(r []trace.Record) []trace.Record { return r })
		out := replayed(t, shifted)
		require.Nil(t, out.Divergence, name)
		assert.Zero(t, out.Skipped, name)
		planted := 0
		for i, rec := range shifted.Records {
			if len(rec.Effects) == 0 || rec.Actor == trace.Engine {
				continue
			}
			bad := edited(t, shifted, func(recs []trace.Record) []trace.Record {
				recs[i].Effects[0] = "Planted" + recs[i].Effects[0]
				return recs
			})
			out := replayed(t, bad)
			if assert.NotNil(t, out.Divergence, "%s: record %d planted", name, rec.Seq) {
				assert.Equal(t, rec.Seq, out.Divergence.Seq, "%s", name)
			}
			planted++
		}
		assert.Positive(t, planted, name)
	}
	// Cut for real: the records about what began before the cut are
	// skipped, and counted.
	tr := scenarioTrace(t, "chunked_fifo_late_chunk")
	out := replayed(t, cut(tr, 1))
	require.Nil(t, out.Divergence)
	assert.Positive(t, out.Skipped)
	assert.Contains(t, out.String(), "records skipped")
}

// TestEngineRefusesShardedTrace: a resharded engine's trace is refused by
// the engine replay, by name, before anything is allocated.
func TestEngineRefusesShardedTrace(t *testing.T) {
	tr := scenarioTrace(t, "timeout")
	sh := *tr
	sh.Header.Config.Sharding = &trace.Sharding{Side: reshard.Side{Layers: 4, KVHeads: 1, HeadDim: 4, ElemBytes: 1, MLA: true, TP: 1, PageSize: 4}}
	sh.Header.Config.Replicas = 1
	_, err := Engine(context.Background(), opener(&sh))
	require.Error(t, err)
	assert.Contains(t, err.Error(), `reshards (header "sharding"`)
	assert.Contains(t, err.Error(), "replay the cores only")

	// A peer that reshards, to an engine that does not.
	peer := edited(t, tr, func(recs []trace.Record) []trace.Record {
		recs[0].Msg.(map[string]any)["Sharding"] = map[string]any{"Side": map[string]any{"Layers": 4, "KVHeads": 1, "HeadDim": 4, "ElemBytes": 1, "MLA": true, "TP": 1, "PageSize": 4}, "Rank": map[string]any{"TP": 0, "Stage": 0}}
		return recs
	})
	_, err = Engine(context.Background(), opener(peer))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "peer d0 reshards")
}

// TestAddChunkPeersChecked: an AddChunk whose peers are not its
// registration's is a divergence naming both lists.
func TestAddChunkPeersChecked(t *testing.T) {
	tr := edited(t, scenarioTrace(t, "timeout"), func(recs []trace.Record) []trace.Record {
		recs[2].Msg.(map[string]any)["Peers"] = []any{"zz"}
		return recs
	})
	out := replayed(t, tr)
	require.NotNil(t, out.Divergence)
	assert.Equal(t, uint64(3), out.Divergence.Seq)
	assert.Equal(t, []string{`AddChunk 1:0-8#1: per layer true, 2 pages owned, 1 destinations, peers ["zz"]`}, out.Divergence.Recorded)
	assert.Equal(t, []string{`AddChunk 1:0-8#1: per layer true, 2 pages owned, 1 destinations, peers ["d0"]`}, out.Divergence.Replayed)
}

// TestPeerCallsChecked: a successful AddPeer of an id added already, a
// successful RemovePeer of an unknown peer or of one a live chunk sends
// to, are divergences naming the record.
func TestPeerCallsChecked(t *testing.T) {
	tr := scenarioTrace(t, "timeout")
	call := func(typ, body string) trace.Record {
		var m any
		require.NoError(t, json.Unmarshal([]byte(body), &m))
		return trace.Record{Actor: trace.Engine, ID: "engine", Type: typ, Msg: m}
	}
	insert := func(at int, rec trace.Record) func([]trace.Record) []trace.Record {
		return func(recs []trace.Record) []trace.Record {
			return append(recs[:at:at], append([]trace.Record{rec}, recs[at:]...)...)
		}
	}
	for _, c := range []struct {
		edit func([]trace.Record) []trace.Record
		seq  uint64
		want string
	}{
		{insert(1, tr.Records[0]), 2, "the recorded AddPeer of d0 succeeded, but the peer was added already"},
		{insert(1, call("RemovePeerCall", `{"ID":"nosuch","Err":""}`)), 2, "the recorded RemovePeer of nosuch succeeded, but no such peer is added"},
		{insert(4, call("RemovePeerCall", `{"ID":"d0","Err":""}`)), 5, "the recorded RemovePeer of d0 succeeded, but 1 live chunks send to it"},
	} {
		out := replayed(t, edited(t, tr, c.edit))
		if assert.NotNil(t, out.Divergence, c.want) {
			assert.Equal(t, c.seq, out.Divergence.Seq, c.want)
			assert.Contains(t, out.Divergence.Reason, c.want)
		}
	}
	// Removed once its chunk ended, then added again: clean.
	out := replayed(t, edited(t, tr, func(recs []trace.Record) []trace.Record {
		recs = append(recs, call("RemovePeerCall", `{"ID":"d0","Err":""}`))
		return append(recs, tr.Records[0])
	}))
	assert.Nil(t, out.Divergence)
}

// TestRegisterRaceReplays: two registrations of one key both pass the
// registry's lookup; the loser's chunk, with a serial of its own, reaches
// the manager and its room answers that the key exists. The loser's outcome
// is Existing with the plan it built: its AddChunk is checked against that
// plan, and its room must spawn nothing.
func TestRegisterRaceReplays(t *testing.T) {
	tr := scenarioTrace(t, "submit_failure")
	race := func(spawn bool) *trace.Trace {
		return edited(t, tr, func(recs []trace.Record) []trace.Record {
			reg, add, room := recs[1], recs[2], recs[3]
			cp := deepCopy(t, []trace.Record{reg, add, room})
			reg, add, room = cp[0], cp[1], cp[2]
			reg.Msg.(map[string]any)["Chunk"] = "1:0-8#2"
			reg.Effects = []string{strings.Replace(reg.Effects[0], `"Existing":false`, `"Existing":true`, 1)}
			add.Msg.(map[string]any)["Chunk"] = "1:0-8#2"
			m, _ := json.Marshal(add.Msg)
			add.Effects = []string{`Route {"Msg":{"msg":` + trace.Canonical(json.RawMessage(m)) + `,"type":"AddChunk"},"Room":1}`}
			room.Msg.(map[string]any)["Chunk"] = "1:0-8#2"
			room.Effects = []string{`AnswerRegister {"Added":{"Chunk":"1:0-8#1","Existing":true,"PerLayer":true}}`}
			if spawn {
				room.Effects = recs[3].Effects
			}
			out := append(recs[:4:4], reg, add, room)
			out = append(out, recs[4:]...)
			// The room was routed one message more.
			for i := range out {
				for j, e := range out[i].Effects {
					out[i].Effects[j] = strings.Replace(e, `Idle {"Seen":2}`, `Idle {"Seen":3}`, 1)
				}
				if out[i].Type == "RoomIdle" {
					out[i].Msg.(map[string]any)["Seen"] = json.Number("3")
				}
			}
			return out
		})
	}
	out := replayed(t, race(false))
	assert.Nil(t, out.Divergence, "%v", out.Divergence)
	assert.Equal(t, 2, out.Registrations)
}
