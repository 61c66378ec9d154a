package system

import (
	"io"

	"github.com/kvstream/kvstream/hw/cuda"
	"github.com/kvstream/kvstream/hw/cuda/driver"
	"github.com/kvstream/kvstream/hw/rdma"
	"go.uber.org/zap"
)

// Option configures an Engine beyond its Config.
type Option func(*options)

type options struct {
	gpu       *driver.Device
	gpuErr    error
	traceTo   io.Writer
	traceCap  int
	observers observers
	// started run at the end of New, with the engine (gauges, watchers).
	started   []func(*Engine)
	log       *zap.Logger
	stream    cuda.Stream
	transport rdma.Transport
	hardware  Hardware
	getenv    func(string) string
	draining  []func(peer, reason string)
	cancelled []func(peer string, room uint64, reason string)
}

// WithLogger sets the logger. The default writes WARN and above to stderr,
// so failures are seen and successes are not (invariant 12).
func WithLogger(l *zap.Logger) Option { return func(o *options) { o.log = l } }

// WithStream sets the compute stream events are recorded on. A production
// engine needs it (or WithGPU); see WithHardware for the virtual GPU.
func WithStream(s cuda.Stream) Option { return func(o *options) { o.stream = s } }

// WithGPU records the engine's events on a new stream of a real GPU (see
// hw/cuda/driver), and closes that stream when the engine closes. It takes
// driver.Open's results as they are, so that a missing driver library or
// device is New's error:
//
//	eng, err := system.New(cfg, system.WithGPU(driver.Open(0)))
//
// To record on a stream the serving stack already owns, use
// WithStream(dev.WrapStream(handle)) instead.
func WithGPU(dev *driver.Device, err error) Option {
	return func(o *options) { o.gpu, o.gpuErr = dev, err }
}

// WithTransport sets the transport the KV moves over (UCX in production).
// A production engine needs it; see WithHardware for the in-process
// loopback.
func WithTransport(t rdma.Transport) Option { return func(o *options) { o.transport = t } }

// Hardware makes what an engine's other options left out, for that engine
// alone: it closes both when it closes.
type Hardware interface {
	// Stream returns a compute stream and what releases it.
	Stream() (cuda.Stream, func(), error)
	// Transport returns a transport.
	Transport() (rdma.Transport, error)
}

// WithHardware lets the engine fill in, from h, what the other options
// left out: a compute stream for a missing WithStream/WithGPU, a transport
// for a missing WithTransport. Package system/simulated's Hardware is the
// virtual GPU and the in-process loopback, for simulations, tests and
// examples: an option a production binary need not import, and never a
// silent default. Without it, New refuses to start without a stream and a
// transport.
func WithHardware(h Hardware) Option { return func(o *options) { o.hardware = h } }

// WithObserver adds an observer (metrics, traces, reports).
func WithObserver(o Observer) Option {
	return func(op *options) { op.observers = append(op.observers, o) }
}

// WithGetenv replaces os.Getenv for the KVSTREAM_* variables (tests).
func WithGetenv(f func(string) string) Option { return func(o *options) { o.getenv = f } }

// WithPeerDraining calls f when a decode peer drains (Engine.PeerDraining,
// which decode.Client.Attach calls when the decode server says it is
// stopping), with the peer's id and the reason: a router sends new
// requests to another decode from then on (Register refuses new rooms
// toward that peer with ErrDecodeDraining) and says Bye to the draining
// one once its rooms in flight are finished. f runs on the caller of
// PeerDraining (a goroutine of the decode node): it must not block.
func WithPeerDraining(f func(peer, reason string)) Option {
	return func(o *options) { o.draining = append(o.draining, f) }
}

// WithRoomCancelled calls f when a decode peer cancels a room
// (Engine.CancelRoom, which decode.Client.Attach calls when the decode
// server gives the request up), with the peer's id, the room and the
// reason, once per room and peer: the serving stack abandons the request
// (Register refuses its chunks toward that peer with ErrRoomCancelled).
// f runs on the caller of CancelRoom before its Drop completes: it must not
// block.
func WithRoomCancelled(f func(peer string, room uint64, reason string)) Option {
	return func(o *options) { o.cancelled = append(o.cancelled, f) }
}
