package system

import (
	"io"
	"os"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/messages"
	"github.com/kvstream/kvstream/plan"
	"github.com/kvstream/kvstream/trace"
)

// EnvTrace names a file the engine writes its message trace to when it
// closes: tracing on, without a code change, for a production incident.
const EnvTrace = "KVSTREAM_TRACE"

// Version is the engine version written into traces.
const Version = "0.1.0"

// WithTrace records a message trace (see package trace) and writes it to w
// when the engine closes (and on DumpTrace). The trace keeps the last
// capacity records (0: trace.DefaultCapacity), so a long run cannot fill a
// disk. Without this option (and without KVSTREAM_TRACE) nothing is
// recorded and the actors carry no recording middleware at all.
func WithTrace(w io.Writer, capacity int) Option {
	return func(o *options) { o.traceTo, o.traceCap = w, capacity }
}

func (e *Engine) startTrace(o *options, getenv func(string) string) error {
	path := strings.TrimSpace(getenv(EnvTrace))
	if o.traceTo == nil && path == "" {
		return nil
	}
	if err := e.checkTraceable(); err != nil {
		return err // before the file is created
	}
	if o.traceTo == nil {
		f, err := os.Create(path)
		if err != nil {
			return errors.Mark(errors.Wrapf(err, "%s=%q", EnvTrace, path), ErrBadInput)
		}
		o.traceTo, e.traceFile = f, f
	}
	e.traceTo, e.traceCfg = o.traceTo, e.traceConfig()
	e.trace = trace.NewRecorder(o.traceCap, trace.Header{EngineVersion: Version, Config: e.traceCfg})
	return nil
}

// checkTraceable refuses a configuration whose trace header the trace's
// reader would refuse (a group size above trace.MaxGroupSize, a buffer
// name with a control character): an engine asked to trace checks it
// before it starts, rather than write a trace nobody can read. Without a
// trace such a configuration is the engine's own business.
func (e *Engine) checkTraceable() error {
	c := e.traceConfig()
	if err := c.Validate(); err != nil {
		return errors.Mark(errors.Wrap(err, "tracing is on, and the configuration is outside what a trace records"), ErrBadInput)
	}
	return nil
}

func (e *Engine) traceConfig() trace.Config {
	c := trace.Config{HookLayers: e.cfg.HookLayers, GroupSize: e.cfg.GroupSize, PageSize: e.cfg.PageSize,
		CPSize: e.cfg.CP.Size, CPRank: e.cfg.CP.Rank, CPRule: e.cfg.CP.Rule.String(), Submitters: e.cfg.Submitters,
		FinishTimeout: int64(e.cfg.FinishTimeout), PerLayer: !e.cfg.DisablePerLayer, SingleDestination: e.cfg.SingleDestinationPerLayer}
	for _, b := range e.cfg.Buffers {
		c.Buffers = append(c.Buffers, trace.BufferGeometry{Name: b.Name, Layer: b.Layer, ItemLen: b.ItemLen, Pages: b.Pages})
	}
	if sh := e.cfg.Sharding; sh != nil {
		c.Sharding = &trace.Sharding{Side: sh.Side, Rank: sh.Rank}
		c.Replicas = int(e.cfg.Replicas)
	}
	return c
}

// DumpTrace writes the message trace recorded so far; an error if the
// engine does not trace.
func (e *Engine) DumpTrace(w io.Writer) error {
	if e.trace == nil {
		return errors.New("tracing is off: start the engine WithTrace or with " + EnvTrace)
	}
	return e.trace.Dump(w)
}

// registerCall is a registration as a trace records it.
func registerCall(spec *ChunkSpec, chunk messages.Chunk) *trace.RegisterCall {
	c := &trace.RegisterCall{Room: spec.Room, Start: spec.Start, End: spec.End, Last: spec.Last, SrcPages: spec.SrcPages,
		TotalPages: spec.TotalPages}
	if chunk.Serial != 0 {
		c.Chunk = trace.ChunkID(chunk)
	}
	for _, in := range spec.Infos {
		c.Infos = append(c.Infos, trace.InfoCall{Peer: in.Peer, DstPages: in.DstPages, Dummy: in.Dummy})
	}
	return c
}

// traceableRegister refuses, when the engine traces, a registration that
// plan.BuildPlan took but that a trace cannot hold (more decode infos than
// trace.MaxDests): the trace's reader would refuse the whole trace, and a
// replay needs every registration that added a chunk. Without a trace
// such a registration is taken.
func (e *Engine) traceableRegister(spec *ChunkSpec) error {
	if e.trace == nil {
		return nil
	}
	if err := e.traceCfg.CheckRegister(registerCall(spec, messages.Chunk{})); err != nil {
		return badInput("room %d chunk %d: outside what the engine's trace records (tracing is on): %v", spec.Room, spec.Start, err)
	}
	return nil
}

// traceBeginRegister records a registration before its chunk is added
// (traceableRegister took it): a replay builds the chunk's plan from it
// when the manager's AddChunk comes. Its outcome is the record's effect
// (traceRegister).
func (e *Engine) traceBeginRegister(spec *ChunkSpec, chunk messages.Chunk) (trace.Slot, bool) {
	if e.trace == nil {
		return trace.Slot{}, false
	}
	return e.trace.Begin(trace.Engine, "engine", "", registerCall(spec, chunk)), true
}

// traceRegister records a registration's outcome: as the effect of the
// record traceBeginRegister began, or as a record of its own for one that
// added no chunk (refused, or found registered).
func (e *Engine) traceRegister(spec *ChunkSpec, reg Registration, err error, slot trace.Slot, begun bool, p *plan.Plan) {
	if e.trace == nil {
		return
	}
	out := trace.Registered{PerLayer: reg.Mode == PerLayer, Existing: reg.Existing}
	if p != nil {
		out.Plan = p.Digest()
	}
	if err != nil {
		out.Err = trace.Excerpt(err.Error(), maxTracedErr)
	}
	effects := trace.Effects([]any{out})
	if !begun {
		call := registerCall(spec, reg.Chunk)
		if e.traceCfg.CheckRegister(call) != nil {
			// Refused for what a trace cannot hold (a page number beyond
			// any pool, a peer's name with a control character): its room
			// and error only. A replay re-issues only the registrations
			// that added a chunk.
			call = &trace.RegisterCall{Room: spec.Room, Last: spec.Last}
		}
		slot = e.trace.Begin(trace.Engine, "engine", "", call)
	}
	e.trace.Finish(slot, effects)
}

func (e *Engine) traceAddPeer(p *Peer, err error) {
	if e.trace == nil {
		return
	}
	if err != nil {
		// Refused: its error, and not the geometry it was refused for (a
		// region of 2^62 pages, a million buffers), which the trace's
		// reader refuses as it refuses such a peer. A replay re-issues
		// only the AddPeers that succeeded.
		e.trace.Add(trace.Engine, "engine", "", &trace.AddPeerCall{ID: trace.Name(p.ID), Err: trace.Excerpt(err.Error(), maxTracedErr)}, nil)
		return
	}
	e.trace.Add(trace.Engine, "engine", "", addPeerCall(p), nil) // checked by traceable
}

// addPeerCall is AddPeer of p, which plan.ResolvePeer took (its regions
// are whole pages), as a trace records it.
func addPeerCall(p *Peer) *trace.AddPeerCall {
	c := &trace.AddPeerCall{ID: p.ID}
	if p.Sharding != nil {
		c.Sharding = &trace.Sharding{Side: p.Sharding.Side, Rank: p.Sharding.Rank}
	}
	for _, b := range p.Buffers {
		c.ItemLen = append(c.ItemLen, b.ItemLen)
		c.Pages = append(c.Pages, int(b.Region.Len/b.ItemLen))
	}
	return c
}

// traceable refuses, when the engine traces, a peer that plan.ResolvePeer
// took but whose AddPeer a trace cannot hold (an id with a control
// character, a decode pool above trace.MaxPoolBytes): the trace's reader
// would refuse the whole trace. Without a trace such a peer is taken.
func (e *Engine) traceable(p *Peer) error {
	if e.trace == nil {
		return nil
	}
	if err := addPeerCall(p).Check(); err != nil {
		return badInput("peer %q: outside what the engine's trace records (tracing is on): %v", trace.Excerpt(p.ID, trace.MaxNameLen), err)
	}
	return nil
}

// maxTracedErr bounds a refused call's error as a trace records it: the
// error may quote what the caller handed over (an id of megabytes), and a
// record line must stay within the reader's bound.
const maxTracedErr = 4096

func (e *Engine) traceRemovePeer(id string, err error) {
	if e.trace == nil {
		return
	}
	c := &trace.RemovePeerCall{ID: id} // a peer removed was added, and so named as a trace can hold
	if err != nil {
		c.ID, c.Err = trace.Name(id), trace.Excerpt(err.Error(), maxTracedErr)
	}
	e.trace.Add(trace.Engine, "engine", "", c, nil)
}

// closeTrace writes the trace at Close.
func (e *Engine) closeTrace() error {
	if e.trace == nil {
		return nil
	}
	err := e.trace.Dump(e.traceTo)
	if e.traceFile != nil {
		err = errors.CombineErrors(err, e.traceFile.Close())
		e.traceFile = nil
	}
	return err
}
