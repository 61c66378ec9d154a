package tests

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvstream/kvstream/lab/replay"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTraceOfARemovedPeerReplays: RemovePeer is recorded as a call, and the
// submitters' forgetting of the peer's endpoints is not (no core decides
// anything of it): a trace of a decode session that ended, and of its peer
// added again (a decode server restarted under its id), replays through the
// cores. The engine replay re-issues the removal, and says by name that it
// cannot replay a peer added again (it keeps one decode pool per id).
func TestTraceOfARemovedPeerReplays(t *testing.T) {
	// how: "now" removes the peer after its room finished, "again" adds it
	// again after, "when-idle" asks for the removal before the room
	// finished (RemovePeerWhenIdle: recorded when its chunk ended).
	record := func(how string) []byte {
		var buf bytes.Buffer
		r := newRig(t, rigOpts{geom: testbed.MLA(4, 16, 64), hooks: 4, group: 2, trace: &buf})
		r.register(chunk{room: 1, end: 8, last: true, src: []int{0, 1}, total: 2, infos: oneInfo("d0", []int{0, 1})})
		r.forward(testbed.Write{Room: 1, SrcPages: []int{0, 1}, Tokens: 8})
		// A registration toward d0 (refused, so nothing to replay) says
		// whether the peer is there.
		toD0 := func() error {
			_, err := r.eng.Register(context.Background(), r.spec(chunk{room: 9, end: 8, last: true, src: []int{4, 5}, total: 2, infos: oneInfo("d0", []int{4, 5})}))
			require.Error(t, err, "%s: a chunk toward d0 now", how)
			return err
		}
		if how == "when-idle" {
			require.NoError(t, r.eng.RemovePeerWhenIdle(r.decodes[0].Peer("d0")))
			assert.ErrorIs(t, toD0(), system.ErrPeerLost, "kept, refusing new chunks, until room 1's chunk ends")
		}
		r.finish(1)
		if how != "when-idle" {
			require.NoError(t, r.eng.RemovePeer("d0"))
		}
		assert.ErrorContains(t, toD0(), `unknown peer "d0"`, "%s: removed", how)
		if how == "again" {
			require.NoError(t, r.eng.AddPeer(r.decodes[0].Peer("d0")))
			r.register(chunk{room: 2, end: 8, last: true, src: []int{2, 3}, total: 2, infos: oneInfo("d0", []int{2, 3})})
			r.forward(testbed.Write{Room: 2, SrcPages: []int{2, 3}, Tokens: 8})
			r.finish(2)
		}
		require.NoError(t, r.eng.Close())
		return buf.Bytes()
	}
	for _, how := range []string{"now", "again", "when-idle"} {
		raw := record(how)
		require.Contains(t, string(raw), `"type":"RemovePeerCall"`)
		// The removal is recorded where it happened: after room 1's
		// Finish, even when it was asked for before it.
		finish := bytes.Index(raw, []byte(`"type":"Finish"`))
		require.GreaterOrEqual(t, finish, 0)
		assert.Greater(t, bytes.Index(raw, []byte(`"type":"RemovePeerCall"`)), finish, how)
		open := func() (trace.Stream, error) { return trace.NewReader(bytes.NewReader(raw)) }
		s, err := open()
		require.NoError(t, err)
		out, err := replay.Cores(s)
		require.NoError(t, err)
		require.Nil(t, out.Divergence, "%s: %s", how, out)
		_, err = replay.Engine(context.Background(), open)
		if how == "again" {
			assert.ErrorContains(t, err, "peer d0 is added again after it was removed")
		} else {
			assert.NoError(t, err, "%s: the engine replay re-issues the removal", how)
		}
	}
}
