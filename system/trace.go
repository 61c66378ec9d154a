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
	if o.traceTo == nil {
		if path := strings.TrimSpace(getenv(EnvTrace)); path != "" {
			f, err := os.Create(path)
			if err != nil {
				return errors.Mark(errors.Wrapf(err, "%s=%q", EnvTrace, path), ErrBadInput)
			}
			o.traceTo, e.traceFile = f, f
		}
	}
	if o.traceTo == nil {
		return nil
	}
	e.traceTo = o.traceTo
	e.trace = trace.NewRecorder(o.traceCap, trace.Header{EngineVersion: Version, Config: e.traceConfig()})
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

// traceBeginRegister records a registration before its chunk is added: a
// replay builds the chunk's plan from it when the manager's AddChunk comes.
// Its outcome is the record's effect (traceRegister).
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
		out.Err = err.Error()
	}
	effects := trace.Effects([]any{out})
	if !begun {
		slot = e.trace.Begin(trace.Engine, "engine", "", registerCall(spec, reg.Chunk))
	}
	e.trace.Finish(slot, effects)
}

func (e *Engine) traceAddPeer(p *Peer, err error) {
	if e.trace == nil {
		return
	}
	c := &trace.AddPeerCall{ID: p.ID}
	if p.Sharding != nil {
		c.Sharding = &trace.Sharding{Side: p.Sharding.Side, Rank: p.Sharding.Rank}
	}
	for _, b := range p.Buffers {
		c.ItemLen = append(c.ItemLen, b.ItemLen)
		if b.ItemLen > 0 {
			c.Pages = append(c.Pages, int(b.Region.Len/b.ItemLen))
		}
	}
	if err != nil {
		c.Err = err.Error()
	}
	e.trace.Add(trace.Engine, "engine", "", c, nil)
}

func (e *Engine) traceRemovePeer(id string, err error) {
	if e.trace == nil {
		return
	}
	c := &trace.RemovePeerCall{ID: id}
	if err != nil {
		c.Err = err.Error()
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
