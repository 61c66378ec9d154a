package simsession

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvstream/kvstream/cp"
	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/hw/rdma"
	"github.com/kvstream/kvstream/hw/rdma/loopback"
	"github.com/kvstream/kvstream/lab/testbed"
	"github.com/kvstream/kvstream/lab/workload"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGroupBatchesVerified: the ranks of a CP group, each its own engine
// and session, stream two batches of the sim workload into one decode
// instance; every room completes only with every rank's pages, and the
// union of the ranks' pages is every page of every request, checked
// against the model's bytes.
func TestGroupBatchesVerified(t *testing.T) {
	for _, rule := range []cp.Rule{cp.SharedKV, cp.Contiguous} {
		t.Run(rule.String(), func(t *testing.T) {
			const ranks, batches = 3, 2
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			fab := loopback.NewFabric(loopback.Options{})
			decTr, err := fab.NewTransport("decode")
			require.NoError(t, err)
			defer decTr.Close()
			node, err := decode.Listen("127.0.0.1:0", nil)
			require.NoError(t, err)
			defer node.Close(context.Background())

			cfg := workload.Defaults()
			cfg.Preset, cfg.Requests, cfg.PromptTokens, cfg.ChunkTokens, cfg.PageSize, cfg.GroupSize = workload.Presets["small"], 2, 500, 256, 16, 4
			var mu sync.Mutex
			ended := map[uint64]error{}
			done := make(chan struct{}, 64)
			d, err := StartGroupDecode(node, decTr, 64<<20, decode.Group{Size: ranks, Rule: rule, PageSize: cfg.PageSize}, 0, "decode-0",
				func(r decode.Room, err error) {
					mu.Lock()
					ended[r.ID] = err
					mu.Unlock()
					done <- struct{}{}
				}, nil)
			require.NoError(t, err)
			defer d.Close(context.Background())

			// Batch after batch, as the cluster's router sends them: a batch's
			// rooms end before the next batch reuses their decode pages (the
			// server refuses pages a room still holds).
			clients := make([]*decode.Client, ranks)
			trs := make([]rdma.Transport, ranks)
			dials := make([]int, ranks)
			for r := range ranks {
				trs[r], err = fab.NewTransport("rank-" + strconv.Itoa(r))
				require.NoError(t, err)
				defer trs[r].Close()
			}
			for b := range batches {
				for r := range ranks {
					session := func(ctx context.Context, g testbed.Geometry) (*decode.Client, error) {
						var err error
						if clients[r] == nil {
							dials[r]++
							clients[r], err = decode.Dial(ctx, node, decode.DialConfig{Decode: d.Server.Addr(), Buffers: LayoutOf(g), PageSize: cfg.PageSize,
								Metadata: map[string]string{SeedKey: "7", decode.RankKey: strconv.Itoa(r)}})
						}
						return clients[r], err
					}
					rc := cfg
					rc.Seed, rc.CP = BatchSeed(7, b), cp.CP{Size: ranks, Rank: r, Rule: rule}
					plane := NewRankPlane(session, trs[r], b, cfg.PromptTokens)
					mr, err := workload.RunRemote(ctx, rc, nil, plane, true)
					require.NoError(t, err)
					require.Zero(t, mr.Failed)
					require.Empty(t, plane.Verify())
				}
				for range cfg.Requests {
					select {
					case <-done:
					case <-ctx.Done():
						t.Fatal("rooms did not end")
					}
				}
			}
			for r := range ranks {
				assert.Equal(t, 1, dials[r], "one session per decode instance, not per batch")
			}
			mu.Lock()
			for id, err := range ended {
				assert.NoError(t, err, "room %x", id)
			}
			mu.Unlock()
			for _, c := range clients {
				_, err := c.Bye(ctx, nil)
				assert.NoError(t, err)
			}
			pages, mismatch := d.Verified()
			assert.Empty(t, mismatch)
			// 2 batches x 2 requests x 32 pages x 9 buffers, each page once.
			assert.Equal(t, uint64(batches*2*32*9), pages)
		})
	}
}
