package decode_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/system"
)

// gauges reads the decode gauges from reg.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetType().String() == "GAUGE" {
			out[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return out
}

// TestGaugesCountWhatTheServerHolds walks one room through its life and
// checks every gauge against the figure computed by hand: the pool is 3
// buffers × 16 pages × 64 bytes = 3072 bytes; the room holds 4 pages.
func TestGaugesCountWhatTheServerHolds(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := decode.NewMetrics(reg)
	require.NoError(t, err)
	r := newRig(t, decode.Config{Observer: m})
	draining := 0.0
	want := func(what string, sessions, inFlight, held, awaiting float64) {
		t.Helper()
		// The gauges are published after the actor handled a message;
		// State is answered by the same actor, after them.
		_, err := r.srv.State()
		require.NoError(t, err)
		assert.Equal(t, map[string]float64{
			"kvstream_decode_sessions_open":             sessions,
			"kvstream_decode_rooms_in_flight":           inFlight,
			"kvstream_decode_pages_held":                held,
			"kvstream_decode_pages_awaiting_revocation": awaiting,
			"kvstream_decode_pages_kept_out":            0,
			"kvstream_decode_pool_bytes":                3072,
			"kvstream_decode_draining":                  draining,
		}, gauges(t, reg), what)
	}

	require.NoError(t, r.srv.Expect(7, []int{4, 5, 6, 7}))
	want("expected", 0, 1, 4, 0)
	c := r.dial(t)
	require.NoError(t, c.Notify(waitCtx(t), notice(7, 0, 2, 4, false, system.Succeeded, nil)))
	want("half reported", 1, 1, 4, 0)

	// Released in progress: its prefill may still write its last two
	// pages, so all four stay held, awaiting the prefill's revocation.
	require.NoError(t, r.srv.Release(7))
	want("released in progress", 1, 0, 4, 4)

	_, err = c.Bye(waitCtx(t), nil)
	require.NoError(t, err)
	want("after the prefill's goodbye", 0, 0, 0, 0)

	require.NoError(t, r.srv.Drain(waitCtx(t)))
	draining = 1
	want("drained", 0, 0, 0, 0)
}
