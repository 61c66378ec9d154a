package xferbench

import (
	"bytes"
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/hw/rdma/tally"
)

// Rig is the sender, its target side and the memory between them, ready
// to post: both regions registered, the destination imported.
type Rig struct {
	cfg           Config
	from, to      rdma.Transport
	src, dst, cpy *buffer // cpy: memcpy's destination, hostmem, unregistered
	pool          string  // where src and dst come from: "allocated" or "registered"
	local         rdma.LocalKey
	remote        rdma.RemoteKey
	ep            rdma.Endpoint

	// Reused by every run, so that the posting loop allocates nothing of
	// its own: the transport's Post is all that is measured.
	ws   []rdma.Write
	done *tally.Tally
	cb   func(error) // done.Done, bound once: a method value per post would allocate
}

// OpenRig checks cfg and opens both sides and the memory; the source is
// filled with a pattern in which no two slots are equal. Close releases
// everything.
func OpenRig(cfg Config) (*Rig, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return openRig(cfg)
}

// openRig opens a rig for a validated cfg. On error it releases what it
// had opened.
func openRig(cfg Config) (_ *Rig, err error) {
	// Completions are counted, not sent on a channel: a channel's lock,
	// taken by both goroutines per batch, cost the loopback at 64 KiB a
	// tenth of its rate (the tally package says why).
	r := &Rig{cfg: cfg, ws: make([]rdma.Write, cfg.WritesPerBatch), done: tally.New()}
	r.cb = r.done.Done
	if r.from, r.to, err = openPair(cfg.Transport, cfg.Open); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			err = errors.CombineErrors(err, r.Close())
		}
	}()
	region := uint64(cfg.Slots) * cfg.Size
	_, fromAllocates := r.from.(rdma.Allocator)
	_, toAllocates := r.to.(rdma.Allocator)
	switch cfg.Pool {
	case PoolAuto:
		r.pool = PoolRegistered
		if fromAllocates && toAllocates {
			r.pool = PoolAllocated
		}
	case PoolAllocated:
		if !fromAllocates || !toAllocates {
			return nil, errors.Newf("--pool allocated: the %s transport does not allocate memory", r.from.Name())
		}
		r.pool = PoolAllocated
	default:
		r.pool = PoolRegistered
	}
	var sreg, dreg rdma.Region
	if r.src, sreg, err = r.buffer(r.from, region); err != nil {
		return nil, errors.Wrap(err, "source region")
	}
	fillPattern(r.src.Bytes)
	if r.dst, dreg, err = r.buffer(r.to, region); err != nil {
		return nil, errors.Wrap(err, "destination region")
	}
	if cfg.Memcpy {
		blk, err := hostmem.Alloc(int(region))
		if err != nil {
			return nil, errors.Wrap(err, "memcpy destination")
		}
		r.cpy = &buffer{Addr: blk.Addr, Bytes: blk.Bytes, free: blk.Free}
	}
	r.local = sreg.Key()
	if r.ep, err = r.from.Connect(r.to.Address()); err != nil {
		return nil, errors.Wrap(err, "connect to the target side")
	}
	if r.remote, err = r.ep.Import(dreg.Desc()); err != nil {
		return nil, errors.Wrap(err, "import the destination")
	}
	return r, nil
}

// buffer is one side's memory, registered: an allocation of the transport
// (Config.Pool), or a hostmem block the rig registered.
type buffer struct {
	Addr  uint64
	Bytes []byte
	free  func() error // after the transports closed
}

// buffer gives tr n bytes from the rig's pool, registered.
func (r *Rig) buffer(tr rdma.Transport, n uint64) (*buffer, rdma.Region, error) {
	if r.pool == PoolAllocated {
		a, err := tr.(rdma.Allocator).Allocate(n)
		if err != nil {
			return nil, nil, err
		}
		return &buffer{Addr: a.Desc().Addr, Bytes: a.Bytes(), free: a.Free}, a, nil
	}
	blk, err := hostmem.Alloc(int(n))
	if err != nil {
		return nil, nil, err
	}
	reg, err := tr.Register(blk.Addr, n)
	if err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrap(err, "register"), blk.Free())
	}
	return &buffer{Addr: blk.Addr, Bytes: blk.Bytes, free: blk.Free}, reg, nil
}

// openPair opens the sender and the target side. Loopback gets a fabric of
// its own rather than the process's default, so that runs (and tests in one
// process) cannot meet each other's nodes; every other kind goes through
// open.
func openPair(kind string, open func(kind, name string) (rdma.Transport, error)) (from, to rdma.Transport, err error) {
	if kind == "loopback" {
		fab := loopback.NewFabric(loopback.Options{})
		f, err := fab.NewTransport("bench-prefill")
		if err != nil {
			return nil, nil, err
		}
		t, err := fab.NewTransport("bench-decode")
		if err != nil {
			return nil, nil, errors.CombineErrors(err, f.Close())
		}
		return f, t, nil
	}
	if open == nil {
		return nil, nil, errors.Newf("--transport %q: only loopback is built in, and no opener was given for it", kind)
	}
	if from, err = open(kind, "bench-prefill"); err != nil {
		return nil, nil, err
	}
	if to, err = open(kind, "bench-decode"); err != nil {
		return nil, nil, errors.CombineErrors(errors.Wrap(err, "target side"), from.Close())
	}
	return from, to, nil
}

// Close tears down in the order that keeps the memory safe: the endpoint
// (it drains), both transports (no worker can apply a write any more, and
// they release what they allocated), and only then the memory they had
// registered.
func (r *Rig) Close() error {
	var err error
	if r.ep != nil {
		err = errors.CombineErrors(err, errors.Wrap(r.ep.Close(), "close the endpoint"))
	}
	for _, t := range []rdma.Transport{r.from, r.to} {
		if t != nil {
			err = errors.CombineErrors(err, errors.Wrapf(t.Close(), "close %s", t.Name()))
		}
	}
	// An allocation's Free after its transport's Close does nothing: the
	// Close released it.
	for _, b := range []*buffer{r.src, r.dst, r.cpy} {
		if b != nil {
			err = errors.CombineErrors(err, b.free())
		}
	}
	return err
}

// used is the number of bytes of each region that writes touch.
func (r *Rig) used() int { return r.cfg.Slots * int(r.cfg.Size) }

// Puts posts n writes, WritesPerBatch per batch with up to Window batches in
// flight, and waits for every completion. It returns the time from the
// first post to the last completion. It allocates nothing itself. On a
// cancelled ctx it returns with batches still in flight: the caller closes
// the rig, which fails them. A failed batch ends the run (nothing is posted
// once it is seen) and every later run of the rig, which is not reused
// after a failure.
func (r *Rig) Puts(ctx context.Context, n int) (time.Duration, error) {
	size, slots, wpb := r.cfg.Size, r.cfg.Slots, r.cfg.WritesPerBatch
	window := int64(r.cfg.Window)
	// Counts are relative to base, the count when the run starts: the
	// tally serves every run of the rig (warm-up, repeats). A run cut short
	// by ctx leaves batches in flight that would count in the next one,
	// which is why the caller closes the rig then.
	base, posted, slot := r.done.Count(), int64(0), 0
	inflight := func() int64 { return posted - (r.done.Count() - base) }
	var failed error
	start := time.Now()
	for next := 0; next < n && failed == nil && r.done.Err() == nil; {
		if inflight() >= window {
			if err := r.done.Wait(ctx, base+posted-window+1); err != nil {
				return 0, errors.Wrapf(err, "%d of %d writes posted, %d batches in flight", next, n, inflight())
			}
			continue
		}
		k := min(wpb, n-next)
		for j := range k {
			off := uint64(slot) * size
			r.ws[j] = rdma.Write{Src: r.src.Addr + off, Dst: r.dst.Addr + off, Len: size, Local: r.local, Remote: r.remote}
			if slot++; slot == slots {
				slot = 0
			}
		}
		if err := r.ep.Post(r.ws[:k], r.cb); err != nil {
			failed = errors.Wrapf(err, "post of writes %d..%d", next, next+k-1)
			break
		}
		posted++
		next += k
	}
	if err := r.done.Wait(ctx, base+posted); err != nil {
		// The caller closes the endpoint, which fails what is left.
		return 0, errors.Wrapf(err, "waiting for %d batches in flight", inflight())
	}
	elapsed := time.Since(start)
	if failed != nil {
		return 0, failed
	}
	if err := r.done.Err(); err != nil {
		return 0, errors.Wrap(err, "batch completion")
	}
	return elapsed, nil
}

// Memcpy copies n slots from the source to memcpy's own destination with
// the transport runs' layout, and times it. It needs a rig opened with
// Config.Memcpy.
func (r *Rig) Memcpy(n int) time.Duration {
	size, slots := int(r.cfg.Size), r.cfg.Slots
	src, dst := r.src.Bytes, r.cpy.Bytes
	slot := 0
	start := time.Now()
	for range n {
		off := slot * size
		copy(dst[off:off+size], src[off:off+size])
		if slot++; slot == slots {
			slot = 0
		}
	}
	return time.Since(start)
}

// Verify compares every used destination slot with its source slot.
func (r *Rig) Verify() error {
	used := r.used()
	src, dst := r.src.Bytes[:used], r.dst.Bytes[:used]
	if bytes.Equal(src, dst) {
		return nil
	}
	i := 0
	for i < used && src[i] == dst[i] {
		i++
	}
	size := int(r.cfg.Size)
	return errors.Newf("destination slot %d differs from its source at byte %d (got %#02x, want %#02x): the writes did not all arrive",
		i/size, i%size, dst[i], src[i])
}

// fillPattern fills b with a xorshift sequence: no two slots are equal and
// no slot is zero, so a write that landed in the wrong slot, or not at all,
// shows.
func fillPattern(b []byte) {
	x := uint64(0x9e3779b97f4a7c15)
	for i := range b {
		if i%8 == 0 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		b[i] = byte(x >> (8 * (i % 8)))
	}
}
