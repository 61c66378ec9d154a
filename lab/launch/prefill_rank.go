package launch

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/service"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// PrefillRankConfig is what RunPrefillRank runs.
type PrefillRankConfig struct {
	// Workload is the sim workload of every batch (CP.Size and CP.Rank
	// place this rank in its group).
	Workload workload.Config
	// Group is the CP group's name; DecodeName, with TLS, the name every
	// decode instance's certificate must carry.
	Group, DecodeName string
	// Node, Transport and Provider are the rank's planes and membership:
	// the command opens them; RunPrefillRank does not close them.
	Node      *decode.Node
	Transport rdma.Transport
	Provider  cluster.Provider
	// Commands are the "run BATCH DECODE-ID" lines (stdin); its close is
	// not an end by itself (the command turns it into one).
	Commands <-chan string
	// DrainTimeout bounds the drain (service.DefaultDrainTimeout when
	// zero).
	DrainTimeout time.Duration
	Ops          *service.Ops
	Out          io.Writer
	Log          *zap.Logger
}

// RunPrefillRank is rank CP.Rank of the CP group Group: it registers
// {<group>-r<rank>, prefill, address, group, rank, size} on etcd, follows
// the decode instances' membership, and runs a batch of the sim workload
// for each command, into the instance named, over the rank's session with
// it (opened at the instance's first batch and kept, so that a request or
// a forward never asks etcd). It emits "ready", "forward" and "batch"
// events. Once accept ended it drains: reads no more commands,
// deregisters, lets its batches in flight finish within the drain timeout
// (then stops them), says goodbye to every instance, emits "drain" and its
// row. The error says what the drain lost, if anything.
func RunPrefillRank(accept, hard context.Context, cfg PrefillRankConfig) error {
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	wl := cfg.Workload
	id := fmt.Sprintf("%s-r%d", cfg.Group, wl.CP.Rank)
	m, err := newRankMetrics(registerer(cfg.Ops))
	if err != nil {
		return err
	}
	if reg := registerer(cfg.Ops); reg != nil {
		wl.EngineOptions = append(wl.EngineOptions, system.WithMetrics(reg))
	}
	prov := &countingProvider{Provider: cfg.Provider}
	res := cluster.NewResolver(prov)
	defer res.Close()
	if err := res.Follow(cluster.RoleDecode); err != nil {
		return err
	}
	out := NewEmitter(cfg.Out)
	addr := cfg.Node.Addr()
	reg, err := saying(out, id, "registration on etcd (an earlier process's lease may still hold the identity)",
		func() (cluster.Registration, error) {
			return prov.Register(accept, cluster.Member{ID: id, Role: cluster.RolePrefill, Addr: addr,
				Group: cfg.Group, Rank: wl.CP.Rank, Size: wl.CP.Size})
		})
	if err != nil {
		return errors.Wrapf(err, "register prefill rank %s", id)
	}
	deregistered := false
	deregister := func() error {
		if deregistered {
			return nil
		}
		deregistered = true
		m.registered.Set(0)
		return reg.Close()
	}
	defer func() { _ = deregister() }()
	m.registered.Set(1)
	if cfg.Ops != nil {
		cfg.Ops.Ready("registered", func(context.Context) error { return regState(reg) })
	}
	rk := &rank{cfg: wl, id: id, decodeName: cfg.DecodeName, node: cfg.Node, tr: cfg.Transport, res: res, log: cfg.Log, out: out,
		sessions: map[string]*decode.Client{}, active: map[string]int{}, m: m}
	defer rk.closeByes()
	out.Emit(Event{Event: EventReady, ID: id, Addr: addr, Pid: os.Getpid(), Rank: wl.CP.Rank, Metrics: opsAddr(cfg.Ops)})

	// The batches run under their own context: the drain's timeout (or a
	// second signal) stops them.
	batchCtx, stopBatches := context.WithCancel(hard)
	defer stopBatches()
	var batches service.InFlight
	var wg sync.WaitGroup
	defer wg.Wait()
	reason := ""
read:
	for {
		select {
		case <-accept.Done():
			reason = context.Cause(accept).Error()
			break read
		case <-reg.Done():
			reason = "registration ended"
			cfg.Log.Warn("registration ended", zap.String("id", id), warnErr(reg.Err()))
			break read
		case l, ok := <-cfg.Commands:
			if !ok {
				reason = "stdin closed"
				break read
			}
			c, err := ParseCommand(l)
			if err != nil {
				cfg.Log.Warn("unknown command", zap.String("line", l), warnErr(err))
				continue
			}
			batches.Add()
			m.inFlight.Inc()
			// Counted at once, before its goroutine runs: a drain of
			// the instance heard meanwhile waits for the batch.
			rk.begin(c.Decode)
			wg.Go(func() {
				defer batches.Done()
				defer m.inFlight.Dec()
				defer rk.end(c.Decode)
				rk.run(batchCtx, c.Batch, c.Decode)
			})
		}
	}
	rep := service.Drain{
		Timeout: cfg.DrainTimeout, Ops: cfg.Ops, Reason: reason, Log: cfg.Log,
		Stop:     func(context.Context) error { return deregister() },
		InFlight: batches.Count,
		Wait:     batches.Wait,
		// Out of time: stop them, and let them report (their chunks fail
		// within the engine's teardown).
		Cut: func(ctx context.Context) {
			stopBatches()
			_ = batches.Wait(ctx)
		},
		Goodbye: func(ctx context.Context) error { return rk.byeAll(ctx) },
	}.Run(hard)
	row := rk.row()
	row.Addr, row.Metrics, row.Lookups, row.Drained = addr, opsAddr(cfg.Ops), prov.calls.Load(), !rep.Lost()
	out.Emit(Event{Event: EventDrain, ID: id, Drain: rep.String()})
	out.Emit(Event{Event: EventNode, ID: id, Row: &row})
	if reason == "registration ended" {
		return errors.Wrapf(reg.Err(), "prefill rank %s: registration ended", id)
	}
	return rep.Err()
}

// rank is a prefill rank's state across batches: one session per decode
// instance.
type rank struct {
	cfg        workload.Config
	id         string
	decodeName string // with TLS, the name the instances' certificates carry
	node       *decode.Node
	tr         rdma.Transport
	res        *cluster.Resolver
	log        *zap.Logger
	out        *Emitter
	m          *rankMetrics

	mu       sync.Mutex
	sessions map[string]*decode.Client // by decode instance id
	dialing  map[string]*dialing       // sessions being opened, by decode instance id
	active   map[string]int            // batches running, by decode instance id
	byes     sync.WaitGroup            // goodbyes to draining instances in progress
	byesDone bool                      // closeByes began: no goodbye starts any more
	dials    int64
	batches  int
	failed   int
	bytes    uint64
}

// session returns the rank's session with decode instance dec, opening it
// the first time (or after the instance was lost): the one place a rank
// resolves an instance, from the resolver's followed membership.
func (k *rank) session(ctx context.Context, dec string, geom testbed.Geometry) (*decode.Client, error) {
	c, opened, err := k.openSession(ctx, dec, geom)
	if err != nil || !opened {
		return c, err
	}
	// The instance drains (it is stopping): once no batch of this rank
	// runs there, goodbye, so that its drain ends now rather than at its
	// drain timeout. The router sends it no new batch meanwhile. Asked
	// without k.mu held: a drain said before this call runs the callback
	// at once, here, and spawnBye takes k.mu (it deadlocked the rank).
	c.OnDrain(func(string) { k.spawnBye(func() { k.goodbye(dec, c) }) })
	return c, nil
}

// dialing is a session being opened: the batches for its instance that
// come meanwhile wait for it rather than dial again.
type dialing struct {
	done chan struct{} // closed once c and err are set
	c    *decode.Client
	err  error
}

// openSession is session's lookup and dial; opened says the session is
// new. The resolution and the dial (up to resolvePatience, and a dial's
// timeout) run without k.mu, which every batch's begin and end take: a
// slow or partitioned instance holds up only the batches for it, not the
// rank's batches for the others.
func (k *rank) openSession(ctx context.Context, dec string, geom testbed.Geometry) (_ *decode.Client, opened bool, _ error) {
	k.mu.Lock()
	if d := k.dialing[dec]; d != nil {
		k.mu.Unlock()
		select {
		case <-d.done:
			return d.c, false, d.err
		case <-ctx.Done():
			return nil, false, errors.Wrapf(ctx.Err(), "waiting for the session with decode instance %s", dec)
		}
	}
	var lost *decode.Client
	if c := k.sessions[dec]; c != nil {
		if c.Lost() == nil {
			k.mu.Unlock()
			return c, false, nil
		}
		// The instance went away (and may be back under a new address):
		// this is the one case where the rank resolves it again.
		lost = c
		delete(k.sessions, dec)
	}
	d := &dialing{done: make(chan struct{})}
	if k.dialing == nil {
		k.dialing = map[string]*dialing{}
	}
	k.dialing[dec] = d
	k.mu.Unlock()
	if lost != nil {
		_ = lost.Close(ctx)
	}
	d.c, d.err = k.dial(ctx, dec, geom)
	k.mu.Lock()
	delete(k.dialing, dec)
	if d.err == nil {
		k.dials++
		k.sessions[dec] = d.c
	}
	k.mu.Unlock()
	close(d.done)
	return d.c, d.err == nil, d.err
}

// dial resolves decode instance dec and opens a session with it.
func (k *rank) dial(ctx context.Context, dec string, geom testbed.Geometry) (*decode.Client, error) {
	m, err := resolvePatiently(ctx, k.res, dec, resolvePatience)
	if err != nil {
		return nil, err
	}
	c, err := saying(k.out, k.id, fmt.Sprintf("a session with decode instance %s at %s", dec, m.Addr), func() (*decode.Client, error) {
		return dialDecode(ctx, k.node, decode.DialConfig{Decode: m.Addr, DecodeName: k.decodeName, Buffers: simsession.LayoutOf(geom), PageSize: k.cfg.PageSize, Name: k.id, Log: k.log,
			Metadata: map[string]string{simsession.SeedKey: strconv.FormatUint(k.cfg.Seed, 10), decode.RankKey: strconv.Itoa(k.cfg.CP.Rank)}})
	})
	if err != nil {
		return nil, errors.Wrapf(err, "session with decode instance %s at %s", dec, m.Addr)
	}
	return c, nil
}

// dialDecode is decode.Dial; a test makes the instance drain before the
// rank hears of its session.
var dialDecode = decode.Dial

// spawnBye runs a goodbye on its own goroutine unless the rank is past
// closeByes: OnDrain calls it from a goroutine of the node, which may run
// while the rank stops (the WaitGroup's Add must not race its Wait, and a
// goodbye must not run once the node is gone).
func (k *rank) spawnBye(f func()) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.byesDone {
		return
	}
	k.byes.Go(f)
}

// closeByes stops new goodbyes and waits for those in progress.
func (k *rank) closeByes() {
	k.mu.Lock()
	k.byesDone = true
	k.mu.Unlock()
	k.byes.Wait()
}

// begin counts a batch running on decode instance dec; end uncounts it,
// and says goodbye to dec if it drains and no batch of this rank runs
// there any more.
func (k *rank) begin(dec string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.active[dec]++
}

func (k *rank) end(dec string) {
	k.mu.Lock()
	k.active[dec]--
	c := k.sessions[dec]
	k.mu.Unlock()
	if c != nil && c.Draining() != "" {
		k.goodbye(dec, c)
	}
}

// goodbye ends the session c with draining instance dec, unless a batch
// of this rank still runs there (its end says goodbye then) or the
// session was replaced; a later batch for dec (the instance restarted)
// opens a new session.
func (k *rank) goodbye(dec string, c *decode.Client) {
	k.mu.Lock()
	if k.active[dec] > 0 || k.sessions[dec] != c {
		k.mu.Unlock()
		return
	}
	delete(k.sessions, dec)
	k.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Bye(ctx, nil); err != nil {
		k.log.Warn("goodbye to a draining decode instance", zap.String("decode", dec), warnErr(err))
		return
	}
	k.log.Debug("goodbye to a draining decode instance", zap.String("decode", dec), zap.String("reason", c.Draining()))
}

// resolvePatience bounds how long a rank waits for the decode instance it
// was given to be resolvable again: an etcd pause longer than the member
// TTL expires every lease, and until the instance registered again the
// lookup fails (unreachable, then not found) although nothing is wrong
// with it. A batch fails only when the instance stays away longer, as a
// killed one does until it is restarted.
const resolvePatience = 10 * time.Second

// resolvePatiently resolves decode instance dec, trying again, with backoff,
// while the lookup fails as unreachable or not found, for up to patience.
func resolvePatiently(ctx context.Context, res *cluster.Resolver, dec string, patience time.Duration) (cluster.Member, error) {
	deadline := time.Now().Add(patience)
	wait := 50 * time.Millisecond
	for {
		m, err := res.Resolve(ctx, cluster.RoleDecode, dec)
		if err == nil || !(errors.Is(err, cluster.ErrUnavailable) || errors.Is(err, cluster.ErrNotFound)) {
			return m, err
		}
		if !time.Now().Add(wait).Before(deadline) {
			return m, errors.Wrapf(err, "decode instance %s: not resolvable for %v", dec, patience)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return m, errors.Wrapf(ctx.Err(), "decode instance %s: waiting for it to resolve (%v)", dec, err)
		case <-t.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// run runs one batch into decode instance dec and reports it.
func (k *rank) run(ctx context.Context, batch int, dec string) {
	cfg := k.cfg
	cfg.Seed = simsession.BatchSeed(k.cfg.Seed, batch)
	cfg.Progress = func(done, total int) {
		k.out.Emit(Event{Event: EventForward, ID: k.id, Batch: batch, Rank: k.cfg.CP.Rank, Decode: dec})
	}
	plane := simsession.NewRankPlane(func(ctx context.Context, g testbed.Geometry) (*decode.Client, error) { return k.session(ctx, dec, g) }, k.tr, batch, cfg.PromptTokens)
	start := time.Now()
	e := Event{Event: EventBatch, ID: k.id, Batch: batch, Rank: k.cfg.CP.Rank, Decode: dec}
	mr, err := workload.RunRemote(ctx, cfg, k.log, plane, true)
	e.Seconds = time.Since(start).Seconds()
	switch {
	case err != nil:
		e.Error = err.Error()
	case mr.Failed > 0 || mr.Aborted != "":
		e.Failed, e.Error = mr.Failed, mr.FirstError+mr.Aborted
	case plane.Verify() != "":
		e.Error = plane.Verify()
	default:
		e.OK = true
	}
	if ff := plane.FirstFailure(); !ff.IsZero() {
		e.FirstFailureUnixMs = ff.UnixMilli()
	}
	if mr != nil {
		e.Bytes = mr.BytesMoved
		e.Failed = mr.Failed
	}
	if !e.OK {
		k.log.Warn("batch failed", zap.Int("batch", batch), zap.String("decode", dec), zap.Int("rank", k.cfg.CP.Rank), zap.String("error", e.Error))
	}
	k.mu.Lock()
	k.batches++
	k.failed += e.Failed
	k.bytes += e.Bytes
	k.mu.Unlock()
	if k.m != nil {
		if e.OK {
			k.m.batchOK.Inc()
		} else {
			k.m.batchNo.Inc()
		}
	}
	k.out.Emit(e)
}

// byeAll says goodbye to every instance still there, within ctx.
func (k *rank) byeAll(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	var errs error
	for dec, c := range k.sessions {
		if c.Lost() != nil {
			continue
		}
		bctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if _, err := c.Bye(bctx, nil); err != nil {
			k.log.Warn("goodbye", zap.String("decode", dec), warnErr(err))
			errs = errors.CombineErrors(errs, errors.Wrapf(err, "goodbye to %s", dec))
		}
		cancel()
	}
	return errs
}

func (k *rank) row() Row {
	k.mu.Lock()
	defer k.mu.Unlock()
	return Row{ID: k.id, Role: string(cluster.RolePrefill), Rank: k.cfg.CP.Rank, Batches: k.batches, FailedChunks: k.failed,
		Bytes: k.bytes, Sessions: k.dials}
}
