package plan

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"unsafe"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/messages"
)

// Peer is a decode session this engine writes to: where to connect and its
// buffers, in the same order as the prefill layout (or, with a Sharding, as
// its own stage's buffers).
type Peer struct {
	ID      string
	Address []byte
	Buffers []PeerBuffer
	// Sharding, optional, is how the decode pool shards the model and which
	// decode rank this peer is. Set, the engine must have a prefill sharding
	// too: the peer then receives what cp/reshard routes to it from this
	// prefill rank (possibly nothing), and Buffers are its PP stage's layers
	// in the order KVBuffers makes them (every layer's K, then every layer's
	// V; MLA: one per layer), each of Side.ItemLen bytes per page. Nil: the
	// peer shards like this rank and receives its buffers one for one.
	Sharding *Sharding

	route *Route // computed by ResolvePeer when Sharding is set
}

// Route returns the peer's route from this prefill rank, computed by
// ResolvePeer; nil without a sharding (buffers one for one, whole pages).
func (p *Peer) Route() *Route { return p.route }

// SamePool reports whether q describes the decode pool p does: the same
// id, transport address, buffers (regions, their keys and page sizes) and
// sharding. A decode session that ended and one added since under the same
// id differ at least in their address where the decode gives each session
// an access point of its own (as the decode server does wherever its
// transport can revoke one).
func (p *Peer) SamePool(q *Peer) bool {
	switch {
	case p.ID != q.ID, !bytes.Equal(p.Address, q.Address), len(p.Buffers) != len(q.Buffers):
		return false
	case (p.Sharding == nil) != (q.Sharding == nil), p.Sharding != nil && !reflect.DeepEqual(*p.Sharding, *q.Sharding):
		return false
	}
	for i, b := range p.Buffers {
		c := q.Buffers[i]
		if b.ItemLen != c.ItemLen || b.Region.Addr != c.Region.Addr || b.Region.Len != c.Region.Len || !bytes.Equal(b.Region.Key, c.Region.Key) {
			return false
		}
	}
	return true
}

// PeerBuffer is one decode buffer: its registered region and page size.
type PeerBuffer struct {
	Region  rdma.RegionDesc
	ItemLen uint64
}

// Pages is the buffer's capacity in pages (ResolvePeer bounds it by
// MaxPages). Of a buffer it did not check, a zero item length holds none,
// and a count beyond the int range is math.MaxInt, never negative.
func (b PeerBuffer) Pages() int {
	if b.ItemLen == 0 {
		return 0
	}
	return int(min(b.Region.Len/b.ItemLen, math.MaxInt))
}

// checkRegion checks peer buffer i's region as a page store: a whole
// number of pages of its item length, at least one and at most MaxPages,
// within the address space. Every later use (the page capacity, the
// blocks' remote addresses) relies on it.
func checkRegion(peer string, i int, b PeerBuffer) error {
	r := b.Region
	switch {
	case b.ItemLen == 0:
		return badInput("peer %q buffer %d: zero item length", peer, i)
	case r.Len < b.ItemLen:
		return badInput("peer %q buffer %d: region of %d bytes holds no page", peer, i, r.Len)
	case r.Len%b.ItemLen != 0:
		return badInput("peer %q buffer %d: region of %d bytes is not a whole number of %d-byte pages", peer, i, r.Len, b.ItemLen)
	case r.Len/b.ItemLen > MaxPages:
		return badInput("peer %q buffer %d: region of %d bytes holds %d pages of %d bytes: must be at most %d", peer, i, r.Len, r.Len/b.ItemLen, b.ItemLen, MaxPages)
	case r.Addr+r.Len < r.Addr:
		return badInput("peer %q buffer %d: region [%#x, +%d) wraps around the address space", peer, i, r.Addr, r.Len)
	}
	return nil
}

// ValidatePeer checks a peer against the layout (see ResolvePeer).
func ValidatePeer(l *Layout, p Peer) error {
	_, err := ResolvePeer(l, p)
	return err
}

// ResolvePeer checks a peer against the layout and returns the copy the
// engine keeps. Without a sharding: one buffer per prefill buffer, same item
// lengths. With one: the pairing of both sides must reshard
// (reshard.NewPlan: an impossible pairing is an ErrBadInput naming the
// values), the peer's buffers must be its stage's, of its side's item
// length, and the copy carries the peer's Route from this rank. Either
// way each buffer's region must be a whole number of pages of its item
// length, at most MaxPages, and must not wrap around the address space;
// every error names the peer and the buffer.
func ResolvePeer(l *Layout, p Peer) (*Peer, error) {
	switch {
	case p.ID == "":
		return nil, badInput("peer has an empty id")
	case len(p.Address) == 0:
		return nil, badInput("peer %q has an empty transport address", p.ID)
	case p.Sharding != nil:
		r, err := l.resolveRoute(&p)
		if err != nil {
			return nil, err
		}
		for i, b := range p.Buffers {
			if err := checkRegion(p.ID, i, b); err != nil {
				return nil, err
			}
		}
		p.route = r
		return &p, nil
	case len(p.Buffers) != len(l.Buffers):
		return nil, badInput("peer %q has %d buffers, the prefill layout %d", p.ID, len(p.Buffers), len(l.Buffers))
	}
	for i, b := range p.Buffers {
		if b.ItemLen != l.Buffers[i].ItemLen {
			return nil, badInput("peer %q buffer %d: item length %d, prefill %d", p.ID, i, b.ItemLen, l.Buffers[i].ItemLen)
		}
		if err := checkRegion(p.ID, i, b); err != nil {
			return nil, err
		}
	}
	p.route = nil // only ResolvePeer sets it
	return &p, nil
}

// DecodeInfo is one decode destination of a room.
type DecodeInfo struct {
	Peer string
	// DstPages is the full request's destination page list: position p of
	// the request goes to page DstPages[p].
	DstPages []int
	// Dummy destinations receive nothing.
	Dummy bool
}

// ChunkSpec is what the scheduler registers before the forward that writes
// tokens [Start, End) of a room.
type ChunkSpec struct {
	Room       uint64
	Start, End int  // tokens; End is floored to a page unless Last
	Last       bool // the request's last chunk
	// SrcPages are the prefill pages backing the chunk, in position order. A
	// trailing partial page of a non-last chunk may be included; it is sent
	// with the next chunk.
	SrcPages []int
	// TotalPages is the request's page count. The contiguous CP rule needs
	// it; when set it is checked against the chunk and the destinations.
	TotalPages int
	Infos      []DecodeInfo
}

// Key returns the chunk's idempotence key: its room and exact range, and for
// an empty range the forward epoch (see messages.ChunkKey).
func (s *ChunkSpec) Key(pageSize int, epoch uint64) messages.ChunkKey {
	end := s.End
	if !s.Last && pageSize > 0 && end > 0 {
		end -= end % pageSize
	}
	k := messages.ChunkKey{Room: s.Room, Start: s.Start, End: max(end, s.Start)}
	if k.End == k.Start {
		k.Epoch = epoch
	}
	return k
}

// Plan is everything a chunk context sends, computed once at registration.
type Plan struct {
	Chunk  messages.Chunk
	Range  cp.Range
	Mode   cp.Mode
	Reason cp.Reason
	Dests  []Dest // the non-dummy destinations
	Owned  int    // pages this rank sends per buffer per destination
}

// Dest is one real destination with the chunk's runs toward it.
type Dest struct {
	Info int // index in the spec's Infos
	Peer string
	Runs []cp.Run
	// Route is the peer's route from this rank when both sides are sharded
	// (shared, read-only); nil: every buffer goes one for one, whole pages.
	Route *Route
}

// Empty reports whether the plan sends nothing.
func (p *Plan) Empty() bool { return p.Owned == 0 || len(p.Dests) == 0 }

// Digest is a 64-bit FNV-1a hash of what the plan decides: its range, mode,
// pages owned, and per destination the peer, its runs and which buffers
// its route takes. A trace records it with each registration, so that a
// replay that rebuilds the plan from the recorded pages and peers knows it
// rebuilt the same one.
func (p *Plan) Digest() uint64 {
	h := uint64(14695981039346656037)
	mix := func(v uint64) {
		for range 8 {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	str := func(s string) {
		mix(uint64(len(s)))
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	mix(uint64(p.Range.Start))
	mix(uint64(p.Range.End))
	mix(uint64(p.Range.PageStart))
	mix(uint64(p.Range.Pages))
	if p.Range.Last {
		mix(1)
	} else {
		mix(0)
	}
	mix(uint64(p.Mode))
	mix(uint64(p.Owned))
	mix(uint64(len(p.Dests)))
	for _, d := range p.Dests {
		mix(uint64(d.Info))
		str(d.Peer)
		mix(uint64(len(d.Runs)))
		for _, r := range d.Runs {
			mix(uint64(r.Src))
			mix(uint64(r.Dst))
			mix(uint64(r.Len))
		}
		if d.Route != nil {
			for _, b := range d.Route.DstBuffers {
				mix(uint64(int64(b)))
			}
		}
	}
	return h
}

// Bytes is what the plan sends in total.
func (p *Plan) Bytes(l *Layout) uint64 {
	var whole, n uint64
	for _, b := range l.Buffers {
		whole += b.ItemLen
	}
	for _, d := range p.Dests {
		if d.Route == nil {
			n += whole
			continue
		}
		for _, db := range d.Route.DstBuffers {
			if db >= 0 {
				n += d.Route.PageBytes()
			}
		}
	}
	return n * uint64(p.Owned)
}

// BuildPlan validates a spec and computes its plan: the exact range, the
// owned pages and their absolute positions, and the runs toward every real
// destination. policy is the register guard's (invariant 8): which rooms
// stream per layer. It is pure, and on error it names the bad value. peers
// answers whether a peer exists.
func BuildPlan(l *Layout, peers func(string) (*Peer, bool), s *ChunkSpec, policy cp.Policy) (*Plan, error) {
	r, err := cp.ChunkRange(s.Start, s.End, l.PageSize, s.Last)
	if err != nil {
		return nil, err
	}
	src := s.SrcPages
	switch {
	case len(src) == r.Pages:
	case !s.Last && len(src) == r.Pages+1 && s.End > r.End:
		src = src[:r.Pages] // the partial page goes with the next chunk
	default:
		return nil, badInput("room %d chunk [%d, %d): %d source pages, the range needs %d", s.Room, s.Start, r.End, len(s.SrcPages), r.Pages)
	}
	if s.TotalPages != 0 && r.PageStart+r.Pages > s.TotalPages {
		return nil, badInput("room %d chunk pages [%d, %d) beyond the request's %d pages", s.Room, r.PageStart, r.PageStart+r.Pages, s.TotalPages)
	}
	if l.CP.Rule == cp.Contiguous && s.TotalPages == 0 {
		return nil, badInput("room %d: the contiguous CP rule needs the request's total pages", s.Room)
	}
	// The owned positions are an arithmetic progression under both CP
	// rules: the runs are built from it and the page lists directly, with
	// no owned or mapped page list in between. The source side (the check
	// of its pages, where they break a run) is done once for every
	// destination.
	owned, err := l.CP.OwnedStride(len(src), r.PageStart, s.TotalPages)
	if err != nil {
		return nil, err
	}
	source, err := cp.NewCheckedSource(src, r.PageStart, owned, l.MinPages())
	if err != nil {
		return nil, errorsWithRoom(err, s.Room)
	}
	if len(s.Infos) == 0 {
		return nil, badInput("room %d: no decode info", s.Room)
	}
	// A destination that receives nothing from this rank (a dummy, or a
	// resharded peer whose route from this rank is empty) is left out, and
	// does not count for the guard.
	dummy := make([]bool, len(s.Infos))
	infoPeers := make([]*Peer, len(s.Infos))
	for i, info := range s.Infos {
		if dummy[i] = info.Dummy; info.Dummy {
			continue
		}
		peer, ok := peers(info.Peer)
		if !ok {
			return nil, badInput("room %d info %d: unknown peer %q", s.Room, i, info.Peer)
		}
		infoPeers[i] = peer
		if r := peer.Route(); r != nil && r.Empty() {
			dummy[i] = true
		}
	}
	mode, reason, _ := cp.Guard(dummy, policy)
	p := &Plan{Range: r, Mode: mode, Reason: reason, Owned: owned.N}
	// Each real destination's length is checked here, in order; its pages
	// and runs (or an equal earlier list) by destRuns, possibly on several
	// goroutines. The first destination in order with an error names it,
	// as if they were planned one after the other.
	work := make([]destWork, 0, len(s.Infos))
	var lenErr error
	for i, info := range s.Infos {
		if dummy[i] {
			continue
		}
		if s.TotalPages != 0 && len(info.DstPages) < s.TotalPages {
			lenErr = badInput("room %d info %d: %d destination pages for a request of %d pages", s.Room, i, len(info.DstPages), s.TotalPages)
			break
		}
		work = append(work, destWork{info: i, pages: info.DstPages, capacity: peerPages(infoPeers[i])})
	}
	destRuns(source, work)
	for _, w := range work {
		if w.err != nil {
			return nil, errorsWithRoom(w.err, s.Room)
		}
		runs := w.runs
		if w.same >= 0 {
			runs = work[w.same].runs
		}
		info := s.Infos[w.info]
		p.Dests = append(p.Dests, Dest{Info: w.info, Peer: info.Peer, Runs: runs, Route: infoPeers[w.info].Route()})
	}
	if lenErr != nil {
		return nil, lenErr
	}
	return p, nil
}

// equalPages is slices.Equal for page lists, as one memory compare: the
// generic loop compared an int at a time, and 31 lists of 100 000 pages
// (a chunk toward a decode TP group of 32) took most of the plan's time.
// Lists that share their backing array are equal without reading them.
func equalPages(a, b []int) bool {
	switch {
	case len(a) != len(b):
		return false
	case len(a) == 0 || &a[0] == &b[0]:
		return true
	}
	n := len(a) * int(unsafe.Sizeof(a[0]))
	return bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), n), unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), n))
}

func peerPages(p *Peer) int {
	n := p.Buffers[0].Pages()
	for _, b := range p.Buffers[1:] {
		n = min(n, b.Pages())
	}
	return n
}

// Clone returns a copy of s that shares no slice with it: the engine keeps
// it to check later registrations of the same chunk, while the caller may
// reuse its own slices. A page list equal to the one before it (the ranks
// of a decode TP group) shares that one's copy, read-only: comparing reads
// the list once, copying it also allocates and writes it (a chunk of
// 100 000 pages toward 32 such ranks: 25 MB of copies).
func (s *ChunkSpec) Clone() *ChunkSpec { return s.CloneFor(nil) }

// CloneFor is Clone for the spec p was built from: two infos whose
// destinations took the same runs (BuildPlan found their lists equal) share
// a copy without another compare. A nil p compares.
func (s *ChunkSpec) CloneFor(p *Plan) *ChunkSpec {
	var runs [][]cp.Run // by info: its destination's runs
	if p != nil {
		runs = make([][]cp.Run, len(s.Infos))
		for _, d := range p.Dests {
			if d.Info >= 0 && d.Info < len(runs) {
				runs[d.Info] = d.Runs
			}
		}
	}
	same := func(i int) bool {
		if runs != nil && len(runs[i]) > 0 && len(runs[i-1]) > 0 && &runs[i][0] == &runs[i-1][0] {
			return true
		}
		return equalPages(s.Infos[i].DstPages, s.Infos[i-1].DstPages)
	}
	c := *s
	c.SrcPages = slices.Clone(s.SrcPages)
	c.Infos = slices.Clone(s.Infos)
	for i := range c.Infos {
		if i > 0 && same(i) {
			c.Infos[i].DstPages = c.Infos[i-1].DstPages
			continue
		}
		c.Infos[i].DstPages = slices.Clone(s.Infos[i].DstPages)
	}
	return &c
}

// SameTransfer returns nil if o asks for exactly the transfer s asks for,
// else an error marked ErrBadInput that names the first difference. A chunk
// registered again must not silently keep pages the caller no longer means.
func (s *ChunkSpec) SameTransfer(o *ChunkSpec) error {
	where := func(format string, args ...any) error {
		return badInput("room %d chunk [%d, %d): registered again with %s", s.Room, s.Start, s.End, fmt.Sprintf(format, args...))
	}
	switch {
	case o.Last != s.Last || o.End != s.End:
		return where("end %d (last %v), first registered with end %d (last %v)", o.End, o.Last, s.End, s.Last)
	case o.TotalPages != s.TotalPages:
		return where("%d total pages, first registered with %d", o.TotalPages, s.TotalPages)
	case len(o.Infos) != len(s.Infos):
		return where("%d decode infos, first registered with %d", len(o.Infos), len(s.Infos))
	}
	if err := samePages("source pages", -1, s.SrcPages, o.SrcPages); err != "" {
		return where("%s", err)
	}
	for i, in := range s.Infos {
		on := o.Infos[i]
		switch {
		case on.Peer != in.Peer || on.Dummy != in.Dummy:
			return where("info %d for peer %q (dummy %v), first registered for %q (dummy %v)", i, on.Peer, on.Dummy, in.Peer, in.Dummy)
		}
		if err := samePages("destination pages", i, in.DstPages, on.DstPages); err != "" {
			return where("%s", err)
		}
	}
	return nil
}

// samePages describes the first difference between two page lists (of
// decode info info, unless it is negative), or returns "". It formats only
// when they differ: the check runs on every re-registration.
func samePages(what string, info int, was, now []int) string {
	if equalPages(was, now) {
		return ""
	}
	if info >= 0 {
		what = fmt.Sprintf("info %d %s", info, what)
	}
	if len(was) != len(now) {
		return fmt.Sprintf("%d %s, first registered with %d", len(now), what, len(was))
	}
	for i := range was {
		if was[i] != now[i] {
			return fmt.Sprintf("%s: page %d at index %d, first registered as %d", what, now[i], i, was[i])
		}
	}
	return ""
}
