package tracetest

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/kvstream/kvstream/trace"
)

// Mutation is one edit of a trace.
type Mutation struct {
	// What says what was edited, for a failing test's message.
	What string
	// Field is the field a field change changed (Type.Field for a field of
	// the message, t_ns, sender, id), "" for the other edits.
	Field string
	// Seq is the record a replay's divergence must name.
	Seq   uint64
	Trace *trace.Trace
}

// DifferentActors swaps adjacent records handled by different actors (an
// engine's trace: one actor's records are in its own order anyway).
func DifferentActors(a, b *trace.Record) bool { return a.Actor != b.Actor }

// DifferentTypes swaps adjacent records of different message types (a
// decode server's trace, whose records are all its one actor's).
func DifferentTypes(a, b *trace.Record) bool { return a.Type != b.Type }

// Mutations lists every mutation of tr: each record deleted, each record
// duplicated, each pair of adjacent records that swap says to swap
// swapped, each record renumbered (its seq shifted by 1000), and, for the
// first record of each kind (actor and type), its time, its sender (when
// it has one) and its id changed, each field of its message changed (a
// value of the same JSON kind: ChangeValue), and its first effect changed.
func Mutations(tr *trace.Trace, swap func(a, b *trace.Record) bool) []Mutation {
	var out []Mutation
	recs := tr.Records
	edit := func(what, field string, seq uint64, f func([]trace.Record) []trace.Record) {
		c := make([]trace.Record, len(recs))
		for i := range recs {
			c[i] = recs[i]
			c[i].Effects = slices.Clone(recs[i].Effects)
		}
		out = append(out, Mutation{What: what, Field: field, Seq: seq, Trace: &trace.Trace{Header: tr.Header, Records: f(c)}})
	}
	for i := range recs {
		r := recs[i]
		edit(fmt.Sprintf("record %d (%s %s) deleted", r.Seq, r.Actor, r.Type), "", r.Seq, func(c []trace.Record) []trace.Record {
			return append(c[:i:i], c[i+1:]...)
		})
		edit(fmt.Sprintf("record %d (%s %s) duplicated", r.Seq, r.Actor, r.Type), "", r.Seq, func(c []trace.Record) []trace.Record {
			return append(c[:i+1:i+1], append([]trace.Record{c[i]}, c[i+1:]...)...)
		})
		if i+1 < len(recs) && swap(&recs[i], &recs[i+1]) {
			edit(fmt.Sprintf("records %d (%s %s) and %d (%s %s) swapped", r.Seq, r.Actor, r.Type, recs[i+1].Seq, recs[i+1].Actor, recs[i+1].Type), "", recs[i+1].Seq, func(c []trace.Record) []trace.Record {
				c[i], c[i+1] = c[i+1], c[i]
				return c
			})
		}
		edit(fmt.Sprintf("record %d (%s %s) renumbered %d", r.Seq, r.Actor, r.Type, r.Seq+1000), "", r.Seq+1000, func(c []trace.Record) []trace.Record {
			c[i].Seq += 1000
			return c
		})
	}
	// One field of each kind of record.
	seen := map[string]bool{}
	for i := range recs {
		r := recs[i]
		kind := r.Actor + "/" + r.Type
		if seen[kind] {
			continue
		}
		seen[kind] = true
		edit(fmt.Sprintf("record %d (%s %s): t_ns changed", r.Seq, r.Actor, r.Type), "t_ns", r.Seq, func(c []trace.Record) []trace.Record {
			c[i].T += 12345
			return c
		})
		if r.Sender != "" {
			edit(fmt.Sprintf("record %d (%s %s): sender changed", r.Seq, r.Actor, r.Type), "sender", r.Seq, func(c []trace.Record) []trace.Record {
				c[i].Sender += "x"
				return c
			})
		}
		edit(fmt.Sprintf("record %d (%s %s): id changed", r.Seq, r.Actor, r.Type), "id", r.Seq, func(c []trace.Record) []trace.Record {
			c[i].ID += "9"
			return c
		})
		if m, ok := r.Msg.(map[string]any); ok {
			for _, k := range slices.Sorted(maps.Keys(m)) {
				changed, ok := ChangeValue(m[k])
				if !ok {
					continue
				}
				edit(fmt.Sprintf("record %d (%s %s): msg field %s changed", r.Seq, r.Actor, r.Type, k), r.Type+"."+k, r.Seq, func(c []trace.Record) []trace.Record {
					nm := maps.Clone(m)
					nm[k] = changed
					c[i].Msg = nm
					return c
				})
			}
		}
		if len(r.Effects) > 0 {
			edit(fmt.Sprintf("record %d (%s %s): first effect changed", r.Seq, r.Actor, r.Type), "", r.Seq, func(c []trace.Record) []trace.Record {
				c[i].Effects[0] = strings.Replace(c[i].Effects[0], ":", ":1", 1)
				return c
			})
		}
	}
	return out
}

// ChangeValue returns a different value of the same JSON kind: a number
// plus one, a chunk id with its next serial, text with an "x" appended, a
// boolean flipped, an array with its first element changed (or its last
// dropped), an object with its first changeable field (by name) changed;
// null becomes text.
func ChangeValue(v any) (any, bool) {
	switch v := v.(type) {
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return nil, false
		}
		return json.Number(strconv.FormatInt(n+1, 10)), true
	case float64:
		return v + 1, true
	case string:
		if id, err := trace.ParseChunkID(v); err == nil {
			id.Serial++
			return trace.ChunkID(id), true
		}
		return v + "x", true
	case bool:
		return !v, true
	case []any:
		if len(v) == 0 {
			return []any{json.Number("1")}, true
		}
		c := slices.Clone(v)
		if x, ok := ChangeValue(c[0]); ok {
			c[0] = x
			return c, true
		}
		return c[:len(c)-1], true
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			if x, ok := ChangeValue(v[k]); ok {
				c := maps.Clone(v)
				c[k] = x
				return c, true
			}
		}
	case nil:
		return "x", true
	}
	return nil, false
}

// NamesRecord says whether a replay's message names record seq: as the
// record it stopped at, or as the one missing or out of order.
func NamesRecord(said string, seq uint64) bool {
	n := strconv.FormatUint(seq, 10)
	for _, p := range []string{"record " + n + " ", "record " + n + ")", "record " + n + ":", "record " + n + ",", "records " + n + " ", "(seq " + n + ")", "seq " + n + "\n", "record " + n + "\n", "record " + n + "'"} {
		if strings.Contains(said+"\n", p) {
			return true
		}
	}
	return false
}
