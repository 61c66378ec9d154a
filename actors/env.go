package actors

import (
	"sync"
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// Env is what the actor shells share: the actor system, the hardware, the
// static tables and the addresses of the long-lived actors.
type Env struct {
	System    *actor.ActorSystem
	Log       *zap.Logger
	Layout    *plan.Layout
	Peers     *Peers
	Transport rdma.Transport
	Registry  *Registry
	// Dispatcher runs the chunk, room and manager actors.
	Dispatcher *Dispatcher
	// Observer sees batches, chunks and restarts (the façade's fan-out to
	// its observers, empty when nobody listens).
	Observer DataPlaneObserver
	// Trace, if set, records what the actors handle (see package trace);
	// nil when tracing is off, and then nothing is installed.
	Trace *trace.Recorder

	Forward    *actor.PID
	Manager    *actor.PID
	Submitters *actor.PID

	// Restarts counts submitter restarts.
	Restarts atomic.Int64
	// Queued counts Work sent to submitters and not yet answered.
	Queued atomic.Int64
	// InFlight counts the bytes of batches posted and not yet completed.
	InFlight atomic.Int64

	hostsOnce  sync.Once
	chunkHosts []*chunkHost // see hosts
}

func (e *Env) send(to *actor.PID, msg any) { e.System.Root.Send(to, msg) }

// props adds the trace middleware when tracing is on.
func (e *Env) props(opts ...actor.PropsOption) []actor.PropsOption {
	if e != nil && e.Trace != nil {
		opts = append(opts, actor.WithReceiverMiddleware(trace.Middleware(e.Trace)))
	}
	return opts
}

func anys(effs []Effect) []any {
	out := make([]any, len(effs))
	for i, e := range effs {
		out[i] = e
	}
	return out
}
