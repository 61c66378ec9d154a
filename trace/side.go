package trace

import (
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp"
)

// Sides: which process recorded a trace. An engine's trace (the prefill
// side) has no side in its header, as before sides were recorded.
const (
	// SideDecode is a decode server's trace (package decode): its records
	// are the messages its core took, with the effects it returned.
	SideDecode = "decode"
)

// DecodeActor is the actor kind of a decode trace's records: the server's
// actor, which delivers every message to its core. A record's id is the
// server's actor name (DecodeConfig.Server).
const DecodeActor = "decode"

// Bounds on a decode trace's header. A decode replay allocates nothing per
// session or room up front; these keep the numbers it prints and compares
// within what a deployment configures.
const (
	// MaxDecodeSessions bounds max_sessions (decode defaults to 64).
	MaxDecodeSessions = 1 << 16
	// MaxDecodeRooms bounds max_rooms_per_session (decode defaults to
	// 4096).
	MaxDecodeRooms = 1 << 24
	// MaxDecodeChunks bounds max_chunks_per_room (decode defaults to
	// 8192).
	MaxDecodeChunks = 1 << 24
	// MaxDecodePrefills bounds the prefill identities a server serves.
	MaxDecodePrefills = 1 << 12
	// MaxDecodePageSize bounds page_size and a group's page size in tokens:
	// the decode core's own bound on a Hello's page size.
	MaxDecodePageSize = 1 << 20
	// MaxDecodeTimeout bounds room_timeout_ns and bye_grace_ns: servers
	// configure seconds to minutes.
	MaxDecodeTimeout = 7 * 24 * time.Hour
)

// DecodeConfig is what a replay needs of a decode server's configuration:
// the rules its core ran under (package decode's Config, defaults
// applied), and the pool when the server was given one at its start.
type DecodeConfig struct {
	// Server is the server's actor name on its node: every record's id.
	Server             string       `json:"server"`
	MaxSessions        int          `json:"max_sessions"`
	MaxRoomsPerSession int          `json:"max_rooms_per_session"`
	MaxChunksPerRoom   int          `json:"max_chunks_per_room,omitempty"` // 0: recorded before the bound; a replay applies decode's default
	Prefills           []string     `json:"prefills,omitempty"`
	TLS                bool         `json:"tls,omitempty"`
	Group              *DecodeGroup `json:"group,omitempty"`
	PageSize           int          `json:"page_size,omitempty"`
	RoomTimeout        int64        `json:"room_timeout_ns,omitempty"`
	ByeGrace           int64        `json:"bye_grace_ns"`
	AcceptUnknownRooms bool         `json:"accept_unknown_rooms,omitempty"`
	// Admit, Verify and Size say that the server had those callbacks: the
	// core then asks for their verdicts, which the trace records as the
	// messages that answer its Calls.
	Admit        bool   `json:"admit,omitempty"`
	Verify       bool   `json:"verify,omitempty"`
	Size         bool   `json:"size,omitempty"`
	MaxPoolBytes uint64 `json:"max_pool_bytes"`
	// Pool is the pool's geometry (names, item lengths, pages; addresses
	// are left out) when the server was given one at its start; empty when
	// a Hello sizes it (the pool is then in the record that answers the
	// core's CallSize).
	Pool []BufferGeometry `json:"pool,omitempty"`
}

// DecodeGroup is a decode server's CP group (decode.Group): its ranks, the
// rule that splits a request's pages among them, and its page size.
type DecodeGroup struct {
	Size     int    `json:"size"`
	Rule     string `json:"rule"`
	PageSize int    `json:"page_size"`
}

// Validate checks a header before anything is sized from it: an engine's
// configuration (Config.Validate), or a decode server's (side "decode",
// DecodeConfig.Validate). Every error names the field and its value.
func (h *Header) Validate() error {
	switch h.Side {
	case "":
		if h.Decode != nil {
			return headerErr("decode: a decode configuration in an engine's trace (no side)")
		}
		return h.Config.Validate()
	case SideDecode:
		if h.Decode == nil {
			return headerErr("side %q without its decode configuration", h.Side)
		}
		if !h.Config.zero() {
			return headerErr("config: an engine configuration in a decode trace")
		}
		return h.Decode.Validate()
	}
	return headerErr("side %q: want %q or none (an engine's)", Excerpt(h.Side, MaxNameLen), SideDecode)
}

func (c *Config) zero() bool {
	return c.HookLayers == 0 && c.GroupSize == 0 && c.PageSize == 0 && c.CPSize == 0 && c.CPRank == 0 && c.CPRule == "" &&
		c.Submitters == 0 && c.FinishTimeout == 0 && !c.PerLayer && !c.SingleDestination && len(c.Buffers) == 0 && c.Sharding == nil && c.Replicas == 0
}

// LineBound is the longest record line a trace of this header can hold
// (call it on a validated header): an engine's follows its geometry
// (Config.LineBound); a decode trace's is MaxLine, since its records hold
// messages as the network delivered them (a chunk notice's page lists, up
// to the node's message limit, several times longer as text) and the
// rooms' page lists in their effects.
func (h *Header) LineBound() int {
	if h.Side == SideDecode {
		return MaxLine
	}
	return h.Config.LineBound()
}

// CheckRecord checks a record against its header (call it on a validated
// header): an engine's record against the geometry (Config.CheckRecord); a
// decode record's names (its message is checked as the decode replay
// decodes it, by package decode, which knows its types).
func (h *Header) CheckRecord(rec *Record) error {
	if h.Side == SideDecode {
		return checkNames(rec)
	}
	return h.Config.CheckRecord(rec)
}

// checkNames bounds a record's names and refuses a record without actor or
// type.
func checkNames(rec *Record) error {
	for _, f := range []struct{ name, v string }{{"actor", rec.Actor}, {"id", rec.ID}, {"type", rec.Type}, {"sender", rec.Sender}} {
		if err := checkName(f.name, f.v); err != nil {
			return err
		}
	}
	if rec.Actor == "" || rec.Type == "" {
		return errors.New("record without actor or type")
	}
	return nil
}

// Validate checks a decode trace's configuration against the bounds above
// and the decode core's own rules (a group's size and rule, a pool's
// geometry), before a replay builds a core from it. Every error names the
// field and its value.
func (c *DecodeConfig) Validate() error {
	if err := checkName("decode server", c.Server); err != nil {
		return errors.Wrap(err, "trace header")
	}
	if c.Server == "" {
		return headerErr("decode server: empty (the records' id)")
	}
	for _, f := range []struct {
		name      string
		v, lo, hi int64
	}{
		{"max_sessions", int64(c.MaxSessions), 1, MaxDecodeSessions},
		{"max_rooms_per_session", int64(c.MaxRoomsPerSession), 1, MaxDecodeRooms},
		{"max_chunks_per_room", int64(c.MaxChunksPerRoom), 0, MaxDecodeChunks},
		{"prefills", int64(len(c.Prefills)), 0, MaxDecodePrefills},
		{"page_size", int64(c.PageSize), 0, MaxDecodePageSize},
		{"room_timeout_ns", c.RoomTimeout, 0, int64(MaxDecodeTimeout)},
		{"bye_grace_ns", c.ByeGrace, 0, int64(MaxDecodeTimeout)},
		{"pool", int64(len(c.Pool)), 0, MaxBuffers},
	} {
		if err := within(f.name, f.v, f.lo, f.hi); err != nil {
			return err
		}
	}
	if c.MaxPoolBytes == 0 {
		return headerErr("max_pool_bytes 0: must be at least 1")
	}
	for i, p := range c.Prefills {
		if err := checkName("prefill "+strconv.Itoa(i), p); err != nil {
			return errors.Wrap(err, "trace header")
		}
	}
	if g := c.Group; g != nil {
		switch {
		case g.Size < 1 || g.Size > MaxCPSize:
			return headerErr("group size %d: want 1 to %d", g.Size, MaxCPSize)
		case g.PageSize < 1 || g.PageSize > MaxDecodePageSize:
			return headerErr("group page_size %d: want 1 to %d", g.PageSize, MaxDecodePageSize)
		}
		if _, err := cp.ParseRule(g.Rule); err != nil {
			return headerErr("group rule %q: want shared or contiguous", Excerpt(g.Rule, MaxNameLen))
		}
	}
	var pool uint64
	for i, b := range c.Pool {
		name := "pool buffer " + strconv.Itoa(i)
		if err := checkName(name+" name", b.Name); err != nil {
			return errors.Wrap(err, "trace header")
		}
		switch {
		case b.Layer != 0:
			return headerErr("%s (%s): layer %d: a decode pool's buffers have none", name, b.Name, b.Layer)
		case b.ItemLen == 0:
			return headerErr("%s (%s): item_len 0: must be at least 1", name, b.Name)
		case b.ItemLen > MaxItemLen:
			return headerErr("%s (%s): item_len %d: above the bound of %d", name, b.Name, b.ItemLen, MaxItemLen)
		case b.Pages < 1:
			return headerErr("%s (%s): pages %d: must be at least 1", name, b.Name, b.Pages)
		case b.Pages > MaxPages:
			return headerErr("%s (%s): pages %d: above the bound of %d", name, b.Name, b.Pages, MaxPages)
		}
		// Both factors are bounded and the sum checked before each
		// addition, as for an engine's buffers.
		pool += b.ItemLen * uint64(b.Pages)
		if pool > MaxPoolBytes {
			return headerErr("%s (%s): the pool's item_len × pages reach %d bytes, above the bound of %d", name, b.Name, pool, uint64(MaxPoolBytes))
		}
	}
	return nil
}
