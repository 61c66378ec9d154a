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
	"github.com/kvstream/kvstream/system/simulated"
)

const layers, itemLen, pages = 8, 1152, 64 // an MLA-like pool: one buffer per layer, 64 pages each

func main() {
	ctx := context.Background()
	prefill := newPool() // the prefill pool: one KV tensor per layer, in memory that never moves
	defer prefill.Free()
	decode, peer, closeDecode := decodePool() // the decode pool, and the Peer that describes it
	defer closeDecode()

	eng, err := system.New(system.Config{
		Buffers:    system.MLABuffers(bases(prefill), itemLen, pages), // one KV tensor per layer
		HookLayers: layers, GroupSize: 4, PageSize: 16,                // two groups of 4 layers
	}, system.WithHardware(simulated.Hardware())) // production: system.WithGPU(...), system.WithTransport(ucx)
	check(err)
	defer eng.Close()
	check(eng.AddPeer(peer)) // a decode server's session does this for you: decode.Client.Attach

	// Scheduler, before the forward that writes tokens [0, 128) of room 1:
	src, dst := []int{0, 1, 2, 3, 4, 5, 6, 7}, []int{20, 21, 22, 23, 24, 25, 26, 27}
	reg, err := eng.Register(ctx, system.ChunkSpec{Room: 1, Start: 0, End: 128, Last: true,
		SrcPages: src, TotalPages: 8, Infos: []system.DecodeInfo{{Peer: "decode", DstPages: dst}}})
	check(err) // reg.Mode: PerLayer with a real destination, Monolithic when all are dummies

	fw, err := eng.BeginForward() // forward loop: LayerEnd after each layer's KV write (O(1); an event per group)
	check(err)
	for l := range layers {
		launchLayer(eng, prefill, l, src) // the layer's kernel: writes its KV into the prefill pages
		check(fw.LayerEnd(l))
	}
	check(fw.End())

	res, err := eng.Finish(ctx, 1) // transfer path: the chunk's status once its bytes landed, or FAILED in time
	check(err)
	fmt.Printf("room 1: %s, %s, %d bytes in %d batches\n", res.Status, reg.Mode, res.Stats.Bytes, res.Stats.Batches)

	for l := range layers {
		for pos, p := range dst {
			if !bytes.Equal(kv(l, pos), page(decode, l, p)) {
				log.Fatalf("layer %d position %d (decode page %d): bytes differ", l, pos, p)
			}
		}
	}
	fmt.Println("bytes_equal: true")
}

// launchLayer enqueues layer l's kernel on the engine's compute stream (the
// virtual GPU's, whose kernels run Go code and take a modeled 2 ms): it
// writes the layer's KV of every position into its prefill page. In a
// serving stack this is the model's attention kernel on the GPU.
func launchLayer(eng *system.Engine, pool *hostmem.Block, l int, src []int) {
	gpu := eng.Stream().(*sim.Stream)
	check(gpu.Launch(sim.Kernel{Name: fmt.Sprintf("L%d", l), Duration: 2 * time.Millisecond, Run: func() {
		for pos, p := range src {
			copy(page(pool, l, p), kv(l, pos))
		}
	}}))
}

// decodePool registers a decode pool with a node of the fabric that
// simulated.Hardware's transports join (loopback.Default()) and returns the
// Peer that describes it to the prefill engine: what a decode server's
// session gives the engine, here by hand. "decode" is the ID a decode server
// gives its pool by default.
func decodePool() (*hostmem.Block, system.Peer, func()) {
	tr, err := loopback.Default().NewTransport("decode")
	check(err)
	pool := newPool()
	peer := system.Peer{ID: "decode", Address: tr.Address()}
	var regions []rdma.Region
	for _, base := range bases(pool) {
		r, err := tr.Register(base, itemLen*pages)
		check(err)
		regions = append(regions, r)
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}
	return pool, peer, func() {
		for _, r := range regions {
			_ = r.Deregister()
		}
		_ = tr.Close()
		_ = pool.Free()
	}
}

func newPool() *hostmem.Block {
	b, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	return b
}

// bases are a pool's buffers' addresses, layer by layer.
func bases(pool *hostmem.Block) []uint64 {
	out := make([]uint64, layers)
	for l := range out {
		out[l] = pool.Addr + uint64(l*itemLen*pages)
	}
	return out
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
