package twoproc

import (
	"bytes"
	"fmt"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/internal/testbed"
	"github.com/kvstream/kvstream/messages/wire"
	"go.uber.org/zap"
)

// DecodeSummary is what a decode process reports when its session ends.
type DecodeSummary struct {
	Chunks        int
	Failed        int // chunks the prefill reported not successful
	VerifiedPages uint64
	Mismatch      string
	// Lost says the prefill process went away before saying goodbye.
	Lost error
}

// OK reports whether every chunk succeeded and every page matched.
func (s DecodeSummary) OK() bool { return s.Lost == nil && s.Mismatch == "" && s.Failed == 0 }

// String is the decode process's one summary line.
func (s DecodeSummary) String() string {
	line := fmt.Sprintf("decode: %d chunks (%d not successful), %d pages verified, bytes equal: %v", s.Chunks, s.Failed, s.VerifiedPages, s.Mismatch == "")
	if s.Mismatch != "" {
		line += "; first mismatch: " + s.Mismatch
	}
	if s.Lost != nil {
		line += "; prefill lost: " + s.Lost.Error()
	}
	return line
}

// Decode is a decode process: one session with one prefill process.
type Decode struct {
	node *node
	tr   rdma.Transport
	log  *zap.Logger
	done chan DecodeSummary
	once sync.Once

	mu      sync.Mutex
	pool    *testbed.Decode
	seed    uint64
	summary DecodeSummary
	bye     bool // the prefill said goodbye: its leaving is no loss
}

// byeGrace bounds how long a decode process waits, after answering Bye, for
// the prefill to leave.
var byeGrace = callTimeout

// StartDecode listens on listen and serves one prefill session over tr.
func StartDecode(listen string, tr rdma.Transport, log *zap.Logger) (*Decode, error) {
	n, err := startNode(listen, log)
	if err != nil {
		return nil, err
	}
	d := &Decode{node: n, tr: tr, log: log, done: make(chan DecodeSummary, 1)}
	if _, err := n.system.Root.SpawnNamed(actor.PropsFromFunc(d.receive), DecodeActor); err != nil {
		n.stop()
		return nil, errors.Wrap(err, "spawn the decode actor")
	}
	return d, nil
}

// Addr is where the prefill process sends its Hello.
func (d *Decode) Addr() string { return d.node.Addr() }

// Wait returns the session's summary once the prefill said goodbye or was
// lost, or after timeout.
func (d *Decode) Wait(timeout time.Duration) (DecodeSummary, error) {
	select {
	case s := <-d.done:
		return s, nil
	case <-time.After(timeout):
		return DecodeSummary{}, errors.Newf("no prefill session ended within %v", timeout)
	}
}

// Close frees the pool and stops the node.
func (d *Decode) Close() {
	d.node.stop()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		_ = d.pool.Free()
		d.pool = nil
	}
}

func (d *Decode) end(lost error) {
	d.once.Do(func() {
		d.mu.Lock()
		s := d.summary
		s.Lost = lost
		d.mu.Unlock()
		d.done <- s
	})
}

func (d *Decode) receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *wire.Hello:
		offer := d.hello(m)
		if offer.Error == "" && m.SessionId != "" {
			// The prefill's session actor going away ends the session (the
			// request's sender is a short-lived future).
			ctx.Watch(actor.NewPID(m.SessionAddress, m.SessionId))
		}
		ctx.Respond(offer)
	case *wire.ChunkNotice:
		ctx.Respond(d.notice(m))
	case *wire.Bye:
		d.mu.Lock()
		s := d.summary
		d.bye = true
		d.mu.Unlock()
		ctx.Respond(&wire.Summary{Chunks: uint64(s.Chunks), VerifiedPages: s.VerifiedPages, Mismatch: s.Mismatch})
		// The reply is still queued in the endpoint writer: stopping the node
		// now would drop it. The session ends when the prefill, having read
		// it, leaves (Terminated below), or after a grace period.
		time.AfterFunc(byeGrace, func() { d.end(nil) })
	case *actor.Terminated:
		d.mu.Lock()
		bye := d.bye
		d.mu.Unlock()
		if bye {
			d.end(nil)
		} else {
			d.end(errors.Newf("%s terminated", m.Who))
		}
	}
}

func (d *Decode) hello(m *wire.Hello) *wire.Offer {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		return &wire.Offer{Error: "this decode process already serves a prefill"}
	}
	if len(m.Buffers) == 0 || m.Pages == 0 {
		return &wire.Offer{Error: fmt.Sprintf("hello with %d buffers of %d pages", len(m.Buffers), m.Pages)}
	}
	g := testbed.Geometry{ItemLen: m.Buffers[0].ItemLen, Pages: int(m.Pages)}
	for _, b := range m.Buffers {
		if b.ItemLen != g.ItemLen {
			return &wire.Offer{Error: fmt.Sprintf("buffer %s: item length %d, the others %d", b.Name, b.ItemLen, g.ItemLen)}
		}
		g.Names, g.Layers = append(g.Names, b.Name), append(g.Layers, int(b.Layer))
	}
	pool, err := testbed.NewDecode(d.tr, g)
	if err != nil {
		return &wire.Offer{Error: err.Error()}
	}
	d.pool, d.seed = pool, m.Seed
	d.log.Debug("decode pool ready", zap.String("prefill", m.Prefill), zap.Int("buffers", len(g.Layers)), zap.Uint64("pages", m.Pages))
	offer := &wire.Offer{PeerId: "decode", WorkerAddress: d.tr.Address()}
	for _, r := range pool.Regions {
		desc := r.Desc()
		offer.Regions = append(offer.Regions, &wire.Region{Addr: desc.Addr, Len: desc.Len, Key: desc.Key, ItemLen: g.ItemLen})
	}
	return offer
}

// notice verifies a finished chunk: every page it wrote must hold the
// model's bytes for its room, buffer and position.
func (d *Decode) notice(m *wire.ChunkNotice) *wire.NoticeAck {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.summary.Chunks++
	if m.Status != "SUCCESS" {
		d.summary.Failed++
		return &wire.NoticeAck{}
	}
	ack := &wire.NoticeAck{}
	if d.pool == nil || len(m.Positions) != len(m.DstPages) {
		ack.Mismatch = "a notice before the pool, or positions and pages of different lengths"
	} else {
		want := make([]byte, d.pool.ItemLen)
		for i, pos := range m.Positions {
			page := int(m.DstPages[i])
			if page < 0 || page >= d.pool.Pages {
				ack.Mismatch = fmt.Sprintf("room %d: decode page %d outside the pool", m.Room, page)
				break
			}
			for b := range d.pool.Layers {
				testbed.Fill(want, d.seed, m.Room, b, int(pos))
				if !bytes.Equal(want, d.pool.Page(b, page)) {
					ack.Mismatch = fmt.Sprintf("room %d position %d (decode page %d) buffer %s: bytes differ", m.Room, pos, page, d.pool.Names[b])
					break
				}
				ack.VerifiedPages++
			}
			if ack.Mismatch != "" {
				break
			}
		}
	}
	d.summary.VerifiedPages += ack.VerifiedPages
	if d.summary.Mismatch == "" {
		d.summary.Mismatch = ack.Mismatch
	}
	return ack
}
