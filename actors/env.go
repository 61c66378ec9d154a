package actors

import (
	"sync/atomic"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/hw/rdma"
	"go.uber.org/zap"
)

// Env is what the actor shells share: the actor system, the hardware, the
// static tables and the addresses of the long-lived actors.
type Env struct {
	System    *actor.ActorSystem
	Log       *zap.Logger
	Layout    *Layout
	Peers     *Peers
	Transport rdma.Transport
	Registry  *Registry
	// Dispatcher runs the chunk actors.
	Dispatcher *Dispatcher
	// Observer sees batches and chunks (Observers{} when nobody listens).
	Observer Observer

	Forward    *actor.PID
	Manager    *actor.PID
	Submitters *actor.PID

	// Restarts counts submitter restarts.
	Restarts atomic.Int64
	// Queued counts Work sent to submitters and not yet answered.
	Queued atomic.Int64
}

func (e *Env) send(to *actor.PID, msg any) { e.System.Root.Send(to, msg) }
