package system_test

import (
	"bytes"
	"context"
	"errors" // the standard library's: every error of system answers it
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/kvstream/kvstream/hw/cuda/sim"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/system"
	"github.com/kvstream/kvstream/system/simulated"
)

// The pools of these examples: one KV buffer per layer (MLA's latent), 8
// pages of 256 bytes each.
const layers, itemLen, pages = 4, 256, 8

// The prefill side's whole flow for one request, on simulated hardware (a
// virtual GPU and the in-process loopback fabric): the decode pool added as
// a peer, the chunk registered before its forward, each layer's kernel
// launched and then LayerEnd, and Finish once the bytes landed. In
// production the engine gets a GPU stream and a UCX transport instead
// (system.WithGPU or WithStream, WithTransport), and the peer comes from a
// decode server's session (package decode: Client.Attach); examples/disagg
// is that loop with both sides.
func Example() {
	ctx := context.Background()
	src := newPool()
	defer src.Free()
	dst, peer, closeDecode := decodePool()
	defer closeDecode()

	eng, err := system.New(system.Config{
		Buffers:    system.MLABuffers(src.bases(), itemLen, pages),
		HookLayers: layers, GroupSize: 2, PageSize: 16, // two groups of two layers
	}, system.WithHardware(simulated.Hardware()))
	check(err)
	defer eng.Close()
	check(eng.AddPeer(peer))

	// The scheduler, before the forward: tokens [0, 48) of room 7 sit on
	// prefill pages 0-2 and go to decode pages 6, 3, 0.
	srcPages, dstPages := []int{0, 1, 2}, []int{6, 3, 0}
	reg, err := eng.Register(ctx, system.ChunkSpec{Room: 7, Start: 0, End: 48, Last: true,
		SrcPages: srcPages, TotalPages: 3,
		Infos: []system.DecodeInfo{{Peer: peer.ID, DstPages: dstPages}}})
	check(err)
	fmt.Println("registered:", reg.Mode, reg.Reason)

	// The forward loop: each layer's kernel writes that layer's KV on the
	// engine's compute stream (here the virtual GPU's, whose kernels run Go
	// code), then LayerEnd tells the engine; at a group's last layer it
	// records the event the group's transfer waits for.
	gpu := eng.Stream().(*sim.Stream)
	fw, err := eng.BeginForward()
	check(err)
	for l := range layers {
		check(gpu.Launch(sim.Kernel{Name: fmt.Sprint("layer ", l), Duration: time.Millisecond, Run: func() {
			for _, p := range srcPages {
				fill(src.page(l, p), l, p)
			}
		}}))
		check(fw.LayerEnd(l))
	}
	check(fw.End())

	// The transfer path: the chunk's status, once every byte landed.
	res, err := eng.Finish(ctx, 7)
	check(err)
	fmt.Printf("room 7: %s, %d bytes in %d batches\n", res.Status, res.Stats.Bytes, res.Stats.Batches)
	equal := true
	for l := range layers {
		for i, p := range srcPages {
			equal = equal && bytes.Equal(src.page(l, p), dst.page(l, dstPages[i]))
		}
	}
	fmt.Println("bytes equal:", equal)
	// Output:
	// registered: per-layer one_destination
	// room 7: SUCCESS, 3072 bytes in 2 batches
	// bytes equal: true
}

// A room whose only destination is a dummy (a decode rank that needs none
// of this prefill's KV) has nothing to stream: the engine registers it for
// the monolithic send, which sends nothing, and says why.
func ExampleEngine_Register_dummy() {
	ctx := context.Background()
	src := newPool()
	defer src.Free()
	_, peer, closeDecode := decodePool()
	defer closeDecode()
	eng, err := system.New(system.Config{Buffers: system.MLABuffers(src.bases(), itemLen, pages),
		HookLayers: layers, PageSize: 16}, system.WithHardware(simulated.Hardware()))
	check(err)
	defer eng.Close()
	check(eng.AddPeer(peer))

	reg, err := eng.Register(ctx, system.ChunkSpec{Room: 1, Start: 0, End: 16, Last: true,
		SrcPages: []int{0}, TotalPages: 1,
		Infos: []system.DecodeInfo{{Peer: peer.ID, DstPages: []int{0}, Dummy: true}}})
	check(err)
	fmt.Println("registered:", reg.Mode, reg.Reason)
	// Output:
	// registered: monolithic all_dummy
}

// Drop aborts a room (a request cancelled before its forward) and returns
// once none of its writes can land any more: its decode pages may be
// reused. The room then has no chunk left to finish or drop.
func ExampleEngine_Drop() {
	ctx := context.Background()
	src := newPool()
	defer src.Free()
	_, peer, closeDecode := decodePool()
	defer closeDecode()
	eng, err := system.New(system.Config{Buffers: system.MLABuffers(src.bases(), itemLen, pages),
		HookLayers: layers, PageSize: 16}, system.WithHardware(simulated.Hardware()))
	check(err)
	defer eng.Close()
	check(eng.AddPeer(peer))

	_, err = eng.Register(ctx, system.ChunkSpec{Room: 3, Start: 0, End: 32, Last: true,
		SrcPages: []int{0, 1}, TotalPages: 2,
		Infos: []system.DecodeInfo{{Peer: peer.ID, DstPages: []int{4, 5}}}})
	check(err)
	fmt.Println("drop:", eng.Drop(ctx, 3))
	_, err = eng.Finish(ctx, 3)
	fmt.Println("finish after drop: no chunk:", errors.Is(err, system.ErrNoChunk))
	// Output:
	// drop: <nil>
	// finish after drop: no chunk: true
}

// New refuses to start without a compute stream and a transport, rather
// than start an engine that moves nothing: a production binary passes its
// GPU's stream and its UCX transport, a simulation passes
// system.WithHardware(simulated.Hardware()).
func ExampleNew_noHardware() {
	src := newPool()
	defer src.Free()
	_, err := system.New(system.Config{Buffers: system.MLABuffers(src.bases(), itemLen, pages),
		HookLayers: layers, PageSize: 16})
	fmt.Println("bad input:", errors.Is(err, system.ErrBadInput))
	// Output:
	// bad input: true
}

// pool is a KV pool: one buffer per layer, in memory that never moves
// (RDMA registration pins it; a GPU pool is device memory).
type pool struct{ *hostmem.Block }

func newPool() pool {
	b, err := hostmem.Alloc(layers * itemLen * pages)
	check(err)
	return pool{b}
}

// bases are the buffers' addresses, layer by layer.
func (p pool) bases() []uint64 {
	out := make([]uint64, layers)
	for l := range out {
		out[l] = p.Addr + uint64(l*itemLen*pages)
	}
	return out
}

// page is one page of one layer's buffer.
func (p pool) page(layer, page int) []byte {
	off := (layer*pages + page) * itemLen
	return p.Bytes[off : off+itemLen]
}

// decodePool is a decode pool registered with a node of the fabric that
// simulated.Hardware's transports join (loopback.Default()), and the Peer
// that describes it to a prefill engine: what a decode server's session
// gives the engine (decode.Client.Attach), here by hand. "decode" is the ID
// a decode server gives its pool by default.
func decodePool() (pool, system.Peer, func()) {
	tr, err := loopback.Default().NewTransport(fmt.Sprintf("decode-%d", decodeNodes.Add(1)))
	check(err)
	p := newPool()
	peer := system.Peer{ID: "decode", Address: tr.Address()}
	var regions []rdma.Region
	for _, base := range p.bases() {
		r, err := tr.Register(base, itemLen*pages)
		check(err)
		regions = append(regions, r)
		peer.Buffers = append(peer.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: itemLen})
	}
	return p, peer, func() {
		for _, r := range regions {
			_ = r.Deregister()
		}
		_ = tr.Close()
		_ = p.Free()
	}
}

// decodeNodes names the decode side's loopback nodes apart.
var decodeNodes atomic.Uint64

// fill writes what the model computes for a layer at a page: a pattern
// that tells every (layer, page, byte) apart.
func fill(b []byte, layer, page int) {
	for i := range b {
		b[i] = byte(layer*31 + page*7 + i)
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
