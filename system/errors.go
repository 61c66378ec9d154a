package system

import (
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/actors"
	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/stderrs"
)

// Error classes a caller branches on with errors.Is.
var (
	// ErrBadInput: a value passed in cannot describe a transfer (wrong page
	// lists, unknown room or peer, layer out of range, a call after Close).
	// Nothing changed.
	ErrBadInput = actors.ErrBadInput
	// ErrTimeout: a chunk did not complete within its finish timeout.
	ErrTimeout = actors.ErrTimeout
	// ErrEndpointBroken: a transport endpoint failed (peer gone, teardown).
	ErrEndpointBroken = rdma.ErrEndpointBroken
	// ErrDeviceLost: the CUDA context is unusable; the engine is unhealthy.
	ErrDeviceLost = cuda.ErrDeviceLost
	// ErrEventWait: waiting on a group's CUDA event failed.
	ErrEventWait = actors.ErrEventWait
	// ErrClosed: the engine was closed. Also marked ErrBadInput.
	ErrClosed = errors.New("engine closed")
	// ErrNotQuiesced: a chunk timed out and its teardown could not
	// guarantee that nothing more lands (UCX over TCP or shared memory with
	// a stalled peer): do not reuse its decode pages.
	ErrNotQuiesced = rdma.ErrNotQuiesced
	// ErrPeerLost: a decode peer was reported lost (Engine.PeerLost). Also
	// marked ErrEndpointBroken.
	ErrPeerLost = actors.ErrPeerLost
	// ErrNoChunk: Finish or Drop of a room with no chunk to finish or drop
	// (never registered, or every chunk already finished or dropped). Also
	// ErrBadInput. One error for both, whatever the timing.
	ErrNoChunk = actors.ErrNoChunk
	// ErrDropped: the chunk a Finish waited for was dropped (Drop of its
	// room) before it completed; the result's status is Dropped.
	ErrDropped = actors.ErrDropped
	// ErrResendLimit: a chunk failed because one of its batches broke, or
	// had no completion within its completion deadline, more often than the
	// resend limit allows (docs/RELIABILITY.md, "Resume after a broken
	// endpoint"). Also marked rdma.ErrEndpointBroken.
	ErrResendLimit = actors.ErrResendLimit
	// ErrDecodeDraining: Register refused a chunk that would open a new
	// room toward a decode peer that drains (Engine.PeerDraining; the
	// decode server said it is stopping): nothing changed; register the
	// request toward another decode. Chunks of rooms already in flight
	// there are registered as before.
	ErrDecodeDraining = actors.ErrPeerDraining
	// ErrRoomCancelled: Register refused a chunk of a room its decode peer
	// cancelled (Engine.CancelRoom): nothing changed; the request is given
	// up. Also marked ErrBadInput.
	ErrRoomCancelled = errors.New("room cancelled by its decode peer")
)

// public is how every exported function returns its error: marks become
// visible to the standard library's errors.Is too (see internal/stderrs).
func public(err error) error { return stderrs.Public(err) }

func closedError(call string) error {
	return errors.Mark(errors.Mark(errors.Newf("%s after Close", call), ErrClosed), ErrBadInput)
}

// ResendLimit is how many times a chunk re-sends one group (or its rest)
// to one destination after its batch broke or its completion was overdue
// before it fails with ErrResendLimit.
const ResendLimit = actors.ResendLimit
