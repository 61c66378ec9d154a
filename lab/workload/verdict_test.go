package workload

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The verdict's line: each mode against its target, the bytes, and a note
// when the machine kept the process from running; a ratio planted above
// its target says so, and the line ends the report's text.
func TestVerdict(t *testing.T) {
	r := &Report{BytesEqual: true, PerLayer: &ModeReport{PerLayer: true, RatioToFloor: 1.234}, Monolithic: &ModeReport{RatioToFloor: 1.04}}
	v := newVerdict(r, 0)
	assert.Equal(t, "verdict: per-layer 1.23× floor (target ≤ 1.5) ok, monolithic 1.04× (≤ 1.25) ok, bytes equal: true", v.String())
	assert.True(t, v.PerLayer.OK)
	assert.True(t, v.Monolithic.OK)
	assert.False(t, v.Loaded)

	// Planted: per layer above its target, on a loaded machine.
	r.PerLayer.RatioToFloor, r.BytesEqual = 1.78, false
	v = newVerdict(r, 180*time.Millisecond)
	assert.Equal(t, "verdict: per-layer 1.78× floor (target ≤ 1.5) over target, monolithic 1.04× (≤ 1.25) ok, bytes equal: false; "+
		"the machine was loaded: this process could not run for 180 ms in total (stall probe); figures may be high", v.String())
	assert.False(t, v.PerLayer.OK)
	assert.True(t, v.Loaded)
	assert.InDelta(t, 180, v.StalledMs, 1e-9)

	// Planted: monolithic above its target; a short stall; a time scale.
	r.PerLayer.RatioToFloor, r.Monolithic.RatioToFloor, r.BytesEqual, r.ScaledOverheads = 1.5, 1.26, true, true
	v = newVerdict(r, 2500*time.Microsecond)
	assert.Equal(t, "verdict: per-layer 1.50× floor (target ≤ 1.5) ok, monolithic 1.26× (≤ 1.25) over target, bytes equal: true; "+
		"the time scale is not 1: the ratios do not measure the engine; "+
		"the machine was loaded: this process could not run for 2.5 ms in total (stall probe); figures may be high", v.String())

	raw, err := json.Marshal(v)
	require.NoError(t, err)
	var obj map[string]any
	require.NoError(t, json.Unmarshal(raw, &obj))
	assert.Equal(t, map[string]any{"ratio_to_floor": 1.26, "target": 1.25, "ok": false}, obj["monolithic"])
	assert.Equal(t, true, obj["loaded"])

	r.Verdict = v
	var text bytes.Buffer
	r.Text(&text)
	lines := strings.Split(strings.TrimSpace(text.String()), "\n")
	assert.Equal(t, v.String(), lines[len(lines)-1], "the verdict ends the text")
}
