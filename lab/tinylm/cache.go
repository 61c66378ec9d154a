package tinylm

import (
	"encoding/binary"
	"math"

	"github.com/kvstream/kvstream/cp/reshard"
)

// Pool is a paged KV pool: Page returns the bytes of one page of one
// buffer (testbed.Pool and testbed.Decode are pools). A rank's buffers are
// numbered as kvstream lays them out (system.KVBuffers, system.MLABuffers,
// testbed.KV, testbed.MLA): see Buffer.
type Pool interface {
	Page(buffer, page int) []byte
}

// PageRef is where one page of a request lives.
type PageRef struct {
	Pool Pool
	Page int
}

// Cache is one rank's KV of one request: the side's layout, the rank, and
// per request page (positions [i*PageSize, (i+1)*PageSize)) the pool and
// page that hold it. Every read and write of the model's KV goes through
// it, so the decode reads exactly what the pages hold.
type Cache struct {
	Side  reshard.Side
	Rank  reshard.Rank
	Pages []PageRef
}

// Kinds of a layer's buffers: GQA's K and V; MLA's latent is kind 0.
const (
	KindK = 0
	KindV = 1
)

// Buffer is the index, in a rank's pool of PP stage st, of layer l's buffer
// of the given kind: every layer's K then every layer's V (GQA), or one
// latent per layer (MLA), layers numbered within the stage.
func Buffer(s *reshard.Side, st, l, kind int) int {
	lo, hi := s.StageLayers(st)
	if s.MLA {
		return l - lo
	}
	return kind*(hi-lo) + l - lo
}

// NewCaches builds the caches of one side whose pools hold a request on
// the same pages everywhere: pools[stage][tp] is that rank's pool, pages[i]
// the page of request page i.
func NewCaches(side reshard.Side, pools [][]Pool, pages []int) ([][]*Cache, error) {
	if err := side.Validate("side"); err != nil {
		return nil, err
	}
	if len(pools) != side.PP() {
		return nil, badInput("%d stages of pools, the side has %d PP stages", len(pools), side.PP())
	}
	out := make([][]*Cache, len(pools))
	for st, ranks := range pools {
		if len(ranks) != side.TP {
			return nil, badInput("PP stage %d: %d pools, the side has TP %d", st, len(ranks), side.TP)
		}
		for tp, p := range ranks {
			c := &Cache{Side: side, Rank: reshard.Rank{TP: tp, Stage: st}, Pages: make([]PageRef, len(pages))}
			for i, pg := range pages {
				c.Pages[i] = PageRef{Pool: p, Page: pg}
			}
			out[st] = append(out[st], c)
		}
	}
	return out, nil
}

// Capacity is the tokens the cache's pages hold.
func (c *Cache) Capacity() int { return len(c.Pages) * c.Side.PageSize }

// at returns the bytes of KV head h (logical) of layer l, kind, at slot pos.
func (c *Cache) at(l, kind, h, pos int) []byte {
	s := &c.Side
	ref := c.Pages[pos/s.PageSize]
	pg := ref.Pool.Page(Buffer(s, c.Rank.Stage, l, kind), ref.Page)
	lo, hi := s.RankHeads(c.Rank.TP)
	per, t, hb := hi-lo, pos%s.PageSize, int(s.HeadBytes())
	off := (t*per + h - lo) * hb
	if s.Order == reshard.HeadMajor {
		off = ((h-lo)*s.PageSize + t) * hb
	}
	return pg[off : off+hb]
}

// write stores v as float32 at (l, kind, h, pos).
func (c *Cache) write(l, kind, h, pos int, v []float64) {
	b := c.at(l, kind, h, pos)
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(x)))
	}
}

// read loads (l, kind, h, pos) into v.
func (c *Cache) read(l, kind, h, pos int, v []float64) {
	b := c.at(l, kind, h, pos)
	for i := range v {
		v[i] = float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:])))
	}
}

// MemPool is a pool in Go memory: buffers of pages of itemLen bytes.
type MemPool struct {
	itemLen int
	bufs    [][]byte
}

// NewMemPool allocates a zeroed pool.
func NewMemPool(buffers, itemLen, pages int) *MemPool {
	p := &MemPool{itemLen: itemLen}
	for b := 0; b < buffers; b++ {
		p.bufs = append(p.bufs, make([]byte, itemLen*pages))
	}
	return p
}

// Page implements Pool.
func (p *MemPool) Page(b, page int) []byte {
	return p.bufs[b][page*p.itemLen : (page+1)*p.itemLen]
}
