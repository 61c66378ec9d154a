package decode_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// A decode server and a prefill engine stream one request's KV: the decode
// side expects the room on the pages it allocated, the prefill registers
// the chunk, runs the forward, finishes it and tells the decode side, which
// learns that the room's bytes landed. Here both sides share one process,
// one node and the loopback fabric; in production each has its own process
// and node, over RDMA. (examples/disagg is the full loop.)
func Example() {
	const layers, itemLen, pages = 2, 256, 8
	ctx := context.Background()
	fabric := loopback.NewFabric(loopback.Options{})
	node, err := decode.Listen("127.0.0.1:0", nil)
	check(err)
	defer node.Close(ctx)

	// Decode side: register the pool, expect room 1 on decode pages 5 and 2.
	decodeTr, err := fabric.NewTransport("decode")
	check(err)
	defer decodeTr.Close()
	dpool, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer dpool.Free()
	srv, err := decode.New(node, decodeTr, decode.Config{Buffers: []decode.Buffer{
		{Name: "KV0", Base: dpool.Addr, ItemLen: itemLen, Pages: pages},
		{Name: "KV1", Base: dpool.Addr + itemLen*pages, ItemLen: itemLen, Pages: pages},
	}})
	check(err)
	defer srv.Close(ctx)
	dst := []int{5, 2}
	check(srv.Expect(1, dst))

	// Prefill side: an engine on a virtual GPU, with the decode pool as peer.
	prefillTr, err := fabric.NewTransport("prefill")
	check(err)
	defer prefillTr.Close()
	ppool, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer ppool.Free()
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	cfg := system.Config{Buffers: system.MLABuffers([]uint64{ppool.Addr, ppool.Addr + itemLen*pages}, itemLen, pages),
		HookLayers: layers, PageSize: 16}
	eng, err := system.New(cfg, system.WithStream(gpu.NewStream("compute")), system.WithTransport(prefillTr))
	check(err)
	sess, err := decode.Dial(ctx, node, decode.DialConfig{Decode: srv.Addr(), Buffers: cfg.Buffers, PageSize: cfg.PageSize})
	check(err)
	check(sess.Attach(eng))

	spec := system.ChunkSpec{Room: 1, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	_, err = eng.Register(ctx, spec)
	check(err)
	fw, err := eng.BeginForward()
	check(err)
	for l := 0; l < layers; l++ {
		check(fw.LayerEnd(l)) // after the layer's KV write was enqueued
	}
	check(fw.End())
	res, err := eng.Finish(ctx, 1)
	check(err)
	notice, err := sess.NoticeFor(spec, res)
	check(err)
	check(sess.Notify(ctx, notice))

	room, err := srv.Wait(ctx, 1)
	check(err)
	fmt.Printf("room %d: complete %v, %d chunk, %d bytes\n", room.ID, room.Complete, len(room.Chunks), room.Chunks[0].Bytes)
	// ... decode the room's pages, then give them back:
	check(srv.Release(1))

	check(eng.Close())
	sum, err := sess.Bye(ctx, nil)
	check(err)
	fmt.Printf("session: %d chunks, %d failed\n", sum.Chunks, sum.Failed)
	// Output:
	// room 1: complete true, 1 chunk, 1024 bytes
	// session: 1 chunks, 0 failed
}

// A room whose Wait fails must not be decoded, and the error's class says
// whether its pages may go to another room. Here the prefill gave up on
// the room's chunk (its Finish's context was cancelled before the forward
// ran): Finish returned once no write of the chunk could land, so the
// room failed and its pages are quiet.
func ExampleServer_Wait() {
	const layers, itemLen, pages = 2, 256, 8
	ctx := context.Background()
	fabric := loopback.NewFabric(loopback.Options{})
	node, err := decode.Listen("127.0.0.1:0", nil)
	check(err)
	defer node.Close(ctx)

	decodeTr, err := fabric.NewTransport("decode")
	check(err)
	defer decodeTr.Close()
	dpool, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer dpool.Free()
	srv, err := decode.New(node, decodeTr, decode.Config{Buffers: []decode.Buffer{
		{Name: "KV0", Base: dpool.Addr, ItemLen: itemLen, Pages: pages},
		{Name: "KV1", Base: dpool.Addr + itemLen*pages, ItemLen: itemLen, Pages: pages},
	}})
	check(err)
	defer srv.Close(ctx)
	dst := []int{5, 2}
	check(srv.Expect(1, dst))

	prefillTr, err := fabric.NewTransport("prefill")
	check(err)
	defer prefillTr.Close()
	ppool, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer ppool.Free()
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	cfg := system.Config{Buffers: system.MLABuffers([]uint64{ppool.Addr, ppool.Addr + itemLen*pages}, itemLen, pages),
		HookLayers: layers, PageSize: 16}
	eng, err := system.New(cfg, system.WithStream(gpu.NewStream("compute")), system.WithTransport(prefillTr))
	check(err)
	sess, err := decode.Dial(ctx, node, decode.DialConfig{Decode: srv.Addr(), Buffers: cfg.Buffers, PageSize: cfg.PageSize})
	check(err)
	check(sess.Attach(eng))

	spec := system.ChunkSpec{Room: 1, Start: 0, End: 32, Last: true, SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: sess.Peer().ID, DstPages: dst}}}
	_, err = eng.Register(ctx, spec)
	check(err)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	res, err := eng.Finish(cancelled, 1)
	fmt.Printf("finish: %v, not quiesced %v\n", res.Status, errors.Is(err, system.ErrNotQuiesced))
	notice, err := sess.NoticeFor(spec, res)
	check(err)
	check(sess.Notify(ctx, notice))

	_, err = srv.Wait(ctx, 1)
	fmt.Printf("wait: chunk failed %v, not quiesced %v\n", errors.Is(err, decode.ErrChunkFailed), errors.Is(err, decode.ErrNotQuiesced))
	check(srv.Release(1)) // its pages may go to another room

	check(eng.Close())
	_, err = sess.Bye(ctx, nil)
	fmt.Printf("bye: chunk failed %v\n", errors.Is(err, decode.ErrChunkFailed))
	// Output:
	// finish: FAILED, not quiesced false
	// wait: chunk failed true, not quiesced false
	// bye: chunk failed true
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
