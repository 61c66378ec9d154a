package scalebench

import (
	"context"
	"encoding/json"
	"runtime"
	"testing"

	"github.com/kvstream/kvstream/lab/workload"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A sweep's engines, transports and sims end with it. protoactor's
// dead-letter throttle ends one second after its last message on its own.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}

// issueKeys are the row keys the issue's --json schema names.
var issueKeys = []string{"axis", "value", "layer_end_ns", "boundary_ns_per_context", "boundary_allocs",
	"allocs_per_forward", "bytes_per_room", "plan_ms", "ns_per_write", "exposed_over_floor"}

// TestQuickSweep runs the --quick sweep and checks every row against what
// can be computed by hand (the point of each row, the writes per group) and
// against physical bounds; it checks no timing against a target.
func TestQuickSweep(t *testing.T) {
	cfg := Quick()
	if raceEnabled {
		cfg.Base.Layers = 8
		cfg.Rooms, cfg.Dests, cfg.Layers, cfg.Frag = []int{1, 64}, []int{2}, []int{16}, []int{1}
	}
	rep, err := Run(context.Background(), cfg)
	require.NoError(t, err)
	require.Len(t, rep.Rows, len(cfg.Rooms)+len(cfg.Dests)+len(cfg.Layers)+len(cfg.Frag))

	raw, err := json.Marshal(rep)
	require.NoError(t, err)
	var decoded struct {
		Rows []map[string]any `json:"rows"`
	}
	require.NoError(t, json.Unmarshal(raw, &decoded))
	for _, row := range decoded.Rows {
		for _, k := range issueKeys {
			require.Contains(t, row, k)
		}
	}

	seen := map[string]int{}
	for _, r := range rep.Rows {
		p := r.Point
		seen[r.Axis]++
		want := cfg.Base
		switch r.Axis {
		case AxisRooms:
			want.Rooms = r.Value
		case AxisDestinations:
			want.Dests = r.Value
		case AxisLayers:
			want.Layers = r.Value
		case AxisFragmentation:
			want.Frag = r.Value
		default:
			t.Fatalf("row of unknown axis %q", r.Axis)
		}
		require.Equal(t, want, p, "row %s %d", r.Axis, r.Value)

		// Every buffer is one write per run of the chunk, toward every
		// destination; the groups split the buffers K at a time. At
		// fragmentation 1 with one destination that is the pages of a
		// group: 100 000 pages x K buffers.
		runs := (ChunkPages + p.Frag - 1) / p.Frag
		groups := (p.Layers + GroupSize - 1) / GroupSize
		require.InDelta(t, float64(p.Dests*runs*p.Layers)/float64(groups), r.WritesPerGroup, 1e-9, "row %s %d", r.Axis, r.Value)
		if p.Frag == 1 && p.Dests == 1 && p.Layers%GroupSize == 0 {
			require.Equal(t, float64(ChunkPages*GroupSize), r.WritesPerGroup)
		}

		// Physical bounds: no call takes less than a cycle (0.1 ns at any
		// clock this runs on), a room holds at least its chunk's plan and
		// actors (above 100 bytes), and no plan of 100 000 pages takes
		// under 10 µs. Not that a boundary takes longer than a
		// non-boundary layer: two wall-clock figures of single runs, which
		// a stall in one of them orders either way (the benchmark's
		// figures are for reading, not for a test's oracle).
		require.Greater(t, r.LayerEndNs, 0.1)
		require.InDelta(t, r.BoundaryNs/float64(p.Rooms), r.BoundaryNsPerContext, 1e-6)
		require.GreaterOrEqual(t, r.BoundaryCPUNsPerContext, 0.0)
		require.GreaterOrEqual(t, r.BoundaryAllocs, 0.0)
		require.Greater(t, r.AllocsPerForward, 0.0)
		require.Greater(t, r.BytesPerRoom, 100.0)
		require.Greater(t, r.PlanMs, 0.01)
		// A room's end is at least a goroutine woken to call Finish and
		// its answer (above 100 ns), and the process cannot use more CPU
		// than its processors give in the same wall time (each cycle's
		// CPU is within that bound, so the medians are too; 2 ms a cycle
		// for the clocks' granularity).
		require.Greater(t, r.EndCPUNsPerRoom, 100.0)
		require.Greater(t, r.EndWallNsPerRoom, 100.0)
		require.LessOrEqual(t, r.EndCPUNsPerRoom, float64(runtime.NumCPU())*r.EndWallNsPerRoom+2e6/float64(p.Rooms))
		require.Greater(t, r.NsPerWrite, 0.0)
		if r.Axis == AxisFragmentation {
			require.Nil(t, r.ExposedOverFloor)
			require.Nil(t, r.SimLinkLagMs)
		} else {
			require.NotNil(t, r.ExposedOverFloor)
			require.Greater(t, *r.ExposedOverFloor, 0.0)
			require.NotNil(t, r.SimLinkLagMs)
			require.GreaterOrEqual(t, *r.SimLinkLagMs, 0.0)
		}
	}
	require.Equal(t, map[string]int{AxisRooms: len(cfg.Rooms), AxisDestinations: len(cfg.Dests), AxisLayers: len(cfg.Layers), AxisFragmentation: len(cfg.Frag)}, seen)
}

// TestFragmented checks the decode pages of each fragmentation: a
// permutation of the chunk's pages with exactly ceil(n / frag) runs.
func TestFragmented(t *testing.T) {
	for _, tc := range []struct{ n, frag int }{{10, 1}, {10, 3}, {100, 4}, {ChunkPages, 1}, {ChunkPages, 64}, {5, 5}, {6, 3}} {
		pages := fragmented(tc.n, tc.frag)
		require.Len(t, pages, tc.n)
		seen := make([]bool, tc.n)
		runs := 0
		for i, pg := range pages {
			require.False(t, seen[pg], "page %d twice", pg)
			seen[pg] = true
			if i == 0 || pg != pages[i-1]+1 {
				runs++
			}
		}
		require.Equal(t, (tc.n+tc.frag-1)/tc.frag, runs, "n %d frag %d", tc.n, tc.frag)
	}
}

// TestValidate names the bad value.
func TestValidate(t *testing.T) {
	cfg := Quick()
	cfg.Rooms = []int{0}
	require.ErrorContains(t, cfg.Validate(), "rooms 0: must be 1 to 4096")
	cfg = Quick()
	cfg.Rooms = []int{2048}
	require.ErrorContains(t, cfg.Validate(), "rooms 2048")
	cfg.Sim = false
	require.NoError(t, cfg.Validate())
	cfg.Frag = []int{ChunkPages + 1}
	require.ErrorContains(t, cfg.Validate(), "fragmentation 100001")
}

// Only keeps one axis's points, and names a bad axis with the choices.
func TestOnly(t *testing.T) {
	cfg := Full()
	require.NoError(t, cfg.Only(AxisDestinations))
	var axes []string
	for _, p := range cfg.points() {
		require.Equal(t, AxisDestinations, p.axis)
		axes = append(axes, p.axis)
	}
	require.Len(t, axes, len(Full().Dests))
	require.ErrorContains(t, cfg.Only("dests"), `axis "dests": want rooms, destinations, layers or fragmentation`)
}

// The forward's ratio is the last room's exposed time over the largest
// floor, not a mean: rooms served ahead of their place in the floor's order
// do not pull it under 1.
func TestForwardRatio(t *testing.T) {
	m := &workload.ModeReport{
		Exposed:    workload.Dist{N: 3, Max: 4.5},
		PerRequest: []workload.RequestReport{{FloorMs: 2}, {FloorMs: 3}, {FloorMs: 1}},
	}
	got, err := forwardRatio(m)
	require.NoError(t, err)
	require.InDelta(t, 1.5, got, 1e-12)
	_, err = forwardRatio(&workload.ModeReport{})
	require.Error(t, err)
}
