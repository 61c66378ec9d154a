package trace

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/messages"
)

// Bounds on a trace header. A trace is input from a file someone handed
// over, and a replay sizes tables from its header (groups per chunk,
// submitter actors, pools): each bound is well above what a real
// deployment reaches and low enough that what a replay allocates from it
// stays small.
const (
	// MaxHookLayers bounds hook_layers: the deepest served models have a
	// few hundred layers (Llama 3 405B: 126), and a replay allocates one
	// entry per group for every chunk.
	MaxHookLayers = 4096
	// MaxBuffers bounds the buffers: a layer has a few tensors (K, V,
	// quantization scales), so four per hook layer.
	MaxBuffers = 4 * MaxHookLayers
	// MaxGroupSize bounds group_size: a group larger than the layers is
	// one group.
	MaxGroupSize = MaxHookLayers
	// MaxPageSize bounds page_size in tokens: serving stacks use 1 to 256.
	MaxPageSize = 1 << 16
	// MaxPages bounds a buffer's pages: 16 Mi pages hold 16 Mi tokens even
	// at page size 1, beyond the KV capacity of any single GPU.
	MaxPages = 1 << 24
	// MaxItemLen bounds a page's bytes in one buffer: 256 tokens of a
	// 64 KiB-per-token tensor is 16 MiB; 256 MiB leaves room.
	MaxItemLen = 1 << 28
	// MaxPoolBytes bounds the sum of item length × pages over the buffers
	// (and over a peer's): 4 TiB, ten times the memory of any GPU node's
	// KV pool. Each product is at most 2^52 and the sum is checked before
	// every addition, so it cannot wrap around.
	MaxPoolBytes = 1 << 42
	// MaxCPSize bounds cp_size: context-parallel groups have 2 to 64 ranks.
	MaxCPSize = 1024
	// MaxSubmitters bounds submitters: the engine defaults to 4, and an
	// engine replay spawns one actor per submitter.
	MaxSubmitters = 1024
	// MaxFinishTimeout bounds finish_timeout_ns: production uses seconds.
	MaxFinishTimeout = 24 * time.Hour
	// MaxDests bounds the decode destinations of one chunk (a record's
	// Dests, Dest, and a registration's infos): deployments send a chunk
	// to one or two; a core replay allocates one entry per destination.
	MaxDests = 256
	// MaxTry bounds a record's Try (which post of a Work a batch was): a
	// chunk re-sends a Work at most a few times (actors.ResendLimit).
	MaxTry = 7
	// MaxNameLen bounds names and identifiers (buffer and peer names, a
	// record's actor, id and type): they are short words, and a replay
	// prints them.
	MaxNameLen = 256
)

// Bounds on a trace's lines: the reader never holds more than one line,
// and never more than its bound.
const (
	// MaxHeaderLine bounds the header line: MaxBuffers buffers of names up
	// to MaxNameLen fit in about 5 MiB; real headers are a few KiB.
	MaxHeaderLine = 8 << 20
	// MinLineBound is the record line bound of the smallest geometry: a
	// record lists a few dozen fields and effects, typically under 4 KiB.
	MinLineBound = 1 << 20
	// lineBytesPerPage is what a record may spend per page of the largest
	// buffer: a registration lists its source pages and a destination list
	// of the request's pages, each page number up to eight digits and its
	// comma, and a few more lists of the same length in its effects.
	lineBytesPerPage = 36
	// MaxLine bounds every record line whatever the geometry: decoding a
	// line takes about ten times its size.
	MaxLine = 64 << 20
)

// LineBound is the longest record line a trace of this geometry can
// hold: MinLineBound plus room for page lists that cover the largest
// buffer, at most MaxLine. Call it on a validated configuration.
func (c *Config) LineBound() int {
	return min(MaxLine, MinLineBound+lineBytesPerPage*c.maxPages())
}

func (c *Config) maxPages() int {
	n := 0
	for _, b := range c.Buffers {
		n = max(n, b.Pages)
	}
	return n
}

// groups is the number of layer groups (Validate has bounded both).
func (c *Config) groups() int { return (c.HookLayers + c.GroupSize - 1) / c.GroupSize }

func headerErr(format string, args ...any) error {
	return errors.Newf("trace header: "+format, args...)
}

// within checks lo <= v <= hi for a header field.
func within(field string, v, lo, hi int64) error {
	switch {
	case v < lo && lo == 0:
		return headerErr("%s %d: negative", field, v)
	case v < lo:
		return headerErr("%s %d: must be at least %d", field, v, lo)
	case v > hi:
		return headerErr("%s %d: above the bound of %d", field, v, hi)
	}
	return nil
}

// Validate checks a header's configuration against the bounds above and
// the engine's own rules (ranges, the CP rule), before a replay allocates
// anything from it. Every error names the field and its value.
func (c *Config) Validate() error {
	for _, f := range []struct {
		name      string
		v, lo, hi int64
	}{
		{"hook_layers", int64(c.HookLayers), 1, MaxHookLayers},
		{"group_size", int64(c.GroupSize), 1, MaxGroupSize},
		{"page_size", int64(c.PageSize), 1, MaxPageSize},
		{"cp_size", int64(c.CPSize), 1, MaxCPSize},
		{"submitters", int64(c.Submitters), 1, MaxSubmitters},
		{"finish_timeout_ns", c.FinishTimeout, 0, int64(MaxFinishTimeout)},
		{"buffers", int64(len(c.Buffers)), 1, MaxBuffers},
	} {
		if err := within(f.name, f.v, f.lo, f.hi); err != nil {
			return err
		}
	}
	if c.CPRank < 0 || c.CPRank >= c.CPSize {
		return headerErr("cp_rank %d: must be in [0, %d) (cp_size)", c.CPRank, c.CPSize)
	}
	if _, err := cp.ParseRule(c.CPRule); err != nil {
		return headerErr("cp_rule %q: want shared or contiguous", Excerpt(c.CPRule, MaxNameLen))
	}
	var pool uint64
	for i, b := range c.Buffers {
		name := "buffer " + strconv.Itoa(i)
		if err := checkName(name+" name", b.Name); err != nil {
			return errors.Wrap(err, "trace header")
		}
		switch {
		case b.Layer < -MaxHookLayers || b.Layer > MaxHookLayers:
			return headerErr("%s (%s): layer %d: outside [-%d, %d]", name, b.Name, b.Layer, MaxHookLayers, MaxHookLayers)
		case b.ItemLen == 0:
			return headerErr("%s (%s): item_len 0: must be at least 1", name, b.Name)
		case b.ItemLen > MaxItemLen:
			return headerErr("%s (%s): item_len %d: above the bound of %d", name, b.Name, b.ItemLen, MaxItemLen)
		case b.Pages < 1:
			return headerErr("%s (%s): pages %d: must be at least 1", name, b.Name, b.Pages)
		case b.Pages > MaxPages:
			return headerErr("%s (%s): pages %d: above the bound of %d", name, b.Name, b.Pages, MaxPages)
		}
		// Both factors are bounded (2^28 × 2^24) and pool stays at most
		// 2^42 before each addition: no product or sum wraps around.
		pool += b.ItemLen * uint64(b.Pages)
		if pool > MaxPoolBytes {
			return headerErr("%s (%s): the buffers' item_len × pages reach %d bytes, above the bound of %d", name, b.Name, pool, uint64(MaxPoolBytes))
		}
	}
	if c.Sharding != nil {
		if err := c.Sharding.check("prefill"); err != nil {
			return errors.Wrap(err, "trace header: sharding")
		}
	}
	if c.Replicas < 0 || c.Replicas > int(reshard.FirstReplica) {
		return headerErr("replicas %d: want %d (spread) or %d (first)", c.Replicas, reshard.SpreadReplicas, reshard.FirstReplica)
	}
	return nil
}

// check validates a recorded side and rank with cp/reshard's own bounds.
func (s *Sharding) check(side string) error {
	if err := s.Side.Validate(side); err != nil {
		return err
	}
	return s.Side.ValidateRank(side, s.Rank)
}

// checkName bounds a name's length (it is printed) and refuses invalid
// UTF-8 and control characters: replay prints names raw, and a NUL or a
// terminal escape in an actor's id reached the terminal as such.
func checkName(field, s string) error {
	if len(s) > MaxNameLen {
		return errors.Newf("%s: %d bytes, above the bound of %d", field, len(s), MaxNameLen)
	}
	if !utf8.ValidString(s) {
		return errors.Newf("%s %q: not UTF-8", field, s)
	}
	if i := strings.IndexFunc(s, unicode.IsControl); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		return errors.Newf("%s %q: control character %U at byte %d", field, s, r, i)
	}
	return nil
}

// Name returns s as a trace records a name it was handed (a refused
// call's peer id): s itself when a trace can hold it, else s quoted in Go
// syntax (control characters and invalid UTF-8 escaped) and cut to fit
// MaxNameLen, so that what the engine writes its reader reads back.
func Name(s string) string {
	if checkName("", s) == nil {
		return s
	}
	q := strconv.Quote(s)
	if len(q) <= MaxNameLen {
		return q
	}
	// Excerpt's tail, "… (n bytes)", takes at most 30 bytes; a cut inside
	// an escape is harmless: it is a printable excerpt, not Go syntax.
	return Excerpt(q, MaxNameLen-30)
}

// CheckRecord validates a record against the header's geometry, before a
// replay sizes anything with it: the messages a replay feeds from outside
// decode, and their groups, destinations, pages and tokens are in range;
// façade calls decode and their page lists, infos and pools are bounded.
// The configuration must have passed Validate.
func (c *Config) CheckRecord(rec *Record) error {
	for _, f := range []struct{ name, v string }{{"actor", rec.Actor}, {"id", rec.ID}, {"type", rec.Type}, {"sender", rec.Sender}} {
		if err := checkName(f.name, f.v); err != nil {
			return err
		}
	}
	if rec.Actor == "" || rec.Type == "" {
		return errors.New("record without actor or type")
	}
	if rec.Actor == Engine {
		_, err := c.decodeCall(rec)
		return err
	}
	if !decodable(rec.Type) {
		return nil // compared as text, never decoded
	}
	msg, err := Decode(rec)
	if err != nil {
		return err
	}
	return c.checkMessage(msg)
}

// decodable says whether Decode knows a message type.
func decodable(typ string) bool {
	switch typ {
	case "AddChunk", "Finish", "Drop", "Begin", "Boundary", "End", "Submitted", "BatchDone", "Timeout", "TornDown", "Quiesced", "BatchOverdue", "Cancel":
		return true
	}
	return false
}

func (c *Config) checkMessage(msg any) error {
	maxTokens := MaxPages * c.PageSize // at most 2^40
	groups := c.groups()
	seq := func(s int) error {
		if s < messages.Rest || s >= groups {
			return errors.Newf("Seq %d: outside [%d, %d) (the header's groups)", s, messages.Rest, groups)
		}
		return nil
	}
	dest := func(d int) error {
		if d < 0 || d >= MaxDests {
			return errors.Newf("Dest %d: outside [0, %d)", d, MaxDests)
		}
		return nil
	}
	try := func(n int) error {
		if n < 0 || n > MaxTry {
			return errors.Newf("Try %d: outside [0, %d]", n, MaxTry)
		}
		return nil
	}
	switch m := msg.(type) {
	case *messages.AddChunk:
		switch {
		case m.Chunk.Start < 0 || m.Chunk.End < m.Chunk.Start || m.Chunk.End > maxTokens:
			return errors.Newf("Chunk %s: tokens outside [0, %d] (MaxPages × page_size)", ChunkID(m.Chunk), maxTokens)
		case m.Owned < 0 || m.Owned > MaxPages:
			return errors.Newf("Owned %d: outside [0, %d]", m.Owned, MaxPages)
		case m.Dests < 0 || m.Dests > MaxDests:
			return errors.Newf("Dests %d: outside [0, %d]", m.Dests, MaxDests)
		}
	case *messages.Finish:
		if m.Timeout < 0 {
			return errors.Newf("Timeout %d: negative", m.Timeout)
		}
	case *messages.Drop:
		if m.Timeout < 0 {
			return errors.Newf("Timeout %d: negative", m.Timeout)
		}
	case *messages.Boundary:
		if m.Group < 0 || m.Group >= groups {
			return errors.Newf("Group %d: outside [0, %d) (the header's groups)", m.Group, groups)
		}
	case *messages.Submitted:
		if m.Blocks < 0 {
			return errors.Newf("Blocks %d: negative", m.Blocks)
		}
		return errors.CombineErrors(seq(m.Seq), dest(m.Dest))
	case *messages.BatchDone:
		return errors.Join(seq(m.Seq), dest(m.Dest), try(m.Try))
	case *messages.BatchOverdue:
		return errors.Join(seq(m.Seq), dest(m.Dest), try(m.Try))
	case *messages.Quiesced:
		return errors.CombineErrors(seq(m.Seq), dest(m.Dest))
	}
	return nil
}

// DecodeCall rebuilds a façade call a replay re-issues (a *RegisterCall or
// an *AddPeerCall), checked against the header's geometry: page lists
// within the pool's bounds, at most MaxDests infos, a peer's pool within
// MaxPoolBytes. The configuration must have passed Validate.
func (c *Config) DecodeCall(rec *Record) (any, error) {
	call, err := c.decodeCall(rec)
	if err != nil {
		return nil, errors.Wrapf(err, "%s", rec.Where())
	}
	return call, nil
}

func (c *Config) decodeCall(rec *Record) (any, error) {
	switch rec.Type {
	case "RegisterCall":
		var call RegisterCall
		if err := remarshal(rec.Msg, &call); err != nil {
			return nil, errors.Wrap(err, "RegisterCall")
		}
		if err := registered(rec.Effects, &call); err != nil {
			return nil, errors.Wrap(err, "RegisterCall")
		}
		return &call, errors.Wrap(c.checkRegister(&call), "RegisterCall")
	case "AddPeerCall":
		var call AddPeerCall
		if err := remarshal(rec.Msg, &call); err != nil {
			return nil, errors.Wrap(err, "AddPeerCall")
		}
		return &call, errors.Wrap(checkAddPeer(&call), "AddPeerCall")
	case "RemovePeerCall":
		var call RemovePeerCall
		if err := remarshal(rec.Msg, &call); err != nil {
			return nil, errors.Wrap(err, "RemovePeerCall")
		}
		return &call, errors.Wrap(checkName("ID", call.ID), "RemovePeerCall")
	}
	return nil, nil // other engine records are not re-issued
}

// registered reads a RegisterCall record's outcome, its one Registered
// effect, into the call; none means the call did not return (the trace was
// taken while it was under way).
func registered(effects []string, call *RegisterCall) error {
	if len(effects) == 0 {
		return nil
	}
	name, body, ok := strings.Cut(effects[0], " ")
	if len(effects) != 1 || !ok || name != "Registered" {
		return errors.Newf("outcome %s: want one Registered effect", Excerpt(strings.Join(effects, "; "), 128))
	}
	var out Registered
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		return errors.Wrap(err, "its Registered effect")
	}
	call.PerLayer, call.Existing, call.Err, call.Plan = out.PerLayer, out.Existing, out.Err, out.Plan
	return nil
}

// CheckRegister validates a Register call against the header's geometry
// as a reader does: a writer checks a call with it before it records one.
// The configuration must have passed Validate.
func (c *Config) CheckRegister(call *RegisterCall) error { return c.checkRegister(call) }

func (c *Config) checkRegister(call *RegisterCall) error {
	maxPages := c.maxPages()
	maxTokens := MaxPages * c.PageSize // a request may span more than this rank's pool
	switch {
	case call.Start < 0 || call.End < call.Start || call.End > maxTokens:
		return errors.Newf("tokens [%d, %d): outside [0, %d] (MaxPages × page_size)", call.Start, call.End, maxTokens)
	case call.TotalPages < 0 || call.TotalPages > MaxPages:
		return errors.Newf("TotalPages %d: outside [0, %d]", call.TotalPages, MaxPages)
	case len(call.Infos) > MaxDests:
		return errors.Newf("%d infos: above the bound of %d", len(call.Infos), MaxDests)
	}
	if err := checkPages("SrcPages", call.SrcPages, maxPages); err != nil {
		return err
	}
	for i, in := range call.Infos {
		if err := checkName("info "+strconv.Itoa(i)+" Peer", in.Peer); err != nil {
			return err
		}
		if err := checkPages("info "+strconv.Itoa(i)+" DstPages", in.DstPages, MaxPages); err != nil {
			return err
		}
	}
	return checkName("Chunk", call.Chunk)
}

// checkPages checks a page list's length and every page against a pool of
// pages pages.
func checkPages(field string, list []int, pages int) error {
	if len(list) > pages {
		return errors.Newf("%s: %d pages, above the pool's %d", field, len(list), pages)
	}
	for i, p := range list {
		if p < 0 || p >= pages {
			return errors.Newf("%s[%d] %d: outside [0, %d)", field, i, p, pages)
		}
	}
	return nil
}

// Check validates an AddPeer call as a reader does: a writer checks a
// call with it before it records one, so that what it writes reads back.
func (call *AddPeerCall) Check() error { return checkAddPeer(call) }

func checkAddPeer(call *AddPeerCall) error {
	if err := checkName("ID", call.ID); err != nil {
		return err
	}
	if call.Sharding != nil {
		if err := call.Sharding.check("decode"); err != nil {
			return errors.Wrap(err, "Sharding")
		}
	}
	if len(call.ItemLen) > MaxBuffers || len(call.Pages) > MaxBuffers {
		return errors.Newf("%d item lengths and %d page counts: above the bound of %d buffers", len(call.ItemLen), len(call.Pages), MaxBuffers)
	}
	var pool uint64
	for i, p := range call.Pages {
		if p < 0 || p > MaxPages {
			return errors.Newf("Pages[%d] %d: outside [0, %d]", i, p, MaxPages)
		}
		var item uint64
		if i < len(call.ItemLen) {
			item = call.ItemLen[i]
		}
		if item > MaxItemLen {
			return errors.Newf("ItemLen[%d] %d: above the bound of %d", i, item, MaxItemLen)
		}
		pool += item * uint64(p) // at most 2^52 per buffer, the sum at most 2^42 before
		if pool > MaxPoolBytes {
			return errors.Newf("Pages[%d]: the peer's item length × pages reach %d bytes, above the bound of %d", i, pool, uint64(MaxPoolBytes))
		}
	}
	for i, n := range call.ItemLen {
		if n > MaxItemLen {
			return errors.Newf("ItemLen[%d] %d: above the bound of %d", i, n, MaxItemLen)
		}
	}
	return nil
}

func remarshal(from, to any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, to)
}

// Excerpt returns s if it has at most n bytes, else its first n bytes (cut
// at a character boundary) and how long s was: what a message prints of
// a value read from a trace, which may be megabytes long.
func Excerpt(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "… (" + strconv.Itoa(len(s)) + " bytes)"
}

// Remarshal decodes a recorded message (JSON as read) into a typed value,
// as the replays do with façade calls and submitters' Waited records.
func Remarshal(from, to any) error { return remarshal(from, to) }

// Unmarshal decodes one recorded effect's JSON as the reader decodes
// records (numbers kept exact), so that it compares equal to a record's
// message.
func Unmarshal(s string, v any) error {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	return dec.Decode(v)
}
