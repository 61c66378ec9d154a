package decode

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/decode/internal/core"
	"github.com/kvstream/kvstream/trace"
	"go.uber.org/zap"
)

// EnvTrace names the environment variable that turns a Server's message
// trace on without a code change, for a production incident: the same
// variable the prefill engine reads (system.EnvTrace). A Server writes to
// its value with TraceSuffix appended, so that an engine and a Server in
// one process never write the same file (see Config.TracePath for the
// names several Servers get).
const EnvTrace = "KVSTREAM_TRACE"

// TraceSuffix is appended to EnvTrace's path for a Server's trace.
const TraceSuffix = ".decode"

// version is kvstream's version, written into traces (the engine's
// system.Version; a test holds them equal).
const version = "0.1.0"

// tracePaths are the trace files the Servers of this process write, so
// that no two write one file: a path another Server already claimed gets a
// number appended. A claim lasts as long as the process, so that a Server
// started after another closed does not overwrite its trace either.
var tracePaths = struct {
	sync.Mutex
	taken map[string]bool
}{taken: map[string]bool{}}

// maxTraceFiles bounds the numbers tried for one path.
const maxTraceFiles = 1000

// claimTracePath returns path, or path.N for the first N from 2 that no
// Server of this process writes, and claims it.
func claimTracePath(path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	tracePaths.Lock()
	defer tracePaths.Unlock()
	for n := 1; n <= maxTraceFiles; n++ {
		p, key := path, abs
		if n > 1 {
			p, key = path+"."+strconv.Itoa(n), abs+"."+strconv.Itoa(n)
		}
		if !tracePaths.taken[key] {
			tracePaths.taken[key] = true
			return p, nil
		}
	}
	return "", errors.Newf("%d Servers of this process already write traces named after %q", maxTraceFiles, path)
}

// startTrace installs the recorder when Config.Trace, Config.TracePath or
// EnvTrace asks for one; without, the Server records nothing and its
// actor pays one nil check per message.
func (s *Server) startTrace(cfg Config, actor string, rules core.Rules, pool []Buffer, getenv func(string) string) error {
	if cfg.Trace != nil && cfg.TracePath != "" {
		return badInput("Config.Trace and Config.TracePath %q: set one of them", cfg.TracePath)
	}
	if cfg.TraceCapacity < 0 {
		return badInput("TraceCapacity %d: must not be negative", cfg.TraceCapacity)
	}
	s.traceTo = cfg.Trace
	path, field := cfg.TracePath, "Config.TracePath"
	if s.traceTo == nil && path == "" {
		if env := strings.TrimSpace(getenv(EnvTrace)); env != "" {
			path, field = env+TraceSuffix, EnvTrace
		}
	}
	if path != "" {
		if cfg.Name != "" {
			path += "-" + cfg.Name // one file per Server of a process
		}
		p, err := claimTracePath(path)
		if err != nil {
			return errors.Mark(errors.Wrapf(err, "%s", field), ErrBadInput)
		}
		f, err := os.Create(p)
		if err != nil {
			return errors.Mark(errors.Wrapf(err, "%s: the trace file", field), ErrBadInput)
		}
		s.traceTo, s.traceFile = f, f
		s.log.Info("decode server records its message trace, written at Close", zap.String("server", s.key), zap.String("path", p))
	}
	if s.traceTo == nil {
		return nil
	}
	s.traceID = actor
	s.rec = trace.NewRecorder(cfg.TraceCapacity, trace.Header{EngineVersion: version, Side: trace.SideDecode, Decode: traceConfig(actor, rules, pool)})
	return nil
}

// traceConfig is the header of a Server's trace: the rules its core runs
// under, and the pool's geometry when it was given one at New.
func traceConfig(actor string, r core.Rules, pool []Buffer) *trace.DecodeConfig {
	c := &trace.DecodeConfig{Server: actor, MaxSessions: r.MaxSessions, MaxRoomsPerSession: r.MaxRoomsPerSession, Prefills: r.Prefills,
		TLS: r.TLS, PageSize: r.PageSize, RoomTimeout: int64(r.RoomTimeout), ByeGrace: int64(r.ByeGrace), AcceptUnknownRooms: r.AcceptUnknownRooms,
		Admit: r.Admit, Verify: r.Verify, Size: r.Size, MaxPoolBytes: r.MaxPoolBytes, MaxChunksPerRoom: r.MaxChunksPerRoom}
	if g := r.Group; g != nil {
		c.Group = &trace.DecodeGroup{Size: g.Size, Rule: g.Rule.String(), PageSize: g.PageSize}
	}
	for _, b := range pool {
		c.Pool = append(c.Pool, trace.BufferGeometry{Name: b.Name, ItemLen: b.ItemLen, Pages: b.Pages})
	}
	return c
}

// step steps the core with m and records it, with the effects, when the
// Server traces. Only the actor calls it.
func (s *Server) step(m core.Msg) []core.Effect {
	effs := s.core.Step(m)
	if s.rec != nil {
		s.rec.AddEncoded(trace.DecodeActor, s.traceID, core.MsgType(m), core.EncodeMsg(m), core.EffectLines(effs))
	}
	return effs
}

// DumpTrace writes the message trace recorded so far (a Server records
// with Config.Trace, Config.TracePath or EnvTrace; otherwise this is an
// error marked ErrBadInput): for example from a debug endpoint while rooms
// hang. The snapshot is taken on the Server's actor, between two messages,
// so that no Call is cut from its result.
func (s *Server) DumpTrace(w io.Writer) error {
	if s.rec == nil {
		return public(badInput("tracing is off: set Config.Trace, Config.TracePath or %s", EnvTrace))
	}
	var t *trace.Trace
	if err := s.inActor(context.Background(), func() { t = s.rec.Snapshot() }); err != nil {
		t = s.rec.Snapshot() // stopped: nothing records any more
	}
	return trace.Write(w, t)
}

// closeTrace writes the trace at Close, once the actor stopped, and closes
// the file it opened.
func (s *Server) closeTrace() error {
	if s.rec == nil || s.traceTo == nil {
		return nil
	}
	err := errors.Wrap(s.rec.Dump(s.traceTo), "write the decode server's trace")
	if s.traceFile != nil {
		err = errors.CombineErrors(err, s.traceFile.Close())
		s.traceFile = nil
	}
	s.traceTo = nil
	return err
}

// dropTrace closes and removes a trace file New opened when New fails: no
// message was recorded.
func (s *Server) dropTrace() {
	if s.traceFile != nil {
		name := s.traceFile.Name()
		_ = s.traceFile.Close()
		_ = os.Remove(name)
		s.traceFile = nil
	}
}
