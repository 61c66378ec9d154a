package replay

import (
	"fmt"
	"strings"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/trace"
)

// DecodeCore replays a decode server's trace (header side "decode")
// through a fresh decode core, with the conservation rules of
// decode.Replay, and reports it as a core replay: the outcome's Decode
// holds what the decode core decided, and a divergence is printed like
// the engine's, in bounded excerpts. Cores calls it for a decode trace, so
// that kvstream replay takes either side's trace.
func DecodeCore(s trace.Stream) (*Outcome, error) {
	d, err := decode.Replay(s)
	if err != nil {
		return nil, err
	}
	out := &Outcome{Summary: Summary{Records: d.Records, Replayed: d.Replayed, Statuses: map[string]int{}, InFlight: d.InFlight}, Decode: d}
	if v := d.Divergence; v != nil {
		out.Divergence = &Divergence{Seq: v.Seq, Line: v.Line, Actor: v.Actor, ID: v.ID, Type: v.Type, Reason: v.Reason,
			Recorded: v.Recorded, Replayed: v.Replayed}
	}
	return out, nil
}

// decodeString summarizes a decode replay: sessions, rooms by outcome,
// then the divergence or the count replayed.
func (o *Outcome) decodeString() string {
	var b strings.Builder
	d := o.Decode
	rooms := map[string]int{}
	for _, r := range d.Rooms {
		rooms[r.Outcome]++
	}
	none := func(s string) string {
		if s == "" {
			return "none"
		}
		return s
	}
	fmt.Fprintf(&b, "decode trace, %d records: %d sessions (ended: %s), %d rooms ended (%s)", o.Records, d.Sessions, none(sortedCounts(d.SessionsEnded)),
		len(d.Rooms), none(sortedCounts(rooms)))
	if o.InFlight > 0 {
		fmt.Fprintf(&b, "\n%d revocations under way when the trace was taken", o.InFlight)
	}
	if o.Divergence != nil {
		fmt.Fprintf(&b, "\n%s", o.Divergence)
	} else {
		fmt.Fprintf(&b, "\nreplayed %d messages, no divergence", o.Replayed)
	}
	return b.String()
}

// Describe names what recorded a trace, for the line a replay prints
// above its outcome: the kvstream version and an engine's geometry, or a
// decode server's name and pool.
func Describe(h trace.Header) string {
	if h.Side != trace.SideDecode || h.Decode == nil {
		return fmt.Sprintf("kvstream %s, %d hook layers, group %d, %d buffers", h.EngineVersion, h.Config.HookLayers, h.Config.GroupSize, len(h.Config.Buffers))
	}
	d := h.Decode
	pool := "sized by a Hello"
	if len(d.Pool) > 0 {
		pool = fmt.Sprintf("%d buffers", len(d.Pool))
	}
	group := ""
	if g := d.Group; g != nil {
		group = fmt.Sprintf(", CP group of %d", g.Size)
	}
	return fmt.Sprintf("kvstream %s, decode server %s, pool %s%s", h.EngineVersion, d.Server, pool, group)
}
