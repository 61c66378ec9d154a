package workload

import (
	"context"
	"sync"
	"testing"

	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/system"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// recordingPlane is onePool that keeps the geometry RunRemote opened it
// with and every notice it was told.
type recordingPlane struct {
	onePool
	mu      sync.Mutex
	geom    testbed.Geometry
	notices []Notice
}

func (r *recordingPlane) Open(ctx context.Context, geom testbed.Geometry, seed uint64, log *zap.Logger) (rdma.Transport, system.Peer, error) {
	r.mu.Lock()
	r.geom = geom
	r.mu.Unlock()
	return r.onePool.Open(ctx, geom, seed, log)
}

func (r *recordingPlane) ChunkDone(n Notice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notices = append(r.notices, n)
}

// TestRemoteLayoutIsWhatRunRemoteWrites: RemoteLayout names the pool
// RunRemote describes to its decode side and the decode page of every
// position its notices report, more requests than resident ones included
// (they take a finished one's pages).
func TestRemoteLayoutIsWhatRunRemoteWrites(t *testing.T) {
	for _, resident := range []int{0, 2} {
		cfg := oracleConfig()
		cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.LayerUsPerKTok, cfg.Resident = 3, 1000, 512, 16, 100, resident
		geom, pages, err := cfg.RemoteLayout()
		require.NoError(t, err)
		require.Len(t, pages, cfg.Requests)

		g, p := planOf(t, cfg)
		rec := &recordingPlane{onePool: onePool{l: &localPlane{cfg: cfg, g: g, p: p}}}
		mr, err := RunRemote(context.Background(), cfg, zap.NewNop(), rec, true)
		require.NoError(t, err)
		require.Empty(t, mr.Aborted)
		assert.Equal(t, rec.geom, geom, "resident %d", resident)
		require.NotEmpty(t, rec.notices)
		positions := 0
		for _, n := range rec.notices {
			require.Len(t, n.DstPages, len(n.Positions))
			for i, x := range n.Positions {
				assert.Equal(t, pages[n.Room][x], n.DstPages[i], "resident %d room %d position %d", resident, n.Room, x)
				positions++
			}
		}
		assert.Equal(t, cfg.Requests*len(pages[0]), positions, "every position of every request reported once")
	}

	sharded := oracleConfig()
	sharded.PrefillTP, sharded.DecodeTP = 2, 2
	_, _, err := sharded.RemoteLayout()
	assert.ErrorContains(t, err, "--prefill-tp 2")
}
