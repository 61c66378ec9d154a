package system_test

import (
	"context"
	"fmt"
	"log"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

// The prefill side's whole flow for one request: the decode pool as a peer,
// the chunk registered before its forward, LayerEnd after each layer's KV
// write was enqueued, and Finish once the bytes landed. Simulated hardware
// here (a virtual GPU, the loopback fabric); package decode gives the peer
// of a decode server in another process, and examples/disagg is the full
// loop with it.
func Example() {
	const layers, itemLen, pages = 4, 256, 8
	ctx := context.Background()
	fabric := loopback.NewFabric(loopback.Options{})
	prefillTr, err := fabric.NewTransport("prefill")
	check(err)
	defer prefillTr.Close()
	decodeTr, err := fabric.NewTransport("decode")
	check(err)
	defer decodeTr.Close()

	// Both pools: one KV tensor per layer (MLA), in memory that never moves.
	src, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer src.Free()
	dst, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer dst.Free()
	var srcBases []uint64
	peer := system.Peer{ID: "decode-0", Address: decodeTr.Address()}
	for l := uint64(0); l < layers; l++ {
		srcBases = append(srcBases, src.Addr+l*itemLen*pages)
		r, err := decodeTr.Register(dst.Addr+l*itemLen*pages, itemLen*pages)
		check(err)
		defer r.Deregister()
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}

	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	eng, err := system.New(system.Config{Buffers: system.MLABuffers(srcBases, itemLen, pages), HookLayers: layers, GroupSize: 2, PageSize: 16},
		system.WithStream(gpu.NewStream("compute")), system.WithTransport(prefillTr))
	check(err)
	defer eng.Close()
	check(eng.AddPeer(peer))

	// Tokens [0, 48) of room 7 sit on prefill pages 0-2 and go to decode
	// pages 6, 3, 0.
	reg, err := eng.Register(ctx, system.ChunkSpec{Room: 7, Start: 0, End: 48, Last: true, SrcPages: []int{0, 1, 2}, TotalPages: 3,
		Infos: []system.DecodeInfo{{Peer: "decode-0", DstPages: []int{6, 3, 0}}}})
	check(err)
	fw, err := eng.BeginForward()
	check(err)
	for l := 0; l < layers; l++ {
		check(fw.LayerEnd(l))
	}
	check(fw.End())
	res, err := eng.Finish(ctx, 7)
	check(err)
	fmt.Printf("room 7: %s, mode %s, %d bytes in %d batches\n", res.Status, reg.Mode, res.Stats.Bytes, res.Stats.Batches)
	// Output:
	// room 7: SUCCESS, mode per-layer, 3072 bytes in 2 batches
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
