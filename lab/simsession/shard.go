package simsession

import (
	"fmt"

	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/workload"
)

// ShardKey is the session metadata key of a sharded run's pairing
// (workload.Shard, as FormatShard spells it): the prefill process derived
// it from its flags, and each decode rank checks it against the decode
// process's own before it sizes its pool.
const ShardKey = "kvstream-sim-shard"

// maxShardText bounds the pairing's text before it is parsed: its fields
// are a few short numbers and a model name.
const maxShardText = 512

// FormatShard spells a pairing for ShardKey: space-separated name=value
// fields, every one of them, in a fixed order.
func FormatShard(s workload.Shard) string {
	return fmt.Sprintf("model=%s layers=%d prefill-tp=%d prefill-pp=%d decode-tp=%d decode-pp=%d page-size=%d page-order=%s scale=%d",
		s.Model, s.Layers, s.PrefillTP, s.PrefillPP, s.DecodeTP, s.DecodePP, s.PageSize, s.Order, s.Scale)
}

// ParseShard reads FormatShard's text, which comes from the network: every
// field exactly once, nothing else, numbers that fit. It says nothing of
// whether the pairing reshards (workload.Shard.Sides does); errors are
// marked system.ErrBadInput and name the field.
func ParseShard(text string) (workload.Shard, error) {
	var s workload.Shard
	err := parseFields(ShardKey, text, maxShardText, []field{
		textField("model", &s.Model), intField("layers", &s.Layers), intField("prefill-tp", &s.PrefillTP), intField("prefill-pp", &s.PrefillPP),
		intField("decode-tp", &s.DecodeTP), intField("decode-pp", &s.DecodePP), intField("page-size", &s.PageSize), orderField(&s.Order),
		intField("scale", &s.Scale),
	})
	return s, err
}

// disagree names the first flag on which the prefill's pairing differs
// from the decode process's own flags (own: Layers, PageSize and Scale
// zero, which the decode process takes from the prefill), or "".
func disagree(prefill, own workload.Shard) string {
	type flag struct {
		name      string
		pre, self any
	}
	for _, f := range []flag{
		{"--model", prefill.Model, own.Model},
		{"--prefill-tp", max(1, prefill.PrefillTP), max(1, own.PrefillTP)},
		{"--prefill-pp", max(1, prefill.PrefillPP), max(1, own.PrefillPP)},
		{"--decode-tp", max(1, prefill.DecodeTP), max(1, own.DecodeTP)},
		{"--decode-pp", max(1, prefill.DecodePP), max(1, own.DecodePP)},
		{"--page-order", prefill.Order, own.Order},
	} {
		if f.pre != f.self {
			return fmt.Sprintf("the prefill runs %s %v, this decode process %s %v", f.name, f.pre, f.name, f.self)
		}
	}
	return ""
}

// RankServer is the decode.Config.Name of decode rank r's server: the
// first rank's is the node's default, so that a prefill and a decode
// process that disagree on sharding at all still meet at one server,
// which names the disagreement.
func RankServer(r reshard.Rank) string {
	if r == (reshard.Rank{}) {
		return ""
	}
	return fmt.Sprintf("pp%d-tp%d", r.Stage, r.TP)
}

// RankPeer is decode rank r's peer id.
func RankPeer(r reshard.Rank) string { return fmt.Sprintf("decode-pp%d-tp%d", r.Stage, r.TP) }
