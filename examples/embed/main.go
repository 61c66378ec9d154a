// Command embed is the smallest complete use of kvstream: a prefill engine
// on the embedded defaults (virtual GPU, in-process loopback fabric) streams
// one request's KV, layer group by layer group, into a decode pool, and
// checks every byte.
package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/system"
)

func main() {
	const layers, itemLen, pages = 8, 1152, 64 // an MLA-like pool: one buffer per layer
	geom := testbed.MLA(layers, itemLen, pages)
	prefill, err := testbed.NewPool(geom)
	check(err)
	decodeTr, err := loopback.Default().NewTransport("decode")
	check(err)
	decode, err := testbed.NewDecode(decodeTr, geom)
	check(err)

	gpu := sim.New(sim.Options{})
	stream := gpu.NewStream("compute")
	eng, err := system.New(system.Config{Buffers: prefill.EngineBuffers(), HookLayers: layers, GroupSize: 4, PageSize: 16},
		system.WithStream(stream))
	check(err)
	check(eng.AddPeer(decode.Peer("decode-0")))

	// The scheduler registers the chunk before its forward: 128 tokens on
	// prefill pages 0..7, going to decode pages 20..27.
	src, dst := []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{20, 21, 22, 23, 24, 25, 26, 27}
	reg, err := eng.Register(context.Background(), system.ChunkSpec{Room: 1, Start: 0, End: 128, Last: true,
		SrcPages: src, TotalPages: 8, Infos: []system.DecodeInfo{{Peer: "decode-0", DstPages: dst}}})
	check(err)

	// The forward loop: kernels on the GPU, LayerEnd after each layer.
	model := &testbed.Model{Stream: stream, Pool: prefill, HookLayers: layers, Seed: 1,
		LayerTime: func(int) time.Duration { return 2 * time.Millisecond }}
	start := time.Now()
	check(model.Forward(eng, []testbed.Write{{Room: 1, SrcPages: src, Tokens: 128}}))

	// The transfer path: Finish returns once every byte landed.
	res, err := eng.Finish(context.Background(), 1)
	check(err)
	fmt.Printf("room 1: %s, mode %s, %d bytes in %d batches, finished %v after the forward was enqueued\n",
		res.Status, reg.Mode, res.Stats.Bytes, res.Stats.Batches, time.Since(start).Round(time.Millisecond))

	want := make([]byte, itemLen)
	for b := 0; b < layers; b++ {
		for pos, page := range dst {
			testbed.Fill(want, 1, 1, b, pos)
			if !bytes.Equal(want, decode.Page(b, page)) {
				log.Fatalf("buffer %d position %d: bytes differ", b, pos)
			}
		}
	}
	fmt.Println("bytes_equal: true")
	check(eng.Close())
	gpu.Close()
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
