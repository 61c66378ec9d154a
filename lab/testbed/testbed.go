package testbed

import (
	"encoding/binary"
	"strconv"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/system"
)

// Geometry is a KV pool's shape: one entry per buffer.
type Geometry struct {
	Names   []string
	Layers  []int // owning layer per buffer
	ItemLen uint64
	Pages   int // per buffer
}

// MLA returns one buffer per layer for layers 0..n-1.
func MLA(n int, itemLen uint64, pages int) Geometry {
	g := Geometry{ItemLen: itemLen, Pages: pages}
	for l := 0; l < n; l++ {
		g.Names = append(g.Names, "KV"+strconv.Itoa(l))
		g.Layers = append(g.Layers, l)
	}
	return g
}

// KV returns K buffers for layers 0..n-1 then V buffers.
func KV(n int, itemLen uint64, pages int) Geometry {
	g := Geometry{ItemLen: itemLen, Pages: pages}
	for _, kind := range []string{"K", "V"} {
		for l := 0; l < n; l++ {
			g.Names = append(g.Names, kind+strconv.Itoa(l))
			g.Layers = append(g.Layers, l)
		}
	}
	return g
}

// Buffers is the number of buffers.
func (g Geometry) Buffers() int { return len(g.Layers) }

// Pool is a KV pool: one hostmem block, or one allocation of a transport
// per buffer (NewPoolOn).
type Pool struct {
	Geometry
	Block *hostmem.Block // nil for a pool of allocations
	Bases []uint64
	// Allocs are the transport's allocations, one per buffer (registered:
	// Regions of the transport), when the pool is made of them.
	Allocs []rdma.Allocation
}

// NewPool allocates a zeroed pool.
func NewPool(g Geometry) (*Pool, error) {
	per := g.ItemLen * uint64(g.Pages)
	if per == 0 || g.Buffers() == 0 {
		return nil, errors.Newf("testbed: empty pool geometry %+v", g)
	}
	blk, err := hostmem.Alloc(int(per) * g.Buffers())
	if err != nil {
		return nil, err
	}
	p := &Pool{Geometry: g, Block: blk, Bases: make([]uint64, g.Buffers())}
	for b := range p.Bases {
		p.Bases[b] = blk.Addr + uint64(b)*per
	}
	return p, nil
}

// NewPoolOn allocates a zeroed pool from tr when it allocates registered
// memory (rdma.Allocator: UCX's ucp_mem_map, which a same-host peer maps
// and copies into directly, where memory the process registers is reached
// by a slower path), one allocation per buffer; else NewPool's, which the
// caller registers. Free releases either.
func NewPoolOn(tr rdma.Transport, g Geometry) (*Pool, error) {
	al, ok := tr.(rdma.Allocator)
	if !ok {
		return NewPool(g)
	}
	per := g.ItemLen * uint64(g.Pages)
	if per == 0 || g.Buffers() == 0 {
		return nil, errors.Newf("testbed: empty pool geometry %+v", g)
	}
	p := &Pool{Geometry: g, Bases: make([]uint64, g.Buffers())}
	for b := range p.Bases {
		a, err := al.Allocate(per)
		if err != nil {
			_ = p.Free()
			return nil, errors.Wrapf(err, "testbed: allocate buffer %d of %d bytes from the %s transport", b, per, tr.Name())
		}
		p.Allocs = append(p.Allocs, a)
		p.Bases[b] = a.Desc().Addr
	}
	return p, nil
}

// EngineBuffers returns the engine's view of the pool.
func (p *Pool) EngineBuffers() []system.Buffer {
	out := make([]system.Buffer, p.Geometry.Buffers())
	for b := range out {
		out[b] = system.Buffer{Name: p.Names[b], Base: p.Bases[b], ItemLen: p.ItemLen, Pages: p.Pages, Layer: p.Layers[b]}
	}
	return out
}

// Page returns the bytes of one page of one buffer.
func (p *Pool) Page(b, page int) []byte {
	if p.Allocs != nil {
		off := uint64(page) * p.ItemLen
		return p.Allocs[b].Bytes()[off : off+p.ItemLen]
	}
	off := uint64(b)*p.ItemLen*uint64(p.Pages) + uint64(page)*p.ItemLen
	return p.Block.Bytes[off : off+p.ItemLen]
}

// Free releases the pool's memory.
func (p *Pool) Free() error {
	if p.Block != nil {
		return p.Block.Free()
	}
	var err error
	for _, a := range p.Allocs {
		err = errors.CombineErrors(err, a.Free())
	}
	p.Allocs = nil
	return err
}

// Decode is a decode-side pool registered with a transport.
type Decode struct {
	*Pool
	Transport rdma.Transport
	Regions   []rdma.Region
}

// NewDecode allocates a decode pool and registers every buffer.
func NewDecode(tr rdma.Transport, g Geometry) (*Decode, error) {
	p, err := NewPool(g)
	if err != nil {
		return nil, err
	}
	d := &Decode{Pool: p, Transport: tr}
	for b := range p.Bases {
		r, err := tr.Register(p.Bases[b], p.ItemLen*uint64(p.Pages))
		if err != nil {
			_ = d.Free()
			return nil, err
		}
		d.Regions = append(d.Regions, r)
	}
	return d, nil
}

// Peer describes the pool to a prefill engine.
func (d *Decode) Peer(id string) system.Peer {
	p := system.Peer{ID: id, Address: d.Transport.Address()}
	for _, r := range d.Regions {
		p.Buffers = append(p.Buffers, system.PeerBuffer{Region: r.Desc(), ItemLen: d.ItemLen})
	}
	return p
}

// Free deregisters and releases the pool.
func (d *Decode) Free() error {
	for _, r := range d.Regions {
		_ = r.Deregister()
	}
	return d.Pool.Free()
}

// Fill writes the KV bytes the model produces for (room, buffer, position):
// a deterministic pattern, so that any page can be checked against what it
// must hold.
func Fill(dst []byte, seed, room uint64, buffer, position int) {
	x := seed ^ room*0x9E3779B97F4A7C15 ^ uint64(buffer)*0xC2B2AE3D27D4EB4F ^ uint64(position)*0x165667B19E3779F9
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		x += 0x9E3779B97F4A7C15
		binary.LittleEndian.PutUint64(dst[i:], mix(x))
	}
	if i < len(dst) {
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], mix(x+0x9E3779B97F4A7C15))
		copy(dst[i:], tail[:])
	}
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
