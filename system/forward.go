package system

import (
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages"
)

// Forward is one forward pass, driven from the forward loop's goroutine. It
// is not safe for concurrent use (one forward loop calls it). When a real
// CUDA context must be current for recording, the caller locks its OS thread.
type Forward struct {
	e        *Engine
	id       uint64
	boundary []bool
	idle     bool // no chunk is bound: the forward records nothing
	ended    bool
}

// BeginForward starts a forward. Chunks registered before it bind to it and
// to no other forward (invariant 4).
func (e *Engine) BeginForward() (*Forward, error) {
	if !e.enter() {
		return nil, public(closedError("BeginForward"))
	}
	defer e.leave()
	f := &Forward{e: e, id: e.nextForward.Add(1), boundary: e.boundary}
	bound := make(chan int, 1)
	e.system.Root.Send(e.forward, &messages.Begin{Forward: f.id, At: time.Now(), Bound: bound})
	f.idle = <-bound == 0
	return f, nil
}

// ID returns the forward's number (1 for the engine's first forward).
func (f *Forward) ID() uint64 { return f.id }

// LayerEnd is called after the model enqueued hook layer l's KV write. At a
// non-boundary layer it is a comparison and a return; at a group boundary it
// records one event on the compute stream (here, synchronously: later would
// capture a later stream position) and hands the group to every chunk bound
// to this forward. Close releases the stream only once a LayerEnd that
// records returned; after that, a boundary's LayerEnd returns ErrClosed
// and records nothing.
func (f *Forward) LayerEnd(l int) error {
	if uint(l) >= uint(len(f.boundary)) || f.ended {
		return public(f.badLayer(l))
	}
	if !f.boundary[l] || f.idle {
		return nil
	}
	return public(f.atBoundary(l))
}

func (f *Forward) badLayer(l int) error {
	if f.ended {
		return badInput("forward %d: LayerEnd(%d) after End", f.id, l)
	}
	return badInput("forward %d: layer %d outside the %d hook layers", f.id, l, len(f.boundary))
}

func (f *Forward) atBoundary(l int) error {
	// Close releases the stream (WithGPU's is destroyed) only once no
	// Record runs on it.
	if !f.e.records.enter() {
		return closedError("LayerEnd")
	}
	defer f.e.records.leave()
	ev, err := f.e.stream.Record()
	g := f.e.layout.Groups.Of(l)
	f.e.system.Root.Send(f.e.forward, &messages.Boundary{Forward: f.id, Group: g, Event: ev, Err: err})
	if err != nil {
		return errors.Wrapf(err, "forward %d: record event for group %d", f.id, g)
	}
	return nil
}

// End is called after the model enqueued the forward's last kernel. It
// records the end-of-forward event that gates what no group covered (the
// buffers of layers that fire no hook) and what monolithic chunks send.
// Once Close is releasing the stream it returns ErrClosed and records
// nothing.
func (f *Forward) End() error {
	if f.ended {
		return public(badInput("forward %d: End called twice", f.id))
	}
	f.ended = true
	if f.idle {
		return nil
	}
	if !f.e.records.enter() {
		return public(closedError("End"))
	}
	defer f.e.records.leave()
	ev, err := f.e.stream.Record()
	if err == nil {
		f.e.ends.put(f.id, ev)
	}
	f.e.system.Root.Send(f.e.forward, &messages.End{Forward: f.id, Event: ev, Err: err, At: time.Now()})
	if err != nil {
		return public(errors.Wrapf(err, "forward %d: record end event", f.id))
	}
	return nil
}
