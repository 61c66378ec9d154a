package buildinfo

import (
	"runtime/debug"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFromBuildInfo(t *testing.T) {
	stamped := &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Path: "github.com/kvstream/kvstream", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name            string
		bi              *debug.BuildInfo
		ok              bool
		version, commit string
	}{
		{"stamped, dirty", stamped, true, "v0.3.0", "abc123+dirty"},
		{"work tree without vcs", &debug.BuildInfo{GoVersion: "go1.27.3", Main: debug.Module{Version: "(devel)"}}, true, "(devel)", Unknown},
		{"nothing recorded", nil, false, Unknown, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := fromBuildInfo(tc.bi, tc.ok, NoUCX, NoUCX)
			assert.Equal(t, tc.version, in.Version)
			assert.Equal(t, tc.commit, in.Commit)
			assert.Equal(t, decode.ProtocolVersion, in.Protocol)
			assert.NotEmpty(t, in.GoVersion)
		})
	}
}

func TestString(t *testing.T) {
	in := Info{Version: "v1", Commit: "c", GoVersion: "go1.27.3", Protocol: 2, UCXBuilt: "1.13", UCXRuntime: "1.13.1"}
	s := in.String()
	for _, want := range []string{"kvstream v1\n", "commit:   c\n", "go:       go1.27.3\n", "protocol: 2\n", "ucx:      built with 1.13, running with 1.13.1\n"} {
		assert.Contains(t, s, want)
	}
	in.UCXBuilt, in.UCXRuntime = NoUCX, NoUCX
	assert.Contains(t, in.String(), "ucx:      none (built without ucx)\n")
}

func TestCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	in := Info{Version: "v1", Commit: "c", GoVersion: "go1.27.3", Protocol: 2, UCXBuilt: NoUCX, UCXRuntime: NoUCX}
	require.NoError(t, reg.Register(in.Collector()))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Len(t, mfs, 1)
	assert.Equal(t, MetricName, mfs[0].GetName())
	require.Len(t, mfs[0].GetMetric(), 1)
	m := mfs[0].GetMetric()[0]
	assert.Equal(t, 1.0, m.GetGauge().GetValue())
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	assert.Equal(t, map[string]string{"version": "v1", "commit": "c", "goversion": "go1.27.3", "protocol": "2", "ucx": "none"}, labels)
}

// Read describes the running binary whatever the build recorded.
func TestRead(t *testing.T) {
	in := Read()
	assert.NotEmpty(t, in.Version)
	assert.NotEmpty(t, in.Commit)
	assert.NotEmpty(t, in.UCXBuilt)
	assert.Equal(t, decode.ProtocolVersion, in.Protocol)
}
