// Package twoproc runs prefill and decode as separate processes: the data
// moves over a real transport (UCX), the control plane over protoactor-go
// remote (gRPC, the protobuf messages of messages/wire). The decode process
// serves a pool of the prefill's geometry, verifies every page a finished
// chunk wrote, and reports; the prefill process runs the sim workload into
// it. Each side detects the loss of the other (remote termination).
package twoproc

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"github.com/cockroachdb/errors"
	"go.uber.org/zap"
	"go.uber.org/zap/exp/zapslog"
	"go.uber.org/zap/zapcore"
)

// DecodeActor is the decode process's actor name.
const DecodeActor = "decode"

// node is an actor system with remote started on an address.
type node struct {
	system *actor.ActorSystem
	remote *remote.Remote
}

// startNode starts an actor system listening on listen (host:port; port 0
// picks one).
func startNode(listen string, log *zap.Logger) (n *node, err error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, errors.Wrapf(err, "listen address %q", listen)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, errors.Newf("listen address %q: bad port", listen)
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
			err = errors.Newf("listen on %s: %v", listen, p)
		}
	}()
	r.Start()
	return &node{system: system, remote: r}, nil
}

// Addr is the address peers reach this node on.
func (n *node) Addr() string { return n.system.Address() }

// endpointActors are the actors protoactor-go remote spawns under these
// names to hold its outgoing connections (see remote/endpoint_manager.go).
var endpointActors = []string{"EndpointSupervisor", "activator"}

// stop tears the node down without Remote.Shutdown(true): that call sets the
// endpoint manager's connection map to nil while a goroutine that saw a
// connection end (the peer leaving, or our own close) may still be reading it
// in removeEndpoint, a data race that is a nil dereference without -race.
// Stopping the endpoint actors closes the outgoing connections just as that
// call does, and Shutdown(false) stops the gRPC server; the connection map
// stays valid for any late reader.
func (n *node) stop() {
	for _, id := range endpointActors {
		if _, ok := n.system.ProcessRegistry.GetLocal(id); ok {
			_ = n.system.Root.StopFuture(actor.NewPID(n.system.Address(), id)).Wait()
		}
	}
	n.remote.Shutdown(false)
	n.system.Shutdown()
}

// watcher calls lost when the watched actor terminates (its process died
// or the connection to it broke).
func watcher(target *actor.PID, lost func(error)) *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *actor.Started:
			ctx.Watch(target)
		case *actor.Terminated:
			lost(errors.Newf("%s terminated (%s)", fmt.Sprint(m.Who), m.Why))
		}
	})
}
