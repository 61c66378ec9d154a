package simsession

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// SeedKey is the session metadata key that carries the sim model's seed:
// what every page must hold.
const SeedKey = "kvstream-sim-seed"

// Decode is the sim's decode process: a decode.Server whose pool is sized
// by a prefill's Hello (and freed once no session holds it) and whose
// Verify checks the model's pattern.
type Decode struct {
	Server *decode.Server
	tr     rdma.Transport // allocates the pools where it can
	// DisconnectAfter, if positive, cuts a prefill off (Server.Disconnect)
	// once it reported that many verified chunks: a test hook for a decode
	// that really declared a prefill lost while it still writes
	// (DecodeProcessConfig.DisconnectAfter).
	DisconnectAfter int
	chunks          int

	mu       sync.Mutex
	pool     *testbed.Pool
	verified uint64
	mismatch string

	// tiny checks the tokens of the sessions of tiny models (tiny.go).
	tiny tinyChecks
}

// Option adds to a decode server's configuration.
type Option func(*decode.Config)

// WithObserver has the servers report to obs (decode.NewMetrics).
func WithObserver(obs decode.Observer) Option {
	return func(c *decode.Config) { c.Observer = obs }
}

// WithSessionBounds sets what one prefill session may make a server hold
// (decode.Config.MaxRoomsPerSession and MaxChunksPerRoom; 0: decode's
// default).
func WithSessionBounds(rooms, chunks int) Option {
	return func(c *decode.Config) { c.MaxRoomsPerSession, c.MaxChunksPerRoom = rooms, chunks }
}

// StartDecode serves prefill sessions on node over tr; the pool it sizes
// for a prefill holds at most maxPoolBytes.
// prefills, when set, are the certificate names of the prefills it serves.
func StartDecode(node *decode.Node, tr rdma.Transport, maxPoolBytes uint64, prefills []string, log *zap.Logger, opts ...Option) (*Decode, error) {
	d := &Decode{tr: tr}
	cfg := decode.Config{
		Admit:              d.admit,
		Size:               func(l []decode.PrefillBuffer) ([]decode.Buffer, error) { return d.size(l, maxPoolBytes) },
		Free:               d.free,
		MaxPoolBytes:       maxPoolBytes,
		Prefills:           prefills,
		AcceptUnknownRooms: true, // the sim's decode side does not schedule; it checks
		Verify:             d.verify,
		Log:                log,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := decode.New(node, tr, cfg)
	if err != nil {
		return nil, err
	}
	d.Server = srv
	return d, nil
}

// admit refuses a prefill that shards: its engines would write head
// slices and layer subsets into a pool sized as if they did not. The
// refusal reaches the prefill and the log; the process keeps serving, so
// that a prefill restarted with the right flags finds it (and so that no
// Hello can end it).
func (d *Decode) admit(_ string, md map[string]string) error {
	text, ok := md[ShardKey]
	if !ok {
		if tiny, ok := md[TinyKey]; ok {
			return admitTiny(tiny)
		}
		return nil
	}
	return errors.Mark(errors.Newf("the prefill shards (%.512s); this decode process was started without --prefill-tp/--decode-tp/--prefill-pp/--decode-pp: start it with the prefill's",
		text), system.ErrBadInput)
}

// size allocates a pool of the prefill's geometry, within the bound.
func (d *Decode) size(layout []decode.PrefillBuffer, maxBytes uint64) ([]decode.Buffer, error) {
	g := testbed.Geometry{ItemLen: layout[0].ItemLen}
	for i, b := range layout {
		if b.ItemLen != g.ItemLen || b.ItemLen == 0 {
			return nil, errors.Newf("buffer %d (%s): item length %d, buffer 0: %d", i, b.Name, b.ItemLen, g.ItemLen)
		}
		g.Names, g.Layers = append(g.Names, b.Name), append(g.Layers, b.Layer)
	}
	// The sim's destination pages are below the prefill pool's size: a
	// pool of that many pages, if it fits the bound.
	pages := layout[0].Pages
	if pages == 0 || pages > maxBytes/uint64(len(layout))/g.ItemLen {
		return nil, errors.Newf("%d buffers of %d pages of %d bytes: more than --max-pool-mib allows (%d bytes)", len(layout), pages, g.ItemLen, maxBytes)
	}
	g.Pages = int(pages)
	pool, err := testbed.NewPoolOn(d.tr, g)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.pool = pool
	d.mu.Unlock()
	return offerOf(pool), nil
}

// free takes back the pool the server no longer holds (no session, no
// page any peer may still write): the next prefill sizes its own.
func (d *Decode) free([]decode.Buffer) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pool != nil {
		_ = d.pool.Free()
		d.pool = nil
	}
	d.tiny.forget()
}

// offerOf is pool as the decode server offers it.
func offerOf(pool *testbed.Pool) []decode.Buffer {
	out := make([]decode.Buffer, pool.Buffers())
	for b := range out {
		out[b] = decode.Buffer{Name: pool.Names[b], Base: pool.Bases[b], ItemLen: pool.ItemLen, Pages: pool.Pages}
		if pool.Allocs != nil {
			out[b].Region = pool.Allocs[b] // registered by the transport that allocated it
		}
	}
	return out
}

// verify checks every page a successful chunk wrote: each must hold the
// model's bytes for its room, buffer and position.
func (d *Decode) verify(ss *decode.Session, c decode.Chunk) error {
	if _, ok := ss.Metadata()[TinyKey]; ok {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.tiny.verify(ss, c, d.pool)
	}
	seed, err := seedOf(ss)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	err = checkChunk(d.pool, c, &d.verified, &d.mismatch,
		func(want []byte, b, pos int) { testbed.Fill(want, seed, c.Room, b, pos) },
		func(pos, page int, buffer string) string {
			return fmt.Sprintf("room %d position %d (decode page %d) buffer %s: bytes differ", c.Room, pos, page, buffer)
		})
	if d.chunks++; d.DisconnectAfter > 0 && d.chunks == d.DisconnectAfter {
		// Not on the server's actor, which runs this.
		go func() {
			_ = d.Server.Disconnect(ss.Identity(), errors.Newf("cut off by a test hook (DisconnectAfter %d)", d.DisconnectAfter))
		}()
	}
	return err
}

// seedOf is the sim seed a session's prefill sent: what every page must
// hold follows from it.
func seedOf(ss *decode.Session) (uint64, error) {
	seed, err := strconv.ParseUint(ss.Metadata()[SeedKey], 10, 64)
	if err != nil {
		return 0, errors.Newf("the prefill %s sent no sim seed (%s): its pages cannot be checked", ss.Prefill(), SeedKey)
	}
	return seed, nil
}

// checkChunk compares every page c wrote into pool with what fill writes
// for its buffer and position, counting the pages that match in verified;
// the first that does not is returned, named by where, and kept in
// mismatch if that is still empty. The caller holds the pool's lock.
func checkChunk(pool *testbed.Pool, c decode.Chunk, verified *uint64, mismatch *string,
	fill func(want []byte, b, pos int), where func(pos, page int, buffer string) string) error {
	want := make([]byte, pool.ItemLen)
	for i, pos := range c.Positions {
		for b := range pool.Layers {
			fill(want, b, pos)
			if !bytes.Equal(want, pool.Page(b, c.DstPages[i])) {
				msg := where(pos, c.DstPages[i], pool.Names[b])
				if *mismatch == "" {
					*mismatch = msg
				}
				return errors.New(msg)
			}
			*verified++
		}
	}
	return nil
}

// Servers is its one server, as ShardedDecode's are listed.
func (d *Decode) Servers() []*decode.Server { return []*decode.Server{d.Server} }

// Serve serves prefill sessions until ctx ends or cfg.Runs of them did
// something, then drains (see ServeConfig); the caller closes.
func (d *Decode) Serve(ctx context.Context, cfg ServeConfig) DecodeSummary {
	d.tiny.setOnRoom(cfg.OnRoom)
	on := cfg.OnSession
	cfg.OnSession = func(e SessionEnd) {
		d.tiny.ended(e.session)
		if on != nil {
			on(e)
		}
	}
	s := serve(ctx, []*decode.Server{d.Server}, cfg, d.Verified)
	s.Tokens = d.tiny.summary()
	return s
}

// Close closes the server, which frees the pool once no prefill can
// write it. When that cannot be confirmed (decode.ErrNotQuiesced) the pool
// stays mapped: the caller closes the transport before it exits.
func (d *Decode) Close(ctx context.Context) error {
	err := d.Server.Close(ctx)
	d.tiny.wg.Wait()
	return err
}
