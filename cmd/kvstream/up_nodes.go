package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/internal/twoproc"
	"github.com/kvstream/kvstream/internal/workload"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// A cluster node (decode-instance, prefill-rank) speaks to whoever started
// it (kvstream up, or an operator's supervisor) in JSON lines: events on
// stdout, commands on stdin. Closing its stdin, or SIGTERM, ends it.

// nodeEvent is one stdout line of a cluster node.
type nodeEvent struct {
	Event string `json:"event"` // ready, room, batch, forward, node
	ID    string `json:"id,omitempty"`
	Addr  string `json:"addr,omitempty"`
	Pid   int    `json:"pid,omitempty"`
	// room: a room's end on a decode instance; batch: a rank's run of a
	// batch; forward: a rank's progress in one.
	Batch    int     `json:"batch"`
	Room     uint64  `json:"room,omitempty"`
	Complete bool    `json:"complete,omitempty"`
	Decode   string  `json:"decode,omitempty"`
	Rank     int     `json:"rank"`
	OK       bool    `json:"ok,omitempty"`
	Failed   int     `json:"failed_chunks,omitempty"`
	Bytes    uint64  `json:"bytes,omitempty"`
	Seconds  float64 `json:"seconds,omitempty"`
	// FirstFailureUnixMs is when the rank's first chunk of the batch
	// failed (wall clock, shared by the processes of one host).
	FirstFailureUnixMs int64    `json:"first_failure_unix_ms,omitempty"`
	Error              string   `json:"error,omitempty"`
	Row                *nodeRow `json:"row,omitempty"`
}

// nodeRow is a node's summary, printed when it ends: `kvstream up` prints
// one per node.
type nodeRow struct {
	ID            string `json:"id"`
	Role          string `json:"role"`
	Addr          string `json:"addr"`
	Rank          int    `json:"rank,omitempty"`
	RoomsComplete int    `json:"rooms_complete,omitempty"`
	RoomsFailed   int    `json:"rooms_failed,omitempty"`
	PagesVerified uint64 `json:"pages_verified,omitempty"`
	Mismatch      string `json:"mismatch,omitempty"`
	Batches       int    `json:"batches,omitempty"`
	FailedChunks  int    `json:"failed_chunks"`
	Bytes         uint64 `json:"bytes,omitempty"`
	// Lookups counts this node's calls to the membership provider
	// (lookups, listings, watches): per session at most, never per
	// request or forward. Sessions counts the decode sessions it dialled.
	Lookups  int64 `json:"lookups"`
	Sessions int64 `json:"sessions,omitempty"`
}

// eventOut writes events as JSON lines, one writer at a time.
type eventOut struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func (o *eventOut) emit(e nodeEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_ = o.enc.Encode(e)
}

// clusterFlags are a node's discovery flags.
type clusterFlags struct {
	etcd, prefix string
	ttl          time.Duration
}

func (f *clusterFlags) add(fl *pflag.FlagSet) {
	fl.StringVar(&f.etcd, "etcd", "", "etcd client URLs, comma-separated (http://10.0.0.5:2379)")
	fl.StringVar(&f.prefix, "cluster-prefix", cluster.DefaultPrefix, "root of this cluster's keys in etcd")
	fl.DurationVar(&f.ttl, "member-ttl", 0, "how long a member that stopped keeping alive stays visible (0: cluster.DefaultTTL)")
}

// open connects to etcd through a provider that counts the calls.
func (f *clusterFlags) open(log *zap.Logger) (*countingProvider, error) {
	if f.etcd == "" {
		return nil, errors.New("--etcd is required: a node finds its peers on etcd (kvstream up starts one)")
	}
	p, err := cluster.Open(cluster.Config{Endpoints: strings.Split(f.etcd, ","), Prefix: f.prefix, TTL: f.ttl, Logger: log})
	if err != nil {
		return nil, err
	}
	return &countingProvider{Provider: p}, nil
}

// countingProvider counts the calls that reach the membership provider:
// the evidence that the per-request and per-forward paths make none.
type countingProvider struct {
	cluster.Provider
	calls atomic.Int64
}

func (c *countingProvider) Lookup(ctx context.Context, role cluster.Role, id string) (cluster.Member, error) {
	c.calls.Add(1)
	return c.Provider.Lookup(ctx, role, id)
}

func (c *countingProvider) List(ctx context.Context, role cluster.Role) ([]cluster.Member, error) {
	c.calls.Add(1)
	return c.Provider.List(ctx, role)
}

func (c *countingProvider) Watch(ctx context.Context, role cluster.Role) ([]cluster.Member, <-chan cluster.Event, error) {
	c.calls.Add(1)
	return c.Provider.Watch(ctx, role)
}

// nodeContext ends on SIGTERM, SIGINT or the stdin's end.
func nodeContext(stdin io.Reader) (context.Context, context.CancelFunc, <-chan string) {
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	lines := make(chan string)
	go func() {
		defer cancel()
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
	}()
	return ctx, cancel, lines
}

func newDecodeInstance() *cobra.Command {
	var cf clusterFlags
	var nf netFlags
	var id, transport, rule string
	var size, pageSize int
	var maxPoolMiB uint64
	var verbose bool
	var roomTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "decode-instance",
		Short: "A decode instance of a cluster: serve a CP group's ranks at once, found by id on etcd",
		Long: `decode-instance serves the prefill ranks of a CP group (--cp ranks, --cp-rule) at once, each over its
own session: a room is complete only when every rank owning pages of each of its chunks reported them
successful and every page holds the model's bytes. It registers {id, decode, address} on etcd once it
serves (and revokes it first when it stops), prints JSON lines on stdout (ready, one per room that
ended, and its row when it ends) and ends on SIGTERM or when its stdin closes. kvstream up starts it.
Off loopback the control plane needs mutual TLS and takes the network flags of kvstream decode
(--tls-dir, --advertise, --data-addr, --heartbeat).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			log := cliLogger(verbose)
			defer log.Sync() //nolint:errcheck
			r, err := cp.ParseRule(rule)
			if err != nil {
				return errors.Wrap(err, "--cp-rule")
			}
			prov, err := cf.open(log)
			if err != nil {
				return err
			}
			defer prov.Close()
			tlsm, err := nf.check("decode")
			if err != nil {
				return err
			}
			pl, err := nf.open(tlsm, log, transport, id)
			if err != nil {
				return err
			}
			defer pl.close(&err)
			node, tr := pl.node, pl.tr
			out := &eventOut{enc: json.NewEncoder(cmd.OutOrStdout())}
			row := nodeRow{ID: id, Role: string(cluster.RoleDecode), Addr: node.Addr()}
			var rowMu sync.Mutex
			d, err := twoproc.StartGroupDecode(node, tr, maxPoolMiB<<20, decode.Group{Size: size, Rule: r, PageSize: pageSize}, roomTimeout, id,
				func(room decode.Room, err error) {
					batch, rm := twoproc.SplitRoom(room.ID)
					e := nodeEvent{Event: "room", ID: id, Batch: batch, Room: rm, Complete: err == nil && room.Complete}
					rowMu.Lock()
					if e.Complete {
						row.RoomsComplete++
					} else {
						row.RoomsFailed++
						if err != nil {
							e.Error = err.Error()
						}
					}
					rowMu.Unlock()
					out.emit(e)
				}, log)
			if err != nil {
				return err
			}
			defer closeWithin("the decode server", d.Close, &err)
			ctx, cancel, _ := nodeContext(cmd.InOrStdin())
			defer cancel()
			// Registered last, once it serves: a member found is a member
			// that answers.
			reg, err := prov.Register(ctx, cluster.Member{ID: id, Role: cluster.RoleDecode, Addr: node.Addr()})
			if err != nil {
				return errors.Wrapf(err, "register decode instance %s", id)
			}
			out.emit(nodeEvent{Event: "ready", ID: id, Addr: node.Addr(), Pid: os.Getpid()})
			select {
			case <-ctx.Done():
			case <-reg.Done():
				log.Warn("registration ended", zap.String("id", id), zap.Error(reg.Err()))
			}
			// Revoked first: no rank picks an instance that is going.
			_ = reg.Close()
			rowMu.Lock()
			row.PagesVerified, row.Mismatch = d.Verified()
			row.Lookups = prov.calls.Load()
			final := row
			rowMu.Unlock()
			out.emit(nodeEvent{Event: "node", ID: id, Row: &final})
			return nil
		},
	}
	fl := cmd.Flags()
	cf.add(fl)
	fl.StringVar(&id, "id", "decode-0", "this instance's identity in the cluster")
	addNetFlags(fl, &nf, "decode", "127.0.0.1:0")
	fl.StringVar(&transport, "transport", "ucx", "data transport")
	fl.IntVar(&size, "cp", 1, "ranks of the CP group that writes each room")
	fl.StringVar(&rule, "cp-rule", "shared", "CP page rule: shared or contiguous")
	fl.IntVar(&pageSize, "page-size", workload.Defaults().PageSize, "tokens per page")
	fl.Uint64Var(&maxPoolMiB, "max-pool-mib", 4096, "the most memory the decode pool sized for the prefill may take")
	fl.DurationVar(&roomTimeout, "room-timeout", 2*time.Minute, "fail a room not complete this long after its first notice (0: never)")
	fl.BoolVar(&verbose, "verbose", false, "log at DEBUG")
	return cmd
}

func newPrefillRank() *cobra.Command {
	f := &simFlags{cfg: workload.Defaults()}
	var cf clusterFlags
	var nf netFlags
	var group, transport, decodeName string
	cmd := &cobra.Command{
		Use:   "prefill-rank",
		Short: "One CP rank of a cluster's prefill group: run batches of the sim workload into the decode instances it is told",
		Long: `prefill-rank is rank --cp-rank of the CP group --cp-group (--cp ranks): its own engine and transport. It
registers {<cp-group>-r<rank>, prefill, address, group, rank, size} on etcd and follows the decode
instances' membership. Each stdin line "run BATCH DECODE-ID" runs one batch of the sim workload (its
pages of every request) into that instance over the rank's session with it: the session is opened at
the instance's first batch and kept, so a request or a forward never asks etcd. It prints a JSON line
per batch and its row when its stdin closes (after saying goodbye to every instance). Off loopback
the control plane needs mutual TLS and takes the network flags of kvstream prefill (--tls-dir,
--advertise, --data-addr, --heartbeat, --decode-name).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			cfg, err := f.config()
			if err != nil {
				return err
			}
			log := cliLogger(f.verbose)
			defer log.Sync() //nolint:errcheck
			prov, err := cf.open(log)
			if err != nil {
				return err
			}
			defer prov.Close()
			id := fmt.Sprintf("%s-r%d", group, cfg.CP.Rank)
			tlsm, err := nf.check("prefill")
			if err != nil {
				return err
			}
			pl, err := nf.open(tlsm, log, transport, id)
			if err != nil {
				return err
			}
			defer pl.close(&err)
			node, tr := pl.node, pl.tr
			ctx, cancel, lines := nodeContext(cmd.InOrStdin())
			defer cancel()
			res := cluster.NewResolver(prov)
			defer res.Close()
			if err := res.Follow(cluster.RoleDecode); err != nil {
				return err
			}
			reg, err := prov.Register(ctx, cluster.Member{ID: id, Role: cluster.RolePrefill, Addr: node.Addr(),
				Group: group, Rank: cfg.CP.Rank, Size: cfg.CP.Size})
			if err != nil {
				return errors.Wrapf(err, "register prefill rank %s", id)
			}
			defer reg.Close()
			out := &eventOut{enc: json.NewEncoder(cmd.OutOrStdout())}
			rk := &rank{cfg: cfg, id: id, decodeName: decodeName, node: node, tr: tr, res: res, log: log, out: out, sessions: map[string]*decode.Client{}}
			out.emit(nodeEvent{Event: "ready", ID: id, Addr: node.Addr(), Pid: os.Getpid(), Rank: cfg.CP.Rank})
			var wg sync.WaitGroup
		read:
			for {
				select {
				case <-ctx.Done():
					break read
				case l := <-lines:
					var batch int
					var dec string
					if _, err := fmt.Sscanf(l, "run %d %s", &batch, &dec); err != nil {
						log.Warn("unknown command", zap.String("line", l))
						continue
					}
					wg.Go(func() { rk.run(ctx, batch, dec) })
				}
			}
			wg.Wait()
			rk.byeAll()
			row := rk.row()
			row.Addr, row.Lookups = node.Addr(), prov.calls.Load()
			out.emit(nodeEvent{Event: "node", ID: id, Row: &row})
			return nil
		},
	}
	fl := cmd.Flags()
	addWorkloadFlags(fl, f)
	cf.add(fl)
	fl.StringVar(&group, "cp-group", "g0", "the CP group's name")
	addNetFlags(fl, &nf, "prefill", "127.0.0.1:0")
	fl.StringVar(&decodeName, "decode-name", decode.DefaultDecodeName, "with TLS: the name every decode instance's certificate must carry")
	fl.StringVar(&transport, "transport", "ucx", "data transport")
	fl.BoolVar(&f.verbose, "verbose", false, "log at DEBUG")
	return cmd
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
	out        *eventOut

	mu       sync.Mutex
	sessions map[string]*decode.Client // by decode instance id
	dials    int64
	batches  int
	failed   int
	bytes    uint64
}

// session returns the rank's session with decode instance dec, opening it
// the first time (or after the instance was lost): the one place a rank
// resolves an instance, from the resolver's followed membership.
func (k *rank) session(ctx context.Context, dec string, geom testbed.Geometry) (*decode.Client, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if c := k.sessions[dec]; c != nil {
		if c.Lost() == nil {
			return c, nil
		}
		// The instance went away (and may be back under a new address):
		// this is the one case where the rank resolves it again.
		_ = c.Close(ctx)
		delete(k.sessions, dec)
	}
	m, err := k.res.Resolve(ctx, cluster.RoleDecode, dec)
	if err != nil {
		return nil, err
	}
	c, err := decode.Dial(ctx, k.node, decode.DialConfig{Decode: m.Addr, DecodeName: k.decodeName, Buffers: twoproc.LayoutOf(geom), PageSize: k.cfg.PageSize, Name: k.id, Log: k.log,
		Metadata: map[string]string{twoproc.SeedKey: strconv.FormatUint(k.cfg.Seed, 10), decode.RankKey: strconv.Itoa(k.cfg.CP.Rank)}})
	if err != nil {
		return nil, errors.Wrapf(err, "session with decode instance %s at %s", dec, m.Addr)
	}
	k.dials++
	k.sessions[dec] = c
	return c, nil
}

// run runs one batch into decode instance dec and reports it.
func (k *rank) run(ctx context.Context, batch int, dec string) {
	cfg := k.cfg
	cfg.Seed = twoproc.BatchSeed(k.cfg.Seed, batch)
	cfg.Progress = func(done, total int) {
		k.out.emit(nodeEvent{Event: "forward", ID: k.id, Batch: batch, Rank: k.cfg.CP.Rank, Decode: dec})
	}
	plane := twoproc.NewRankPlane(func(g testbed.Geometry) (*decode.Client, error) { return k.session(ctx, dec, g) }, k.tr, batch, cfg.PromptTokens)
	start := time.Now()
	e := nodeEvent{Event: "batch", ID: k.id, Batch: batch, Rank: k.cfg.CP.Rank, Decode: dec}
	mr, err := workload.RunRemote(ctx, cfg, k.log, plane, true)
	e.Seconds = time.Since(start).Seconds()
	switch {
	case err != nil:
		e.Error = err.Error()
	case mr.Failed > 0 || mr.Aborted != "":
		e.Failed, e.Error = mr.Failed, mr.FirstError+mr.Aborted
	case plane.Verify(nil) != "":
		e.Error = plane.Verify(nil)
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
	k.out.emit(e)
}

// byeAll says goodbye to every instance still there.
func (k *rank) byeAll() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for dec, c := range k.sessions {
		if c.Lost() != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := c.Bye(ctx, nil); err != nil {
			k.log.Warn("goodbye", zap.String("decode", dec), zap.Error(err))
		}
		cancel()
	}
}

func (k *rank) row() nodeRow {
	k.mu.Lock()
	defer k.mu.Unlock()
	return nodeRow{ID: k.id, Role: string(cluster.RolePrefill), Rank: k.cfg.CP.Rank, Batches: k.batches, FailedChunks: k.failed,
		Bytes: k.bytes, Sessions: k.dials}
}
