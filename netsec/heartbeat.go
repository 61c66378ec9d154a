package netsec

import (
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
)

// HeartbeatActor is the name under which ServeHeartbeats spawns a node's
// heartbeat responder; a peer's monitor pings PID(peer address,
// HeartbeatActor).
const HeartbeatActor = "heartbeat"

// HeartbeatMonitor is the default name of a Monitor's actor, which the
// peer's Pongs target: a node's Authorize must accept it (for a
// SessionPolicy, Allow it with HeartbeatActor).
const HeartbeatMonitor = "heartbeat-monitor"

// ErrPeerLost marks the error a Monitor reports when its peer stopped
// answering.
var ErrPeerLost = errors.New("peer lost")

// ServeHeartbeats spawns the actor that answers every Ping with the Pong of
// the same sequence number, under HeartbeatActor. It answers from its own
// mailbox, so a node whose actors still run answers; a process that is
// stopped, hung or cut off does not.
func ServeHeartbeats(system *actor.ActorSystem) (*actor.PID, error) {
	pid, err := system.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		if p, ok := ctx.Message().(*Ping); ok && ctx.Sender() != nil {
			ctx.Respond(&Pong{Seq: p.Seq})
		}
	}), HeartbeatActor)
	return pid, errors.Wrap(err, "heartbeat responder")
}

// HeartbeatConfig paces a Monitor.
type HeartbeatConfig struct {
	// Interval between pings; also the granularity of the check.
	Interval time.Duration
	// Misses is how many intervals may pass without any Pong before the
	// peer is declared lost.
	Misses int
	// Name is the monitor actor's id; default HeartbeatMonitor. A fixed
	// name lets a node's Authorize accept the Pongs before the monitor
	// exists, so that none is refused (a refused batch closes the stream
	// that carried it).
	Name string
}

// Bound is the longest a peer that stopped answering can go undeclared:
// Misses intervals of silence, plus the one interval by which the check
// can lag the moment the silence crossed that.
func (c HeartbeatConfig) Bound() time.Duration {
	return time.Duration(c.Misses+1) * c.Interval
}

func (c HeartbeatConfig) check() error {
	if c.Interval <= 0 {
		return errors.Newf("heartbeat: Interval %v must be positive", c.Interval)
	}
	if c.Misses < 1 || c.Misses > 1000 {
		return errors.Newf("heartbeat: Misses %d must be within [1, 1000]", c.Misses)
	}
	return nil
}

// Monitor pings a peer's heartbeat actor and declares the peer lost when
// no Pong came back for Misses intervals.
type Monitor struct {
	system *actor.ActorSystem
	pid    *actor.PID
	stop   sync.Once
}

// tick is the monitor's own clock message (local only).
type tick struct{}

// WatchHeartbeats starts a monitor of peer (the peer node's HeartbeatActor)
// on system. lost is called once, on the monitor's goroutine, with an
// error marked ErrPeerLost, at most cfg.Bound() after the last Pong; the
// monitor then stops. Any Pong, even a late one, proves the peer alive:
// a slow peer is not a lost one. It complements protoactor's remote
// termination, which sees a closed connection but not a hung process whose
// connections stay open.
func WatchHeartbeats(system *actor.ActorSystem, peer *actor.PID, cfg HeartbeatConfig, lost func(error)) (*Monitor, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if peer == nil || lost == nil {
		return nil, errors.New("heartbeat: peer and lost must be given")
	}
	if cfg.Name == "" {
		cfg.Name = HeartbeatMonitor
	}
	props := actor.PropsFromProducer(func() actor.Actor {
		return &monitor{peer: peer, cfg: cfg, lost: lost}
	})
	pid, err := system.Root.SpawnNamed(props, cfg.Name)
	if err != nil {
		return nil, errors.Wrapf(err, "heartbeat monitor %q", cfg.Name)
	}
	return &Monitor{system: system, pid: pid}, nil
}

// Probe asks the peer now, and declares it lost if no Pong came back
// within window: for when this process saw its connection to the peer end
// (local evidence, which no third party can forge), so that a peer that
// died is lost in a window instead of a whole Bound(), while one whose
// connection merely broke and reconnects answers and goes on. A Probe
// during another extends nothing.
func (m *Monitor) Probe(window time.Duration) {
	m.system.Root.Send(m.pid, probe{window: window})
}

// probe starts a probe; probeEnd ends the one started at since.
type (
	probe    struct{ window time.Duration }
	probeEnd struct{ since time.Time }
)

// Stop stops the monitor and waits until it stopped; lost is not called
// afterwards. It is idempotent.
func (m *Monitor) Stop() {
	m.stop.Do(func() { _ = m.system.Root.StopFuture(m.pid).Wait() })
}

type monitor struct {
	peer  *actor.PID
	cfg   HeartbeatConfig
	lost  func(error)
	seq   uint64
	heard time.Time
	// ticks counts the monitor's own ticks (one ping each) since the last
	// Pong: the evidence that this process ran Misses intervals and heard
	// nothing, which wall time alone is not when this process itself was
	// starved of CPU (its ticks and the peer's Pongs then wait together).
	ticks   int
	done    chan struct{}
	gone    bool
	probing bool
}

// silentTooLong decides a loss: more than Misses intervals of wall time
// without a Pong, and more than Misses of the monitor's own ticks (pings
// sent) in that time. Go's ticker drops the ticks a starved receiver
// cannot take, so a monitor that was not scheduled does not count the
// time it did not run as its peer's silence; while it runs normally, the
// two agree and the bound is Bound().
func silentTooLong(silence time.Duration, ticks int, cfg HeartbeatConfig) bool {
	return silence > time.Duration(cfg.Misses)*cfg.Interval && ticks > cfg.Misses
}

func (m *monitor) Receive(ctx actor.Context) {
	switch ctx.Message().(type) {
	case *actor.Started:
		m.heard = time.Now()
		m.done = make(chan struct{})
		go m.clock(ctx.ActorSystem(), ctx.Self())
		m.ping(ctx)
	case tick:
		if m.gone {
			return
		}
		m.ticks++
		if silent := time.Since(m.heard); silentTooLong(silent, m.ticks, m.cfg) {
			m.gone = true
			m.lost(errors.Wrapf(ErrPeerLost, "%s/%s: no heartbeat answer for %v (%d heartbeats in a row unanswered, %v apart)",
				m.peer.Address, m.peer.Id, silent.Round(time.Millisecond), m.ticks, m.cfg.Interval))
			ctx.Stop(ctx.Self())
			return
		}
		m.ping(ctx)
	case probe:
		if m.gone || m.probing {
			return
		}
		m.probing = true
		msg := ctx.Message().(probe)
		since, sys, self := time.Now(), ctx.ActorSystem(), ctx.Self()
		m.ping(ctx)
		time.AfterFunc(msg.window, func() { sys.Root.Send(self, probeEnd{since: since}) })
	case probeEnd:
		m.probing = false
		since := ctx.Message().(probeEnd).since
		if m.gone || m.heard.After(since) {
			return
		}
		m.gone = true
		m.lost(errors.Wrapf(ErrPeerLost, "%s/%s: the connection to it ended and it answered no heartbeat within %v",
			m.peer.Address, m.peer.Id, time.Since(since).Round(time.Millisecond)))
		ctx.Stop(ctx.Self())
	case *Pong:
		m.heard = time.Now()
		m.ticks = 0
	case *actor.Stopping:
		close(m.done)
	}
}

func (m *monitor) ping(ctx actor.Context) {
	m.seq++
	ctx.Request(m.peer, &Ping{Seq: m.seq})
}

// clock sends ticks until the monitor stops; a goroutine rather than a
// receive timeout, which any message (a Pong) would postpone.
func (m *monitor) clock(system *actor.ActorSystem, self *actor.PID) {
	t := time.NewTicker(m.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			system.Root.Send(self, tick{})
		case <-m.done:
			return
		}
	}
}
