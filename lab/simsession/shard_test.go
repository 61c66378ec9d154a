package simsession

import (
	"strings"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var exampleShard = workload.Shard{Model: "llama70b", Layers: 80, PrefillTP: 2, DecodeTP: 4, DecodePP: 2, PageSize: 64, Order: reshard.TokenMajor, Scale: 8}

func TestShardRoundTrip(t *testing.T) {
	text := FormatShard(exampleShard)
	assert.Equal(t, "model=llama70b layers=80 prefill-tp=2 prefill-pp=0 decode-tp=4 decode-pp=2 page-size=64 page-order=token-major scale=8", text)
	got, err := ParseShard(text)
	require.NoError(t, err)
	assert.Equal(t, exampleShard, got)
}

// TestParseShardNamesTheField: what a hostile or mistaken prefill could
// send is refused, naming the field, before anything is sized from it.
func TestParseShardNamesTheField(t *testing.T) {
	ok := FormatShard(exampleShard)
	for _, tc := range []struct{ text, want string }{
		{strings.Replace(ok, " scale=8", "", 1), "missing scale"},
		{ok + " scale=8", `field "scale" given twice`},
		{ok + " tp=1", `unknown field "tp"`},
		{strings.Replace(ok, "layers=80", "layers", 1), `field "layers" is not name=value`},
		{strings.Replace(ok, "layers=80", "layers=-1", 1), `layers "-1": want a number`},
		{strings.Replace(ok, "layers=80", "layers=99999999999", 1), `layers "99999999999": want a number`},
		{strings.Replace(ok, "token-major", "sideways", 1), `page-order "sideways"`},
		{ok + strings.Repeat(" ", maxShardText), "longer than 512 bytes"},
	} {
		_, err := ParseShard(tc.text)
		assert.True(t, errors.Is(err, system.ErrBadInput), "%q: %v", tc.text, err)
		assert.ErrorContains(t, err, tc.want, "%q", tc.text)
	}
}

// TestShardSidesRefuseWhatCannotReshard: a parsed pairing is sized only
// once Sides found it sane: bounded degrees and layers, a scale that
// divides the head dim, heads that split.
func TestShardSidesRefuseWhatCannotReshard(t *testing.T) {
	pre, dec, err := exampleShard.Sides()
	require.NoError(t, err)
	assert.Equal(t, 16, pre.HeadDim, "128 / scale 8")
	assert.Equal(t, []int{0, 40, 80}, dec.Stages)
	assert.Equal(t, uint64(64*2*16*2), dec.ItemLen(), "2 of 8 heads per decode rank")
	for _, tc := range []struct {
		edit func(*workload.Shard)
		want string
	}{
		{func(s *workload.Shard) { s.Model = "gpt5" }, `--model "gpt5"`},
		{func(s *workload.Shard) { s.Layers = 0 }, "0 layers"},
		{func(s *workload.Shard) { s.Layers = 1 << 20 }, "layers: want 1 to 4096"},
		{func(s *workload.Shard) { s.DecodePP = 81 }, "--decode-pp 81"},
		{func(s *workload.Shard) { s.PrefillTP = 1 << 30 }, "--prefill-tp 1073741824"},
		{func(s *workload.Shard) { s.Scale = 3 }, "head dim / 3"},
		{func(s *workload.Shard) { s.Scale = 0 }, "head dim / 0"},
		{func(s *workload.Shard) { s.DecodeTP = 3 }, "8 KV heads do not split over TP 3"},
		{func(s *workload.Shard) { s.PageSize = 0 }, "page size 0"},
	} {
		s := exampleShard
		tc.edit(&s)
		_, _, err := s.Sides()
		assert.True(t, errors.Is(err, system.ErrBadInput), "%+v: %v", s, err)
		assert.ErrorContains(t, err, tc.want, "%+v", s)
	}
}

// FuzzParseShard: whatever arrives, ParseShard and Sides return (never
// panic, never size anything unbounded), and what parses spells back to
// itself.
func FuzzParseShard(f *testing.F) {
	f.Add(FormatShard(exampleShard))
	f.Add(FormatShard(workload.Shard{Model: "dsv3", Layers: 62, PrefillTP: 8, PrefillPP: 2, DecodeTP: 1, PageSize: 1, Scale: 576}))
	f.Add("model=small layers=9 prefill-tp=1024 prefill-pp=9 decode-tp=1024 decode-pp=9 page-size=65536 page-order=head-major scale=1")
	f.Add("model= layers=0 prefill-tp=0 prefill-pp=0 decode-tp=0 decode-pp=0 page-size=0 page-order= scale=0")
	f.Fuzz(func(t *testing.T, text string) {
		s, err := ParseShard(text)
		if err != nil {
			return
		}
		again, err := ParseShard(FormatShard(s))
		if err != nil || again != s {
			t.Fatalf("%q parsed to %+v, which spells %q, which parses to %+v (%v)", text, s, FormatShard(s), again, err)
		}
		pre, dec, err := s.Sides()
		if err != nil {
			return
		}
		if pre.Validate("prefill") != nil || dec.Validate("decode") != nil {
			t.Fatalf("%+v: Sides returned sides that do not validate", s)
		}
	})
}
