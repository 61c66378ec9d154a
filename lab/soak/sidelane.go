package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/hostmem"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/testbed"
)

// Bounds of the side lane.
const (
	// sideTriesAfterStop bounds the episodes the side lane runs after the
	// main lane ended, to cover a kind not covered yet.
	sideTriesAfterStop = 6
	// dialBound bounds a side session's Dial (it retries a busy decode).
	dialBound = time.Minute
	// completionBound bounds the wait for a bye-writer's completions.
	completionBound = 10 * time.Second
	// writesPerPost is a bye-writer post's writes; postEvery paces its
	// posts after Bye.
	writesPerPost = 4
	postEvery     = 20 * time.Millisecond
)

// sideLane runs side episodes until stop closes and every side kind of
// positive weight ran (within sideTriesAfterStop more), one at a time,
// a short random pause between them.
func (s *soak) sideLane(stop <-chan struct{}, done chan<- struct{}, rng *rand.Rand) {
	defer close(done)
	pick := newPicker(rng, SideKinds, s.cfg.Mix)
	after := 0
	for n := 1; s.ctx.Err() == nil; n++ {
		select {
		case <-stop:
			if pick.done() || after >= sideTriesAfterStop {
				return
			}
			after++
		default:
		}
		k := pick.next()
		s.gate.RLock()
		var ok bool
		switch k {
		case Vanish:
			ok = s.vanish(n)
		case Refused:
			ok = s.refused(n)
		case ByeWriter:
			ok = s.byeWriter(n, rng)
		}
		s.gate.RUnlock()
		s.mu.Lock()
		s.rep.Served[k]++
		if ok {
			s.rep.Injected[k]++
		}
		s.mu.Unlock()
		if ok {
			pick.covered(k)
		}
		time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
	}
}

// sideName names a side session: the decode's lines tell them apart from
// the prefills' by sidePrefix.
func sideName(k Kind, n int) string { return sidePrefix + string(k) + "-" + strconv.Itoa(n) }

// dialConfig is a side session with the prefills' layout (the decode's
// pool takes it) and seed.
func (s *soak) dialConfig(name string) decode.DialConfig {
	return decode.DialConfig{Decode: s.dec.addr, Buffers: simsession.LayoutOf(s.geom), PageSize: s.cfg.Workload.PageSize, Name: name,
		Metadata: map[string]string{simsession.SeedKey: strconv.FormatUint(s.cfg.Seed, 10)}, ConnectTimeout: 30 * time.Second}
}

// awaitSideEnd waits until the decode ended name's session.
func (s *soak) awaitSideEnd(name, what string) (string, bool) {
	if !s.dec.waitFor(s.endBound(), nil, func() bool { return s.dec.outcome[name] != "" && s.dec.open[name] == 0 }) {
		s.misbehaved("%s: the decode did not end the session of %s within %v", what, name, s.endBound())
		return "", false
	}
	o, _ := s.dec.endOf(name)
	return o, true
}

// vanish runs a prefill that says Hello and dies: a process of its own
// (kvstream soak vanish), killed once its session is open. The decode
// must end the session.
func (s *soak) vanish(n int) bool {
	name := sideName(Vanish, n)
	open := make(chan struct{})
	var once sync.Once
	c, err := startChild(s.cfg.Command, func(l string) {
		if l == VanishLine {
			once.Do(func() { close(open) })
		}
	}, slices.Concat([]string{"soak", "vanish", "--decode", s.dec.addr, "--name", name, "--seed", strconv.FormatUint(s.cfg.Seed, 10),
		"--heartbeat", s.cfg.Heartbeat.String()}, s.cfg.Workload.Flags())...)
	if err != nil {
		s.misbehaved("vanish: %v", err)
		return false
	}
	t := time.NewTimer(dialBound)
	defer t.Stop()
	select {
	case <-open:
	case <-c.done:
	case <-t.C:
	case <-s.ctx.Done():
	}
	select {
	case <-open:
	default:
		c.kill()
		s.misbehaved("vanish: %s opened no session within %v; it printed:\n%s", name, dialBound, tail(c.output()))
		return false
	}
	c.signal(syscall.SIGKILL)
	c.wait(time.Minute)
	o, ok := s.awaitSideEnd(name, "vanish")
	fmt.Fprintf(s.cfg.Log, "soak: side %s: killed once its session opened; decode: session %s\n", name, o)
	return ok
}

// refused says a Hello the decode must refuse: a sharded prefill
// (simsession.ShardKey), which the sim's decode does not serve.
func (s *soak) refused(n int) bool {
	name := sideName(Refused, n)
	cfg := s.dialConfig(name)
	cfg.Metadata[simsession.ShardKey] = "soak: a sharded prefill this decode process was not started for"
	ctx, cancel := context.WithTimeout(s.ctx, dialBound)
	defer cancel()
	c, err := decode.Dial(ctx, s.node, cfg)
	switch {
	case err == nil:
		s.misbehaved("refused: the decode admitted %s, a sharded prefill", name)
		_ = c.Close(ctx)
		return false
	case errors.Is(err, decode.ErrBadInput):
		fmt.Fprintf(s.cfg.Log, "soak: side %s: refused: %v\n", name, err)
		return true
	}
	s.misbehaved("refused: %s's Hello: %v (want a refusal marked bad input)", name, err)
	return false
}

// poster counts a bye-writer's posts and their completions.
type poster struct {
	wg                          sync.WaitGroup
	mu                          sync.Mutex
	posted, refused, failed, ok int
	firstRefusal, firstFailure  error
}

// post posts ws on ep as one batch.
func (p *poster) post(ep rdma.Endpoint, ws []rdma.Write) {
	p.mu.Lock()
	p.posted++
	p.mu.Unlock()
	p.wg.Add(1)
	err := ep.Post(ws, func(err error) {
		p.mu.Lock()
		if err != nil {
			p.failed++
			if p.firstFailure == nil {
				p.firstFailure = err
			}
		} else {
			p.ok++
		}
		p.mu.Unlock()
		p.wg.Done()
	})
	if err != nil {
		p.wg.Done()
		p.mu.Lock()
		p.refused++
		if p.firstRefusal == nil {
			p.firstRefusal = err
		}
		p.mu.Unlock()
	}
}

// refusals is how many posts Post refused so far.
func (p *poster) refusals() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// settle waits (bounded) for every posted batch to complete; it returns
// the counts then, and how many had not completed.
func (p *poster) settle(bound time.Duration) (posted, refused, failed, ok, unanswered int) {
	all := make(chan struct{})
	go func() { p.wg.Wait(); close(all) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-all:
	case <-t.C:
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.posted, p.refused, p.failed, p.ok, p.posted - p.refused - p.failed - p.ok
}

// target is one page a bye-writer writes: request room's position pos in
// buffer b, from slot i of its source memory.
type target struct{ room, b, pos int }

// reconnectEvery paces a bye-writer's new endpoints after Bye.
const reconnectEvery = 500 * time.Millisecond

// byeWriter opens a session with the prefills' layout, writes into the
// pool over the transport (the bytes a prefill writes there, so that a
// legitimate session running meanwhile sees no difference), says Bye, and
// goes on posting for Config.ByeWriterFor, with a fresh endpoint to the
// same access point each time its endpoint broke (at most every
// reconnectEvery): the decode revokes the session's access before it
// answers Bye, so every later post must fail.
func (s *soak) byeWriter(n int, rng *rand.Rand) bool {
	name := sideName(ByeWriter, n)
	ctx, cancel := context.WithTimeout(s.ctx, dialBound)
	defer cancel()
	c, err := decode.Dial(ctx, s.node, s.dialConfig(name))
	if err != nil {
		s.misbehaved("bye-writer: %s's Hello: %v", name, err)
		return false
	}
	peer := c.Peer()
	il := s.geom.ItemLen
	src, release, err := s.source(writesPerPost * int(il))
	if err != nil {
		_ = c.Close(ctx)
		s.misbehaved("bye-writer: its source memory: %v", err)
		return false
	}
	targets := make([]target, writesPerPost)
	for i := range targets {
		t := target{room: rng.IntN(len(s.pages)), b: rng.IntN(len(peer.Buffers))}
		t.pos = rng.IntN(len(s.pages[t.room]))
		targets[i] = t
		testbed.Fill(src.bytes[uint64(i)*il:uint64(i+1)*il], s.cfg.Seed, uint64(t.room), t.b, t.pos)
	}
	var eps []rdma.Endpoint
	// endpoint connects to the session's access point and imports what
	// the targets need.
	endpoint := func() (rdma.Endpoint, []rdma.Write, error) {
		ep, err := s.tr.Connect(peer.Address)
		if err != nil {
			return nil, nil, err
		}
		eps = append(eps, ep)
		keys := map[int]rdma.RemoteKey{}
		ws := make([]rdma.Write, len(targets))
		for i, t := range targets {
			key, ok := keys[t.b]
			if !ok {
				if key, err = ep.Import(peer.Buffers[t.b].Region); err != nil {
					return nil, nil, errors.Wrapf(err, "import region %d", t.b)
				}
				keys[t.b] = key
			}
			ws[i] = rdma.Write{Src: src.addr + uint64(i)*il, Dst: peer.Buffers[t.b].Region.Addr + uint64(s.pages[t.room][t.pos])*il,
				Len: il, Local: src.key, Remote: key}
		}
		return ep, ws, nil
	}
	closeAll := func() (quiet bool) {
		quiet = true
		for _, ep := range eps {
			if err := ep.Close(); errors.Is(err, rdma.ErrNotQuiesced) {
				quiet = false
			}
		}
		return quiet
	}
	ep, ws, err := endpoint()
	if err != nil {
		closeAll()
		_ = c.Close(ctx)
		release(true)
		s.misbehaved("bye-writer: %s's access point: %v", name, err)
		return false
	}
	before := &poster{}
	before.post(ep, ws)
	if _, refused, failed, _, unanswered := before.settle(completionBound); refused+failed+unanswered > 0 {
		s.misbehaved("bye-writer: %s's write before its Bye did not complete: refused %v, failed %v, %d unanswered within %v",
			name, before.firstRefusal, before.firstFailure, unanswered, completionBound)
	}
	_, byeErr := c.Bye(ctx, nil)
	byeAt := time.Now()
	if byeErr != nil {
		s.misbehaved("bye-writer: %s's Bye: %v", name, byeErr)
	}
	after := &poster{}
	reconnects, connectErrs, lastConnect, refusedThen := 0, 0, byeAt, 0
	for time.Since(byeAt) < s.cfg.ByeWriterFor {
		after.post(ep, ws)
		time.Sleep(postEvery)
		// A peer cut off may come back: a fresh endpoint to the same
		// access point must not land anything either.
		if r := after.refusals(); r > refusedThen && time.Since(lastConnect) >= reconnectEvery {
			refusedThen, lastConnect = r, time.Now()
			reconnects++
			if ep2, ws2, err := endpoint(); err == nil {
				ep, ws = ep2, ws2
			} else {
				connectErrs++
			}
		}
	}
	posted, refusedAfter, failedAfter, landed, unansweredAfter := after.settle(completionBound)
	quiet := closeAll()
	// Memory a batch may still read stays mapped (a few KiB).
	release(unansweredAfter == 0 && quiet)
	o, _ := s.awaitSideEnd(name, "bye-writer")
	s.mu.Lock()
	bw := &s.rep.ByeWriter
	bw.Sessions++
	bw.PostsBeforeBye += before.posted
	bw.PostsAfterBye += posted
	bw.RefusedAfterBye += refusedAfter
	bw.FailedAfterBye += failedAfter
	bw.LandedAfterBye += landed
	bw.UnansweredAfterBye += unansweredAfter
	bw.Reconnects += reconnects
	if landed > 0 {
		s.rep.note("bye-writer %s: %d of %d posts after its Bye completed successfully", name, landed, posted)
	}
	s.mu.Unlock()
	first := after.firstFailure
	if first == nil {
		first = after.firstRefusal
	}
	fmt.Fprintf(s.cfg.Log, "soak: side %s: after Bye %d posts on %d endpoints (%d could not connect): %d refused, %d failed, %d unanswered, %d landed (first error: %v); decode: session %s\n",
		name, posted, reconnects+1, connectErrs, refusedAfter, failedAfter, unansweredAfter, landed, first, o)
	return byeErr == nil
}

// source is registered memory the bye-writer writes from.
type source struct {
	bytes []byte
	addr  uint64
	key   rdma.LocalKey
}

// source allocates n bytes of registered memory on the bye-writer's
// transport; release(free) deregisters and frees it, or with free false
// only drops it (a batch may still read it).
func (s *soak) source(n int) (source, func(free bool), error) {
	if al, ok := s.tr.(rdma.Allocator); ok {
		a, err := al.Allocate(uint64(n))
		if err != nil {
			return source{}, nil, err
		}
		return source{bytes: a.Bytes(), addr: a.Desc().Addr, key: a.Key()}, func(free bool) {
			if free {
				_ = a.Free()
			}
		}, nil
	}
	blk, err := hostmem.Alloc(n)
	if err != nil {
		return source{}, nil, err
	}
	reg, err := s.tr.Register(blk.Addr, uint64(n))
	if err != nil {
		_ = blk.Free()
		return source{}, nil, err
	}
	return source{bytes: blk.Bytes, addr: blk.Addr, key: reg.Key()}, func(free bool) {
		if free {
			_ = reg.Deregister()
			_ = blk.Free()
		}
	}, nil
}
