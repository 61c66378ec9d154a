// Command embed is the smallest complete use of kvstream, written only
// against public packages so that it can be copied out of the module: a
// prefill engine on simulated hardware (a virtual GPU and the in-process
// loopback fabric) streams one request's KV, layer group by layer group,
// into a decode pool, and checks every byte.
package main

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
)

const layers, itemLen, pages = 8, 1152, 64 // an MLA-like pool: one buffer per layer, 64 pages each

func main() {
	// The prefill pool: one KV tensor per layer, in memory that never moves.
	prefill, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer prefill.Free()
	bufs := make([]system.Buffer, layers)
	for l := range bufs {
		bufs[l] = system.Buffer{Name: fmt.Sprintf("KV%d", l), Base: prefill.Addr + uint64(l*itemLen*pages),
			ItemLen: itemLen, Pages: pages, Layer: l}
	}

	// The decode pool, registered with the decode side's transport: what a
	// decode server describes to the prefill as a Peer.
	decodeTr, err := loopback.Default().NewTransport("decode")
	check(err)
	defer decodeTr.Close()
	decode, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	defer decode.Free()
	peer := system.Peer{ID: "decode-0", Address: decodeTr.Address()}
	for l := 0; l < layers; l++ {
		r, err := decodeTr.Register(decode.Addr+uint64(l*itemLen*pages), itemLen*pages)
		check(err)
		defer func(r rdma.Region) { _ = r.Deregister() }(r)
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}

	// The prefill engine, on a virtual GPU's compute stream and its own
	// node of the loopback fabric. In production these are a real stream
	// (system.WithGPU) and a real transport (UCX): the engine refuses to
	// start without them unless told to simulate.
	gpu := sim.New(sim.Options{})
	defer gpu.Close()
	stream := gpu.NewStream("compute")
	prefillTr, err := loopback.Default().NewTransport("prefill")
	check(err)
	defer prefillTr.Close()
	eng, err := system.New(system.Config{Buffers: bufs, HookLayers: layers, GroupSize: 4, PageSize: 16},
		system.WithStream(stream), system.WithTransport(prefillTr))
	check(err)
	check(eng.AddPeer(peer))

	// The scheduler registers the chunk before its forward: 128 tokens on
	// prefill pages 0..7, going to decode pages 20..27.
	src, dst := []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{20, 21, 22, 23, 24, 25, 26, 27}
	reg, err := eng.Register(context.Background(), system.ChunkSpec{Room: 1, Start: 0, End: 128, Last: true,
		SrcPages: src, TotalPages: 8, Infos: []system.DecodeInfo{{Peer: "decode-0", DstPages: dst}}})
	check(err)

	// The forward loop: one kernel per layer writes that layer's KV on the
	// GPU, then LayerEnd tells the engine (O(1); an event per group).
	fw, err := eng.BeginForward()
	check(err)
	start := time.Now()
	for l := 0; l < layers; l++ {
		check(stream.Launch(sim.Kernel{Name: fmt.Sprintf("L%d", l), Duration: 2 * time.Millisecond, Run: func() {
			for pos, p := range src {
				copy(page(prefill, l, p), kv(l, pos))
			}
		}}))
		check(fw.LayerEnd(l))
	}
	check(fw.End())

	// The transfer path: Finish returns once every byte landed.
	res, err := eng.Finish(context.Background(), 1)
	check(err)
	fmt.Printf("room 1: %s, mode %s, %d bytes in %d batches, finished %v after the forward was enqueued\n",
		res.Status, reg.Mode, res.Stats.Bytes, res.Stats.Batches, time.Since(start).Round(time.Millisecond))
	check(eng.Close())

	for l := 0; l < layers; l++ {
		for pos, p := range dst {
			if !bytes.Equal(kv(l, pos), page(decode, l, p)) {
				log.Fatalf("layer %d position %d (decode page %d): bytes differ", l, pos, p)
			}
		}
	}
	fmt.Println("bytes_equal: true")
}

// page is one page of one layer's buffer in a pool.
func page(pool *hostmem.Block, layer, p int) []byte {
	off := (layer*pages + p) * itemLen
	return pool.Bytes[off : off+itemLen]
}

// kv is what the model writes for a layer at a position: a pattern that
// tells every (layer, position) apart.
func kv(layer, pos int) []byte {
	b := make([]byte, itemLen)
	for i := range b {
		b[i] = byte(layer*31 + pos*7 + i)
	}
	return b
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
