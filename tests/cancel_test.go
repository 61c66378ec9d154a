package tests

import (
	"bytes"
	"context"
	"errors" // the standard library's: every error of the packages answers it
	"testing"
	"time"

	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDecodeCancelMidTransfer: a real engine streams a room layer group by
// layer group into a decode server, both in one process over the loopback
// fabric. After the first group was posted the decode cancels the room
// (Server.Cancel): the prefill's client drops it in the engine (Attach),
// which posts no further group of it and answers once no write of it can
// land; only then does Cancel return, and the room's pages go to another
// room. The second layer's pages are never written: the group after the
// cancel was not posted. The cancel's latency is logged: the bound is one
// group's transfer plus a round trip.
func TestDecodeCancelMidTransfer(t *testing.T) {
	const layers, itemLen, pages = pairLayers, pairItemLen, pairPages
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pe := newPairEngine(t, 0)
	srv, dpool, dst, eng := pe.srv, pe.dpool, pe.dst, pe.eng
	for i := range pe.ppool.Bytes {
		pe.ppool.Bytes[i] = 0xab
	}
	sess := pe.dial(ctx, t)
	spec := system.ChunkSpec{Room: 1, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	reg, err := eng.Register(ctx, spec)
	require.NoError(t, err)
	require.Equal(t, system.PerLayer, reg.Mode)
	fw, err := eng.BeginForward()
	require.NoError(t, err)
	require.NoError(t, fw.LayerEnd(0)) // group 0 (layer 0) posted

	start := time.Now()
	require.NoError(t, srv.Cancel(ctx, 1, "the scheduler gave up"))
	took := time.Since(start)
	t.Logf("Server.Cancel with a group posted: %v from the call to the pages freed (one process, loopback)", took)
	require.NoError(t, srv.Expect(2, dst), "the cancelled room's pages are free")

	// The forward goes on: the dropped room posts nothing more.
	require.NoError(t, fw.LayerEnd(1))
	require.NoError(t, fw.End())
	_, err = eng.Finish(ctx, 1)
	assert.True(t, errors.Is(err, system.ErrNoChunk), "the room was dropped: %v", err)
	layer1 := dpool.Bytes[itemLen*pages:]
	for _, p := range dst {
		assert.True(t, bytes.Equal(make([]byte, itemLen), layer1[p*itemLen:(p+1)*itemLen]), "layer 1 page %d was written after the cancel", p)
	}
	_, err = sess.Bye(ctx, nil)
	require.NoError(t, err)
}

// TestDecodeCancelBetweenChunks: a room sent in two chunks, cancelled by
// the decode between them (no chunk of it live in the engine): Cancel
// returns at once and the pages go to another room, and the room's second
// chunk is refused by the engine (ErrRoomCancelled), so that it never
// writes the pages the other room now holds; the serving stack hears of
// the cancel (WithRoomCancelled).
func TestDecodeCancelBetweenChunks(t *testing.T) {
	const layers, itemLen, pages = pairLayers, pairItemLen, pairPages
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	heard := make(chan uint64, 4)
	pe := newPairEngine(t, 0, system.WithRoomCancelled(func(_ string, room uint64, _ string) { heard <- room }))
	srv, dpool, dst, eng := pe.srv, pe.dpool, pe.dst, pe.eng
	for i := range pe.ppool.Bytes {
		pe.ppool.Bytes[i] = 0xab
	}
	sess := pe.dial(ctx, t)
	chunk := func(start int, src int) system.ChunkSpec {
		return system.ChunkSpec{Room: 1, Start: start, End: start + 16, Last: start == 16, SrcPages: []int{src}, TotalPages: 2,
			Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	}
	forward := func() {
		fw, err := eng.BeginForward()
		require.NoError(t, err)
		require.NoError(t, fw.LayerEnd(0))
		require.NoError(t, fw.LayerEnd(1))
		require.NoError(t, fw.End())
	}

	// The first chunk (page 5) is sent.
	_, err := eng.Register(ctx, chunk(0, 0))
	require.NoError(t, err)
	forward()
	res, err := eng.Finish(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, system.Succeeded, res.Status)

	// Cancelled between its chunks; the pages go to room 2.
	require.NoError(t, srv.Cancel(ctx, 1, "evicted"))
	assert.Equal(t, uint64(1), <-heard)
	require.NoError(t, srv.Expect(2, dst), "the cancelled room's pages are free")

	// Its second chunk (page 2) is refused: room 2's page stays untouched.
	_, err = eng.Register(ctx, chunk(16, 1))
	require.Error(t, err)
	assert.True(t, errors.Is(err, system.ErrRoomCancelled), "%v", err)
	forward()
	for l := range layers {
		base := dpool.Bytes[l*itemLen*pages:]
		assert.True(t, bytes.Equal(make([]byte, itemLen), base[2*itemLen:3*itemLen]), "layer %d page 2 (room 2's now) was written after the cancel", l)
	}
	_, err = sess.Bye(ctx, nil)
	require.NoError(t, err)
}
