package tests

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/lab/replay"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTraceBothSidesInOneProcess: with KVSTREAM_TRACE set, a prefill
// engine and a decode server in one process (the examples' setup) each
// record their trace, to two files (the server's with ".decode"), and the
// entry point kvstream replay calls replays each through its own cores:
// no divergence, the room complete on both sides.
func TestTraceBothSidesInOneProcess(t *testing.T) {
	const layers, itemLen, pages = pairLayers, pairItemLen, pairPages
	path := filepath.Join(t.TempDir(), "incident.jsonl")
	t.Setenv(system.EnvTrace, path)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	node, srv, _, prefillTr, ppool, dst := newLoopbackPair(t)
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	cfg := system.Config{Buffers: system.MLABuffers([]uint64{ppool.Addr, ppool.Addr + itemLen*pages}, itemLen, pages), HookLayers: layers, PageSize: 16}
	eng, err := system.New(cfg, system.WithStream(gpu.NewStream("compute")), system.WithTransport(prefillTr))
	require.NoError(t, err)
	sess, err := decode.Dial(ctx, node, decode.DialConfig{Decode: srv.Addr(), Buffers: cfg.Buffers, PageSize: cfg.PageSize})
	require.NoError(t, err)
	require.NoError(t, sess.Attach(eng))
	spec := system.ChunkSpec{Room: 1, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	_, err = eng.Register(ctx, spec)
	require.NoError(t, err)
	fw, err := eng.BeginForward()
	require.NoError(t, err)
	for l := range layers {
		require.NoError(t, fw.LayerEnd(l))
	}
	require.NoError(t, fw.End())
	res, err := eng.Finish(ctx, 1)
	require.NoError(t, err)
	n, err := sess.NoticeFor(spec, res)
	require.NoError(t, err)
	require.NoError(t, sess.Notify(ctx, n))
	room, err := srv.Wait(ctx, 1)
	require.NoError(t, err)
	require.True(t, room.Complete)
	require.NoError(t, eng.Close())
	_, err = sess.Bye(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, srv.Close(ctx))

	for _, c := range []struct {
		path, side, want string
	}{
		{path, "", "chunk statuses: SUCCESS 1"},
		{path + decode.TraceSuffix, trace.SideDecode, "1 rooms ended (complete 1)"},
	} {
		raw, err := os.ReadFile(c.path)
		require.NoError(t, err, "%s was not written", c.path)
		rd, err := trace.NewReader(bytes.NewReader(raw))
		require.NoError(t, err, c.path)
		assert.Equal(t, c.side, rd.Header().Side, c.path)
		out, err := replay.Cores(rd)
		require.NoError(t, err, c.path)
		require.Nil(t, out.Divergence, "%s: %s", c.path, out)
		assert.Contains(t, out.String(), c.want, c.path)
	}
}
