package simsession

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
)

// ShardKey is the session metadata key of a sharded run's pairing
// (workload.Shard, as FormatShard spells it): the prefill process derived
// it from its flags, and each decode rank checks it against the decode
// process's own before it sizes its pool.
const ShardKey = "kvstream-sim-shard"

// maxShardText bounds the pairing's text before it is parsed: its fields
// are a few short numbers and a model name.
const maxShardText = 512

// The pairing's fields, in FormatShard's order.
var shardFields = []string{"model", "layers", "prefill-tp", "prefill-pp", "decode-tp", "decode-pp", "page-size", "page-order", "scale"}

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
	bad := func(format string, args ...any) error {
		return errors.Mark(errors.Newf("%s %.64q: "+format, append([]any{ShardKey, text}, args...)...), system.ErrBadInput)
	}
	if len(text) > maxShardText {
		return s, bad("longer than %d bytes", maxShardText)
	}
	seen := map[string]bool{}
	for _, f := range strings.Fields(text) {
		name, value, ok := strings.Cut(f, "=")
		if !ok {
			return s, bad("field %.32q is not name=value", f)
		}
		if seen[name] {
			return s, bad("field %.32q given twice", name)
		}
		seen[name] = true
		var n *int
		switch name {
		case "model":
			s.Model = value
			continue
		case "page-order":
			switch value {
			case reshard.HeadMajor.String():
				s.Order = reshard.HeadMajor
			case reshard.TokenMajor.String():
				s.Order = reshard.TokenMajor
			default:
				return s, bad("page-order %.32q: want %s or %s", value, reshard.HeadMajor, reshard.TokenMajor)
			}
			continue
		case "layers":
			n = &s.Layers
		case "prefill-tp":
			n = &s.PrefillTP
		case "prefill-pp":
			n = &s.PrefillPP
		case "decode-tp":
			n = &s.DecodeTP
		case "decode-pp":
			n = &s.DecodePP
		case "page-size":
			n = &s.PageSize
		case "scale":
			n = &s.Scale
		default:
			return s, bad("unknown field %.32q", name)
		}
		v, err := strconv.ParseInt(value, 10, 32)
		if err != nil || v < 0 {
			return s, bad("%s %.32q: want a number from 0 to %d", name, value, int32(1<<31-1))
		}
		*n = int(v)
	}
	if len(seen) != len(shardFields) {
		var missing []string
		for _, f := range shardFields {
			if !seen[f] {
				missing = append(missing, f)
			}
		}
		return s, bad("missing %s", strings.Join(missing, ", "))
	}
	return s, nil
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
