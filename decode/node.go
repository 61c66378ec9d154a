package decode

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/portlease"
	"github.com/kvstream/kvstream/netsec"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// Node is this process's end of the control plane: an actor system with
// protoactor-go remote listening on an address. A Server (decode side) and
// Clients (prefill side) run on a Node; a process needs one, and should
// have only one: protoactor-go remote replaces gRPC's global logger each
// time a node starts, which races with a running node's gRPC goroutines.
//
// Every node runs netsec's guards (recovered panics, unimplemented methods
// answered with an error, every message batch checked before protoactor
// reads it, size and stream limits), answers heartbeats, and accepts
// messages from peers only for the actors of a session. With TLS, peers
// must hold a certificate of the deployment's CA, and a session is bound
// to its peer's certificate name.
type Node struct {
	system    *actor.ActorSystem
	remote    *remote.Remote
	log       *zap.Logger
	tls       bool
	tlsm      *netsec.TLS // nil in the clear
	policy    *netsec.SessionPolicy
	heartbeat netsec.HeartbeatConfig

	mu     sync.Mutex
	beats  map[*heartbeat]bool // running monitors, stopped by Close at the latest
	closed bool
	done   chan struct{}
}

// NodeConfig configures a Node.
type NodeConfig struct {
	// Listen is the control plane's address (host:port; port 0 picks a
	// free one). Anything but a loopback address needs TLS.
	Listen string
	// Advertise is the address peers reach this node on, host or
	// host:port (port 0 or none: the listen port). Default: the listen
	// address, or, when it listens on all interfaces, the address of the
	// first interface that is up and not loopback (never "[::]", which no
	// peer can dial). With TLS the peer checks that this node's
	// certificate names the advertised host.
	Advertise string
	// TLS is the node's mutual-TLS material (netsec.LoadTLS); nil runs in
	// the clear, which only a loopback Listen allows.
	TLS *netsec.TLS
	// Limits bound what one peer can make the node hold (netsec's defaults
	// when zero).
	Limits netsec.Limits
	// Heartbeat paces the heartbeats of each session: a peer that stops
	// answering (a hung or stopped process, a cut link) is declared lost
	// at most Heartbeat.Bound() after its last answer. Zero:
	// DefaultHeartbeat. Misses < 0 turns heartbeats off.
	Heartbeat netsec.HeartbeatConfig
	// Log receives failures at WARN (default: none).
	Log *zap.Logger
}

// DefaultHeartbeat declares a silent peer lost within 10 s: long enough
// that a peer starved of CPU on a loaded host is not taken for a dead one
// (the commands' --heartbeat default too).
var DefaultHeartbeat = HeartbeatWithin(10 * time.Second)

// HeartbeatWithin paces heartbeats so that a silent peer is declared lost
// within bound (six misses; bound must be positive).
func HeartbeatWithin(bound time.Duration) netsec.HeartbeatConfig {
	return netsec.HeartbeatConfig{Interval: bound / 7, Misses: 6}
}

// Listen starts a node on addr (host:port; port 0 picks a free one) in the
// clear, which only a loopback address allows. A nil log logs nothing.
func Listen(addr string, log *zap.Logger) (*Node, error) {
	return ListenConfig(NodeConfig{Listen: addr, Log: log})
}

// ListenConfig starts a node. An address that cannot be listened on or
// advertised, or a non-loopback Listen without TLS, is an error marked
// ErrBadInput that names the address.
func ListenConfig(cfg NodeConfig) (_ *Node, err error) {
	defer func() { err = public(err) }()
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	addr := cfg.Listen
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "listen address %q", addr), ErrBadInput)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, badInput("listen address %q: port %q is not a number in [0, 65535]", addr, portText)
	}
	if err := netsec.CheckListen(addr, cfg.TLS != nil); err != nil {
		return nil, errors.Mark(err, ErrBadInput)
	}
	hb := cfg.Heartbeat
	if hb == (netsec.HeartbeatConfig{}) {
		hb = DefaultHeartbeat
	}
	if hb.Misses >= 0 && (hb.Interval <= 0 || hb.Misses < 1 || hb.Misses > 1000) {
		return nil, badInput("heartbeat: interval %v must be positive and misses %d within [1, 1000] (negative: off)", hb.Interval, hb.Misses)
	}
	advertise, port, lease, err := advertised(host, port, cfg.Advertise)
	if err != nil {
		return nil, err
	}
	if lease != nil {
		// The chosen port stays held until the remote listens on it
		// (below, before this returns).
		defer lease.Release()
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		// protoactor's remote logs a lost gRPC connection at ERROR even when
		// a session ends normally; losses that matter are reported by the
		// watchers. Keep only its errors, and only when debugging.
		if !log.Core().Enabled(zap.DebugLevel) {
			return slog.New(zapslog.NewHandler(zapcore.NewNopCore()))
		}
		core, lerr := zapcore.NewIncreaseLevelCore(log.Core(), zap.WarnLevel)
		if lerr != nil {
			core = log.Core()
		}
		return slog.New(zapslog.NewHandler(core))
	}))
	n := &Node{system: system, log: log, tls: cfg.TLS != nil, tlsm: cfg.TLS, heartbeat: hb,
		policy: netsec.NewSessionPolicy(netsec.HeartbeatActor)}
	// A Hello to a server that is not there is answered (a dead letter),
	// not cut: the prefill hears that it named the server wrongly.
	n.policy.OpenPrefix(ServerActor)
	authorize := n.policy.Authorize
	if cfg.TLS == nil {
		// No identities in the clear: keep the target and type rules.
		authorize = func(_ netsec.Identity, e netsec.Envelope) error { return n.policy.AuthorizeLocal(e) }
	}
	opts, err := netsec.RemoteOptions(system, addr, netsec.Options{TLS: cfg.TLS, Limits: cfg.Limits, Authorize: authorize,
		Log: slog.New(zapslog.NewHandler(log.Core()))})
	if err != nil {
		return nil, errors.Mark(err, ErrBadInput)
	}
	if advertise != "" {
		opts = append(opts, remote.WithAdvertisedHost(advertise))
	}
	// protoactor joins host and port with a bare colon: an IPv6 host needs
	// its brackets ("[::1]"), or the listen fails with "too many colons".
	rcHost := host
	if strings.Contains(host, ":") {
		rcHost = "[" + host + "]"
	}
	rc := remote.Configure(rcHost, port, opts...)
	// protoactor retries a connection it cannot open 5 times, 2 s apart,
	// holding the endpoint writer (and a node's Close, which stops it) for
	// 10 s on a peer that is gone. One attempt: the failure becomes an
	// EndpointTerminatedEvent, which probes the sessions on that node (a
	// live peer answers), and the next send dials afresh; a decode server
	// not up yet is retried by the Client's ConnectTimeout.
	rc.MaxRetryCount = 1
	// protoactor sizes each peer node's outgoing queue for a million
	// messages up front: 16 MB of ring buffer every time it opens a
	// connection, which it does for each prefill process, and again for a
	// message sent after that process exited (the Unwatch at a session's
	// end). The garbage grew a decode's heap by about 4 MB a session (120
	// sessions: 1.2 GB of RSS). The queue doubles when it fills.
	rc.EndpointWriterQueueSize = endpointQueue
	r := remote.NewRemote(system, rc)
	defer func() {
		// remote.Start panics when it cannot listen.
		if p := recover(); p != nil {
			err = errors.Newf("listen on %s: %v", addr, p)
		}
	}()
	r.Start()
	n.remote = r
	// This node's connection to a peer ended (its process died, or the
	// network cut it): local evidence, which no peer can forge, unlike a
	// Terminated. The sessions watching that node probe it at once rather
	// than wait out their heartbeats' bound; a peer that answers goes on.
	system.EventStream.Subscribe(func(evt any) {
		if e, ok := evt.(*remote.EndpointTerminatedEvent); ok {
			n.probe(e.Address)
		}
	})
	if _, err := netsec.ServeHeartbeats(system); err != nil {
		_ = n.Close(context.Background())
		return nil, err
	}
	return n, nil
}

// advertised is the address to advertise ("" when the listener's own
// address will do) and the port to listen on: when a host is advertised
// and the listen port is 0, a free port is chosen first, since protoactor
// advertises exactly what it is given, and held by the lease returned
// (nil when none was chosen) until the node listens on it.
func advertised(host string, port int, advertise string) (string, int, *portlease.Lease, error) {
	advHost, advPort := advertise, ""
	if advertise != "" {
		if h, p, err := net.SplitHostPort(advertise); err == nil {
			advHost, advPort = h, p
		} else if strings.Contains(advertise, ":") && net.ParseIP(advertise) == nil {
			return "", 0, nil, errors.Mark(errors.Wrapf(err, "advertise address %q", advertise), ErrBadInput)
		}
		if advHost == "" || isUnspecified(advHost) {
			return "", 0, nil, badInput("advertise address %q: peers cannot dial an unspecified host", advertise)
		}
		if advPort != "" {
			p, err := strconv.Atoi(advPort)
			if err != nil || p < 0 || p > 65535 {
				return "", 0, nil, badInput("advertise address %q: port %q is not a number in [0, 65535]", advertise, advPort)
			}
			if p == 0 {
				advPort = ""
			}
		}
	}
	if advHost == "" && !isUnspecified(host) {
		return "", port, nil, nil // the listener's address is what peers dial
	}
	if advHost == "" {
		ip, err := RoutableIP()
		if err != nil {
			return "", 0, nil, errors.Mark(errors.Wrapf(err, "listen address %q is on all interfaces: give an address to advertise", net.JoinHostPort(host, strconv.Itoa(port))), ErrBadInput)
		}
		advHost = ip.String()
	}
	var lease *portlease.Lease
	if advPort == "" {
		if port == 0 {
			l, err := freePort(host)
			if err != nil {
				return "", 0, nil, err
			}
			lease, port = l, l.Port
		}
		advPort = strconv.Itoa(port)
	}
	return net.JoinHostPort(advHost, advPort), port, lease, nil
}

func isUnspecified(host string) bool {
	if host == "" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsUnspecified()
}

// freePort holds a free port of host (a name is resolved first) that a
// listener may bind, and nothing else, until the lease is released:
// listening on port 0 and closing would free it at once, for any other
// bind or connection to take before the node listens.
func freePort(host string) (*portlease.Lease, error) {
	ip := host
	if host != "" && net.ParseIP(host) == nil {
		a, err := net.ResolveIPAddr("ip", host)
		if err != nil {
			return nil, errors.Wrapf(err, "pick a free port on %q", host)
		}
		ip = a.String() // with its zone, if any
	}
	l, err := portlease.Take(ip, true)
	if err != nil {
		return nil, errors.Wrapf(err, "pick a free port on %q", host)
	}
	return l, nil
}

// RoutableIP is the address a node listening on all interfaces advertises:
// the first IPv4 address of an interface that is up and not loopback, else
// the first global IPv6 one.
func RoutableIP() (net.IP, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, errors.Wrap(err, "list network interfaces")
	}
	var v6 net.IP
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, err := ifc.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok || !ipn.IP.IsGlobalUnicast() {
				continue
			}
			if ip4 := ipn.IP.To4(); ip4 != nil {
				return ip4, nil
			}
			if v6 == nil {
				v6 = ipn.IP
			}
		}
	}
	if v6 != nil {
		return v6, nil
	}
	return nil, errors.New("no interface is up with a routable address")
}

// Addr is the address peers reach this node on: what a prefill passes to
// Dial as DialConfig.Decode.
func (n *Node) Addr() string { return n.system.Address() }

// endpointActors are the actors protoactor-go remote spawns under these
// names to hold its outgoing connections (see remote/endpoint_manager.go).
var endpointActors = []string{"EndpointSupervisor", "activator"}

// Close stops the node: its outgoing connections, then its gRPC server.
// Close the Server and Clients on it first. It returns when the node
// stopped or when ctx ends (the stop then goes on in the background; each
// of its steps is bounded by protoactor's 10 s stop timeout). Later calls
// wait for the first one.
//
// It does not call Remote.Shutdown(true): that call sets the endpoint
// manager's connection map to nil while a goroutine that saw a connection
// end (the peer leaving, or our own close) may still be reading it, a data
// race that is a nil dereference without -race. Stopping the endpoint
// actors closes the outgoing connections just as that call does, and
// Shutdown(false) stops the gRPC server; the map stays valid for late
// readers.
func (n *Node) Close(ctx context.Context) error {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		n.done = make(chan struct{})
		beats := make([]*heartbeat, 0, len(n.beats))
		for h := range n.beats {
			beats = append(beats, h)
		}
		go func() {
			defer close(n.done)
			// Sessions not ended (a client never closed): their monitors
			// would outlive the node.
			for _, h := range beats {
				h.stop()
			}
			for _, id := range endpointActors {
				if _, ok := n.system.ProcessRegistry.GetLocal(id); ok {
					_ = n.system.Root.StopFuture(actor.NewPID(n.system.Address(), id)).Wait()
				}
			}
			n.remote.Shutdown(false)
			n.system.Shutdown()
		}()
	}
	done := n.done
	n.mu.Unlock()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return public(errors.Wrapf(ctx.Err(), "close node %s", n.Addr()))
	}
}

func (n *Node) isClosed() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.closed
}

// stopActor stops one of ours and waits, within ctx.
func (n *Node) stopActor(ctx context.Context, pid *actor.PID) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = n.system.Root.StopFuture(pid).Wait()
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return errors.Wrapf(ctx.Err(), "stop actor %s", pid.Id)
	}
}

// request sends msg to pid and waits for the answer within ctx and at most
// limit. The future is waited on a goroutine of its own (never inside an
// actor's Receive, where Result would deadlock).
func (n *Node) request(ctx context.Context, pid *actor.PID, msg any, limit time.Duration) (any, error) {
	if dl, ok := ctx.Deadline(); ok {
		limit = min(limit, max(time.Until(dl), time.Millisecond))
	}
	f := n.system.Root.RequestFuture(pid, msg, limit)
	type answer struct {
		v   any
		err error
	}
	ch := make(chan answer, 1)
	go func() {
		v, err := f.Result()
		ch <- answer{v, err}
	}()
	select {
	case a := <-ch:
		if a.err != nil {
			return nil, errors.Wrapf(a.err, "%T to %s", msg, fmt.Sprint(pid))
		}
		return a.v, nil
	case <-ctx.Done():
		// Stopping the future completes it now: the goroutine waiting for
		// its result ends instead of living until the call's limit.
		n.system.Root.Stop(f.PID())
		return nil, errors.Wrapf(ctx.Err(), "%T to %s", msg, fmt.Sprint(pid))
	}
}

// bind adds a session with peer (its certificate name) to the node's
// session policy: once any session is bound, only the peers of sessions
// may deliver, but to the servers' actors (open: they answer every
// Hello). In the clear it does nothing.
func (n *Node) bind(peer string) error {
	if !n.tls {
		return nil
	}
	return n.policy.Bind(peer)
}

// unbind ends one session of bind's.
func (n *Node) unbind(peer string) {
	if !n.tls || peer == "" {
		return
	}
	n.policy.Unbind(peer)
}

// endpointQueue is the initial length of the queue of messages to one
// peer node (it doubles when full).
const endpointQueue = 1024

// probeWindow is how long a peer whose connection ended may take to
// answer a heartbeat before it is declared lost.
const probeWindow = 1500 * time.Millisecond

// probe has every session watching the node at addr ask it now.
func (n *Node) probe(addr string) {
	n.mu.Lock()
	var hs []*heartbeat
	for h := range n.beats {
		if h.addr == addr {
			hs = append(hs, h)
		}
	}
	n.mu.Unlock()
	for _, h := range hs {
		h.mon.Probe(probeWindow)
	}
}

// heartbeat is one session's watch over its peer node's heartbeats.
type heartbeat struct {
	node *Node
	name string
	addr string
	mon  *netsec.Monitor
}

// watchPeer pings the heartbeat actor of the node at addr from a monitor
// named name; lost runs once, on the monitor's goroutine, when the peer
// went silent for the node's heartbeat bound. nil, nil when heartbeats
// are off.
func (n *Node) watchPeer(addr, name string, lost func(error)) (*heartbeat, error) {
	if n.heartbeat.Misses < 0 {
		return nil, nil
	}
	cfg := n.heartbeat
	cfg.Name = name
	// Allowed before it exists, so that no Pong is refused (a refused
	// batch closes the stream that carried it).
	n.policy.Allow(name)
	mon, err := netsec.WatchHeartbeats(n.system, actor.NewPID(addr, netsec.HeartbeatActor), cfg, lost)
	if err != nil {
		n.policy.Forbid(name)
		return nil, err
	}
	h := &heartbeat{node: n, name: name, addr: addr, mon: mon}
	n.mu.Lock()
	if n.beats == nil {
		n.beats = map[*heartbeat]bool{}
	}
	n.beats[h] = true
	n.mu.Unlock()
	return h, nil
}

// stop stops the monitor and waits for it: never on the monitor's own
// goroutine (its lost callback) nor inside another actor's Receive.
func (h *heartbeat) stop() {
	if h == nil {
		return
	}
	// Its name stays allowed a while: a Pong still on its way would
	// otherwise be refused, and a refused batch closes the stream that
	// carries the other sessions' messages too. Then it goes, so that the
	// policy does not grow by a name a session.
	h.mon.Stop()
	h.node.mu.Lock()
	delete(h.node.beats, h)
	h.node.mu.Unlock()
	policy, name := h.node.policy, h.name
	time.AfterFunc(pongLate+2*h.node.heartbeat.Interval, func() { policy.Forbid(name) })
}

// pongLate bounds how late a Pong may come after its monitor stopped.
const pongLate = 10 * time.Second
