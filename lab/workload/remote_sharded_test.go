package workload

import (
	"context"
	"testing"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cp/reshard"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// TestShardGivesTheSimsSides: the decode process sizes and checks its
// pools from the Shard the prefill sends, so Sides must give exactly the
// sides the prefill's run allocates, scale and stages included.
func TestShardGivesTheSimsSides(t *testing.T) {
	for _, c := range []struct {
		model                  string
		layers, preTP, prePP   int
		decTP, decPP, memBytes int
	}{
		{"llama70b", 0, 2, 0, 4, 0, 0},
		{"llama70b", 6, 16, 2, 1, 3, 1 << 20}, // TP above the KV heads; a budget that forces a scale
		{"dsv3", 0, 8, 2, 0, 3, 0},
	} {
		cfg := Defaults()
		cfg.Preset, cfg.Layers, cfg.PrefillTP, cfg.PrefillPP, cfg.DecodeTP, cfg.DecodePP = Presets[c.model], c.layers, c.preTP, c.prePP, c.decTP, c.decPP
		cfg.PageOrder, cfg.MemoryBudget = reshard.TokenMajor, int64(c.memBytes)
		g, err := cfg.validate()
		require.NoError(t, err)
		if c.memBytes > 0 {
			require.Greater(t, g.scale, 1, "the budget forces a scale")
		}
		s := shardOf(cfg, g)
		pre, dec, err := s.Sides()
		require.NoError(t, err, "%s", s)
		assert.Equal(t, g.preSide, pre, "%s", s)
		assert.Equal(t, g.decSide, dec, "%s", s)
	}
}

// TestRunRemoteShardedNeedsAShardedPlane: a sharded configuration with a
// decode side that has one pool is refused before anything runs.
func TestRunRemoteShardedNeedsAShardedPlane(t *testing.T) {
	cfg := Defaults()
	cfg.Preset, cfg.PrefillTP = Presets["llama70b"], 2
	_, err := RunRemote(context.Background(), cfg, nil, &onePool{}, true)
	assert.True(t, errors.Is(err, system.ErrBadInput), "%v", err)
	assert.ErrorContains(t, err, "--prefill-tp 2 --decode-tp 0 (--model llama70b): this decode side (*workload.onePool) does not shard")
}

// onePool is a remote decode side with one pool: the sim's own
// underneath, as another process's unsharded decode side would be.
type onePool struct{ l *localPlane }

func (o *onePool) Open(ctx context.Context, _ testbed.Geometry, _ uint64, log *zap.Logger) (rdma.Transport, system.Peer, error) {
	peers, err := o.l.open(ctx, log)
	if err != nil {
		return nil, system.Peer{}, err
	}
	tr, err := o.l.transport(0, nil)
	return tr, peers[0], err
}
func (o *onePool) OnPeerLost(func(error)) {}
func (o *onePool) ChunkDone(Notice)       {}
func (o *onePool) Verify() string         { return "" }
func (o *onePool) Close() error           { o.l.close(); return nil }
