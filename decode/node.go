package decode

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/cockroachdb/errors"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// Node is this process's end of the control plane: an actor system with
// protoactor-go remote listening on an address. A Server (decode side) and
// Clients (prefill side) run on a Node; a process needs one, and should
// have only one: protoactor-go remote replaces gRPC's global logger each
// time a node starts, which races with a running node's gRPC goroutines.
type Node struct {
	system *actor.ActorSystem
	remote *remote.Remote
	log    *zap.Logger

	mu     sync.Mutex
	closed bool
	done   chan struct{}
	err    error
}

// Listen starts a node on addr (host:port; port 0 picks a free one). A nil
// log logs nothing.
func Listen(addr string, log *zap.Logger) (_ *Node, err error) {
	defer func() { err = public(err) }()
	if log == nil {
		log = zap.NewNop()
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errors.Mark(errors.Wrapf(err, "listen address %q", addr), ErrBadInput)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, badInput("listen address %q: port %q is not a number in [0, 65535]", addr, portText)
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
	r := remote.NewRemote(system, remote.Configure(host, port))
	defer func() {
		// remote.Start panics when it cannot listen.
		if p := recover(); p != nil {
			err = errors.Newf("listen on %s: %v", addr, p)
		}
	}()
	r.Start()
	return &Node{system: system, remote: r, log: log}, nil
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
		go func() {
			defer close(n.done)
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
		return nil, errors.Wrapf(ctx.Err(), "%T to %s", msg, fmt.Sprint(pid))
	}
}
