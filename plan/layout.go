package plan

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
)

// ErrBadInput marks errors caused by a caller's value; it is cp.ErrBadInput,
// so that errors from the pure functions and from validation here share one
// class.
var ErrBadInput = cp.ErrBadInput

func badInput(format string, args ...any) error {
	return errors.Mark(errors.Newf(format, args...), ErrBadInput)
}

// Bounds on a layout and on a decode peer's buffers: each well above what a
// real deployment reaches, and low enough that what the engine sizes from
// it (a table per group, a page count) stays small. They are package
// trace's bounds on a trace header (trace.MaxHookLayers, MaxPages,
// MaxItemLen), which this package may not import (plan and trace are one
// layer, docs/ARCHITECTURE.md); package system's tests check that they
// agree.
const (
	// MaxHookLayers bounds the hook layers F: the deepest served models
	// have a few hundred layers, and the layout holds an entry per group.
	MaxHookLayers = 4096
	// MaxPages bounds a buffer's pages, the prefill's or a decode peer's:
	// 16 Mi pages hold 16 Mi tokens even at page size 1.
	MaxPages = 1 << 24
	// MaxItemLen bounds the bytes of one page of one buffer: 256 MiB.
	// Times MaxPages, a buffer's length is at most 2^52 bytes.
	MaxItemLen = 1 << 28
)

// Buffer is one KV tensor of the prefill pool.
type Buffer struct {
	Name    string // for logs: "K3", "V3", "KV12", "MTP0"
	Base    uint64 // address of page 0
	ItemLen uint64 // bytes of ONE page of this buffer
	Pages   int    // capacity in pages
	// Layer is the hook layer whose LayerEnd follows this buffer's write. A
	// layer outside [0, F) fires no hook (the MTP/nextn draft layer): its
	// buffers are sent at the end of the forward.
	Layer int
	// Memory is the kind of memory the buffer lives in (host by default):
	// the transport registers device memory as such (rdma.RegisterMemory;
	// UCX then takes its GPU paths instead of treating a device pointer as
	// host memory).
	Memory rdma.MemoryType
}

// Layout is the engine's static view of the prefill pool: the buffers, how
// hook layers group, and which buffers each group covers.
type Layout struct {
	Buffers  []Buffer
	Keys     []rdma.LocalKey // per buffer: its registration
	Groups   cp.Groups
	PageSize int
	CP       cp.CP

	groupBuffers [][]int // per group: the buffers whose layer is in it
	hookless     []int   // buffers no group covers
	all          []int

	sharding   *Sharding // nil: peers receive the buffers one for one
	replicas   reshard.ReplicaRule
	reshardIdx []int // per buffer: its number in cp/reshard's numbering
}

// NewLayout validates the buffers and derives the group tables.
func NewLayout(bufs []Buffer, keys []rdma.LocalKey, hookLayers, groupSize, pageSize int, c cp.CP) (*Layout, error) {
	if len(bufs) == 0 {
		return nil, badInput("layout has no buffer")
	}
	if len(keys) != len(bufs) {
		return nil, errors.AssertionFailedf("%d keys for %d buffers", len(keys), len(bufs))
	}
	if hookLayers > MaxHookLayers {
		// Before the group table is sized from it.
		return nil, badInput("hook layers %d: must be at most %d", hookLayers, MaxHookLayers)
	}
	g, err := cp.NewGroups(hookLayers, groupSize)
	if err != nil {
		return nil, err
	}
	if pageSize < 1 {
		return nil, badInput("page size %d: must be positive", pageSize)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	l := &Layout{Buffers: bufs, Keys: keys, Groups: g, PageSize: pageSize, CP: c,
		groupBuffers: make([][]int, g.Count())}
	for i, b := range bufs {
		switch {
		case b.ItemLen == 0:
			return nil, badInput("buffer %d (%s): zero item length", i, b.Name)
		case b.ItemLen > MaxItemLen:
			return nil, badInput("buffer %d (%s): item length %d: must be at most %d", i, b.Name, b.ItemLen, MaxItemLen)
		case b.Pages < 1:
			return nil, badInput("buffer %d (%s): %d pages", i, b.Name, b.Pages)
		case b.Pages > MaxPages:
			return nil, badInput("buffer %d (%s): %d pages: must be at most %d", i, b.Name, b.Pages, MaxPages)
		case b.Base == 0:
			return nil, badInput("buffer %d (%s): nil base address", i, b.Name)
		case b.Base+b.ItemLen*uint64(b.Pages) < b.Base: // both factors bounded above: the product fits
			return nil, badInput("buffer %d (%s): [%#x, +%d) wraps around the address space", i, b.Name, b.Base, b.ItemLen*uint64(b.Pages))
		}
		l.all = append(l.all, i)
		if b.Layer >= 0 && b.Layer < hookLayers {
			gi := g.Of(b.Layer)
			l.groupBuffers[gi] = append(l.groupBuffers[gi], i)
		} else {
			l.hookless = append(l.hookless, i)
		}
	}
	return l, nil
}

// GroupBuffers returns the buffers group g covers (shared; do not modify).
func (l *Layout) GroupBuffers(g int) []int { return l.groupBuffers[g] }

// Hookless returns the buffers no hook layer covers (shared).
func (l *Layout) Hookless() []int { return l.hookless }

// All returns every buffer index (shared).
func (l *Layout) All() []int { return l.all }

// MinPages is the smallest buffer capacity: the valid source page range.
func (l *Layout) MinPages() int {
	n := l.Buffers[0].Pages
	for _, b := range l.Buffers[1:] {
		n = min(n, b.Pages)
	}
	return n
}

func errorsWithRoom(err error, room uint64) error {
	return errors.Wrapf(err, "room %d", room)
}
