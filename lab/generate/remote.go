package generate

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/tinylm"
	"github.com/kvstream/kvstream/system"
	"go.uber.org/zap"
)

// Spec is what a remote run tells its decode process, so that it can
// check the tokens of every room on its own: the model, the prompts (room
// r, from 1 to Requests, prefills RoomPrompt(r)), the tokens to decode and
// the page layout. lab/simsession carries it in the session's metadata.
type Spec struct {
	Model        string
	Seed         uint64
	Requests     int
	PromptTokens int
	NewTokens    int
	PageSize     int
	Order        reshard.Order
}

// Bounds of a remote run, and of what a decode process checks for one
// session (its Spec comes from the network): a room's check runs on the
// decode server's control plane (a few hundred milliseconds at these sizes).
const (
	MaxRemoteRequests     = 64
	MaxRemotePromptTokens = 2048
	MaxRemoteNewTokens    = 256
)

// Check validates a spec as a decode process must before it computes
// anything from it; errors are marked system.ErrBadInput and name the
// field.
func (s Spec) Check() error {
	cfg, err := tinylm.Preset(s.Model)
	if err != nil {
		return errors.Mark(err, system.ErrBadInput)
	}
	switch {
	case s.Requests < 1 || s.Requests > MaxRemoteRequests:
		return flagError("requests %d: must be within [1, %d]", s.Requests, MaxRemoteRequests)
	case s.PromptTokens < 1 || s.PromptTokens > MaxRemotePromptTokens:
		return flagError("prompt-tokens %d: must be within [1, %d]", s.PromptTokens, MaxRemotePromptTokens)
	case s.NewTokens < 1 || s.NewTokens > MaxRemoteNewTokens:
		return flagError("new-tokens %d: must be within [1, %d]", s.NewTokens, MaxRemoteNewTokens)
	case s.PageSize < 1 || s.PageSize > s.PromptTokens+s.NewTokens:
		return flagError("page-size %d: must be within [1, %d] (prompt and new tokens)", s.PageSize, s.PromptTokens+s.NewTokens)
	case s.Order != reshard.HeadMajor && s.Order != reshard.TokenMajor:
		return flagError("page-order %d: unknown", int(s.Order))
	}
	side := cfg.Side(1, nil, s.PageSize, s.Order)
	return errors.Mark(side.Validate("side"), system.ErrBadInput)
}

// Side is the page layout of the spec's model, unsharded.
func (s Spec) Side(m *tinylm.Model) reshard.Side {
	return m.Config().Side(1, nil, s.PageSize, s.Order)
}

// RoomPrompt is the prompt of room r: room 1's is `kvstream generate`'s
// for the same seed.
func (s Spec) RoomPrompt(m *tinylm.Model, room uint64) []int {
	return m.Prompt(s.Seed+room-1, s.PromptTokens)
}

// Decode is a remote run's decode side: a session with a decode process
// (lab/simsession's, over a decode.Client).
type Decode interface {
	// Open opens the session: the prefill pool's layout and the run's
	// spec go to the decode process; it returns the transport the prefill
	// engines write with and the decode pool as their peer. It returns
	// when ctx (the run's) ends.
	Open(ctx context.Context, geom testbed.Geometry, spec Spec) (rdma.Transport, system.Peer, error)
	// Notify tells the decode process that every prefill rank's Finish
	// returned for chunk spec (registered as spec on every rank), res
	// their results merged. Its error is the decode process's refusal or
	// verdict: a room whose tokens differ fails its last chunk.
	Notify(spec system.ChunkSpec, res system.Result) error
}

// RemoteRoom is one room of a remote run, as the prefill saw it.
type RemoteRoom struct {
	Room uint64 `json:"room"`
	// FirstToken is the prefill's pick after the prompt (with its top-1
	// margin); ModelFirstToken the model's own.
	FirstToken      int     `json:"first_token"`
	FirstMargin     float64 `json:"first_margin"`
	ModelFirstToken int     `json:"model_first_token"`
	// Decode is the decode process's answer to the room's notices that was
	// not OK (a token mismatch, a refused chunk), or "".
	Decode string `json:"decode,omitempty"`
	// Failed is the first chunk whose Finish did not succeed, or "".
	Failed string `json:"failed,omitempty"`
}

// OK reports whether the room's first token is the model's and the decode
// process accepted every chunk, its tokens included.
func (r *RemoteRoom) OK() bool {
	return r.FirstToken == r.ModelFirstToken && r.Decode == "" && r.Failed == ""
}

// RemoteReport is a remote run's outcome on the prefill side.
type RemoteReport struct {
	Model        string `json:"model"`
	Mode         string `json:"mode"`
	Requests     int    `json:"requests"`
	PromptTokens int    `json:"prompt_tokens"`
	NewTokens    int    `json:"new_tokens"`
	ChunkTokens  int    `json:"chunk_tokens"`
	PageSize     int    `json:"page_size"`
	Group        int    `json:"group"`
	CP           int    `json:"cp"`
	PageOrder    string `json:"page_order"`
	Plant        string `json:"plant,omitempty"`
	// TokensEqual: every room is OK (RemoteRoom.OK): the decode process
	// decoded the model's tokens from the KV it received, and the
	// prefill's first token is the model's.
	TokensEqual bool         `json:"tokens_equal"`
	Rooms       []RemoteRoom `json:"rooms"`
	// Chunks were notified to the decode process; FailedChunks of them
	// did not succeed on the prefill.
	Chunks       int `json:"chunks"`
	FailedChunks int `json:"failed_chunks"`
	// ForwardMs is the mean of a request's prefill on the CPU streams (its
	// first kernel's start to its last kernel's end); ExposedMs the mean of
	// its last Finish return minus that end.
	ForwardMs float64 `json:"forward_ms"`
	ExposedMs float64 `json:"exposed_ms"`
	// Bytes and Batches the chunks posted, over every rank.
	Bytes   uint64 `json:"bytes"`
	Batches int    `json:"batches"`
}

// remotePlants are the plants a remote run can commit: the others need a
// decode side sharded differently, or pages shared between rooms.
var remotePlants = map[Plant]bool{NoPlant: true, PlantChunkPositions: true, PlantRoPEOffset: true, PlantHooklessNotSent: true}

// checkRemote validates a remote run: unsharded on both sides (the decode
// process checks one pool), CP allowed.
func (c *Config) checkRemote(requests int) (geometry, error) {
	switch {
	case degree(c.PrefillTP) != 1 || degree(c.DecodeTP) != 1 || degree(c.PrefillPP) != 1 || degree(c.DecodePP) != 1:
		return geometry{}, flagError("--prefill-tp %d --decode-tp %d --prefill-pp %d --decode-pp %d: a tiny model runs unsharded across processes (kvstream generate shards it in one)",
			degree(c.PrefillTP), degree(c.DecodeTP), degree(c.PrefillPP), degree(c.DecodePP))
	case requests < 1 || requests > MaxRemoteRequests:
		return geometry{}, flagError("--requests %d: must be within [1, %d]", requests, MaxRemoteRequests)
	case c.PromptTokens > MaxRemotePromptTokens:
		return geometry{}, flagError("--prompt-tokens %d: a decode process checks at most %d", c.PromptTokens, MaxRemotePromptTokens)
	case c.NewTokens > MaxRemoteNewTokens:
		return geometry{}, flagError("--new-tokens %d: a decode process decodes at most %d", c.NewTokens, MaxRemoteNewTokens)
	case !remotePlants[c.Plant]:
		return geometry{}, flagError("plant %s: not across processes (it needs a sharded decode side or two requests on the same pages: kvstream generate)", c.Plant)
	}
	g, err := c.check()
	if err != nil {
		return g, err
	}
	// Every request has decode pages of its own (the decode process holds
	// a room's pages until it checked its tokens), scattered among as
	// many free ones; the prefill pool is as large (the decode process
	// sizes its pool from it), its pages reused request after request.
	g.poolPages = 2 * requests * g.reqPages
	return g, nil
}

// CheckRemote validates a remote run before anything is opened; errors are
// marked system.ErrBadInput and name the flag.
func CheckRemote(cfg Config, requests int) error {
	_, err := cfg.checkRemote(requests)
	return err
}

// RunRemote runs requests prompts of the tiny model through the prefill
// engines, one per CP rank, on CPU streams, the KV streamed (per layer
// group, or with perLayer false monolithically) over dec's transport into
// another process's decode pool, one room per request (rooms 1 to
// requests), and tells dec of every chunk once every rank finished it. The
// decode process decodes each room's tokens from its pool when the room's
// last chunk landed and answers that chunk's notice with its verdict. The
// prefill's own first token is compared with the model's here.
func RunRemote(ctx context.Context, cfg Config, requests int, dec Decode, perLayer bool, log *zap.Logger) (_ *RemoteReport, err error) {
	g, err := cfg.checkRemote(requests)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	m, err := tinylm.New(cfg.Model)
	if err != nil {
		return nil, err
	}
	r, err := newRig(cfg, g, m, log)
	if err != nil {
		return nil, err
	}
	spec := Spec{Model: cfg.Model.Name, Seed: cfg.Seed, Requests: requests, PromptTokens: cfg.PromptTokens,
		NewTokens: cfg.NewTokens, PageSize: cfg.PageSize, Order: cfg.PageOrder}
	rnd := rand.New(rand.NewPCG(cfg.Seed, 0xBB67AE8584CAA73B))
	dst := rnd.Perm(g.poolPages)
	reqs := make([]request, requests)
	for i := range reqs {
		room := uint64(i + 1)
		reqs[i] = request{room: room, prompt: spec.RoomPrompt(m, room), dst: dst[i*g.reqPages : (i+1)*g.reqPages]}
	}

	tr, peer, err := dec.Open(ctx, geometryOf(&g.pre, 0, g.poolPages), spec)
	if err != nil {
		return nil, err
	}
	peer.Sharding = &system.Sharding{Side: g.dec, Rank: reshard.Rank{}}
	var cleanup []func()
	defer func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}()
	p, err := r.newPrefill(ctx, func(string) (rdma.Transport, error) { return tr, nil }, []system.Peer{peer}, perLayer, &cleanup)
	if err != nil {
		return nil, err
	}
	defer p.stop()

	mode := "per-layer"
	if !perLayer {
		mode = "monolithic"
	}
	rep := &RemoteReport{Model: cfg.Model.Name, Mode: mode, Requests: requests, PromptTokens: cfg.PromptTokens, NewTokens: cfg.NewTokens,
		ChunkTokens: cfg.ChunkTokens, PageSize: cfg.PageSize, Group: cfg.GroupSize, CP: cfg.CP, PageOrder: cfg.PageOrder.String()}
	if cfg.Plant != NoPlant {
		rep.Plant = cfg.Plant.String()
	}
	for _, rq := range reqs {
		rep.Rooms = append(rep.Rooms, RemoteRoom{Room: rq.room})
	}
	n := &notifier{p: p, dec: dec, reqs: reqs, rep: rep, got: map[[2]int][]finish{}, lastRet: make([]time.Time, requests),
		notified: make(chan struct{}, requests*len(r.chunks)), quit: make(chan struct{}), exited: make(chan struct{})}
	go n.run()
	defer n.stop() // before the workers stop: they may be waiting for it
	for ri, rq := range reqs {
		for k := range r.chunks {
			step, err := p.forward(ctx, ri, k, rq, true)
			if err != nil {
				return nil, err
			}
			if step != nil {
				rep.Rooms[ri].FirstToken, rep.Rooms[ri].FirstMargin = step.Token, step.Margin
			}
			if cfg.Plant == PlantChunkPositions {
				// Each chunk registers as [0, its length): the previous
				// one, of the same key, must be finished first.
				n.until(ri, k)
			}
		}
		// The next request reuses the prefill pages: every rank must be
		// done reading them.
		n.until(ri, len(r.chunks)-1)
	}
	if err := p.sync(ctx); err != nil {
		return nil, err
	}
	p.stop()

	var fwd, exposed time.Duration
	for ri := range reqs {
		f, e, err := r.requestTiming(p, ri, n.lastRet[ri])
		if err != nil {
			return nil, err
		}
		fwd, exposed = fwd+f, exposed+e
	}
	rep.ForwardMs = ms(fwd) / float64(requests)
	rep.ExposedMs = ms(exposed) / float64(requests)
	rep.TokensEqual = true
	for ri, rq := range reqs {
		e, err := m.Expect(rq.prompt, 0)
		if err != nil {
			return nil, err
		}
		room := &rep.Rooms[ri]
		room.ModelFirstToken = e.First.Token
		rep.TokensEqual = rep.TokensEqual && room.OK()
	}
	return rep, nil
}

// notifier takes the ranks' finishes as they come and, once every rank
// finished a chunk, tells the decode process, merging their results (so
// that the decode process hears of a chunk as soon as it landed everywhere).
// Every rank finishes its chunks in order, so chunks complete in order.
type notifier struct {
	p    *prefill
	dec  Decode
	reqs []request
	// rep's rooms, chunk counts and bytes, and lastRet, are the notifier's
	// until the run saw every chunk notified.
	rep     *RemoteReport
	lastRet []time.Time // per request, its last chunk's last Finish return

	got      map[[2]int][]finish // (request, chunk) -> the ranks' finishes so far
	notified chan struct{}       // one per chunk notified, in order
	seen     int                 // chunks the run saw notified
	quit     chan struct{}
	exited   chan struct{}
}

// run notifies every chunk of every request, or stops at quit.
func (n *notifier) run() {
	defer close(n.exited)
	total := len(n.reqs) * len(n.p.r.chunks)
	for sent := 0; sent < total; {
		var f finish
		select {
		case f = <-n.p.finishes:
		case <-n.quit:
			return
		}
		key := [2]int{f.req, f.k}
		n.got[key] = append(n.got[key], f)
		if len(n.got[key]) < len(n.p.ranks) {
			continue
		}
		n.notify(n.got[key])
		delete(n.got, key)
		sent++
		n.notified <- struct{}{}
	}
}

// until waits until chunk k of request ri was notified.
func (n *notifier) until(ri, k int) {
	for ; n.seen <= ri*len(n.p.r.chunks)+k; n.seen++ {
		<-n.notified
	}
}

// stop ends run (after the notice in flight, if any).
func (n *notifier) stop() {
	select {
	case <-n.quit:
	default:
		close(n.quit)
	}
	<-n.exited
}

// notify merges one chunk's finishes (the first failure wins, bytes add
// up) and tells the decode process.
func (n *notifier) notify(fs []finish) {
	f0 := fs[0]
	rq, room := n.reqs[f0.req], &n.rep.Rooms[f0.req]
	res := f0.res
	res.Stats.Bytes = 0
	for _, f := range fs {
		if err := n.p.failed(f); err != nil && res.Status == system.Succeeded {
			res.Status, res.Err = system.Failed, err
			if f.err == nil {
				res.Status, res.Err = f.res.Status, f.res.Err
			}
			if room.Failed == "" {
				room.Failed = err.Error()
			}
		}
		res.Stats.Bytes += f.res.Stats.Bytes
		n.rep.Bytes += f.res.Stats.Bytes
		n.rep.Batches += f.res.Stats.Batches
		if f.k == len(n.p.r.chunks)-1 && f.ret.After(n.lastRet[f.req]) {
			n.lastRet[f.req] = f.ret
		}
	}
	if res.Status != system.Succeeded {
		n.rep.FailedChunks++
		if res.Err == nil {
			res.Err = errors.Newf("%s", res.Status)
		}
	}
	n.rep.Chunks++
	spec := n.p.r.spec(rq, f0.k, n.p.peers)
	res.Chunk.Room, res.Chunk.Start, res.Chunk.End = spec.Room, spec.Start, spec.End
	if err := n.dec.Notify(spec, res); err != nil && room.Decode == "" {
		room.Decode = err.Error()
	}
}

// requestTiming returns request ri's forward on the streams (its first
// kernel's start to the end of its last kernel on every stage) and its
// exposed transfer (lastRet, its last Finish return, minus that end).
func (r *rig) requestTiming(p *prefill, ri int, lastRet time.Time) (forward, exposed time.Duration, _ error) {
	lastChunk := len(r.chunks) - 1
	var end time.Time
	for st := 0; st < r.g.pre.PP(); st++ {
		_, hi := r.g.pre.StageLayers(st)
		s, ok := p.col.get(kernelName(ri, lastChunk, hi-1))
		if !ok {
			return 0, 0, errors.AssertionFailedf("no span for request %d's last kernel on stage %d", ri, st)
		}
		if s.End.After(end) {
			end = s.End
		}
	}
	s0, ok := p.col.get(kernelName(ri, 0, 0))
	if !ok {
		return 0, 0, errors.AssertionFailedf("no span for request %d's first kernel", ri)
	}
	return end.Sub(s0.Start), max(0, lastRet.Sub(end)), nil
}

// Text writes the report for people: one line, then one per room.
func (r *RemoteReport) Text(w io.Writer, transport string) {
	plant := ""
	if r.Plant != "" {
		plant = ", planted bug: " + r.Plant
	}
	fmt.Fprintf(w, "prefill: %s %s over %s, %d requests of %d prompt tokens in chunks of %d, page %d, K = %d, CP %d%s: %d chunks (%d failed), %.2f ms forward on CPU and %.3f ms exposed transfer per request (means), %d bytes in %d batches, tokens_equal: %v\n",
		r.Model, r.Mode, transport, r.Requests, r.PromptTokens, r.ChunkTokens, r.PageSize, r.Group, r.CP, plant,
		r.Chunks, r.FailedChunks, r.ForwardMs, r.ExposedMs, r.Bytes, r.Batches, r.TokensEqual)
	for _, room := range r.Rooms {
		fmt.Fprintf(w, "prefill: room %d: first token %d (margin %.3g), the model's %d", room.Room, room.FirstToken, room.FirstMargin, room.ModelFirstToken)
		if room.Failed != "" {
			fmt.Fprintf(w, "; chunk failed: %s", room.Failed)
		}
		if room.Decode != "" {
			fmt.Fprintf(w, "; decode: %s\n", room.Decode)
		} else {
			fmt.Fprintf(w, "; the decode process decoded the model's %d tokens\n", r.NewTokens)
		}
	}
}
