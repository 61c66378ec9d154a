package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpRefusesBadFlags: up says what is wrong before it starts anything.
func TestUpRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--transport", "loopback"}, "does not cross processes"},
		{[]string{"--transport", "carrier-pigeon"}, "this binary has"},
		{[]string{"--prefill-ranks", "0"}, "--prefill-ranks 0"},
		{[]string{"--decode", "65"}, "--decode 65"},
		{[]string{"--fault", "flood"}, "--fault \"flood\""},
		{[]string{"--fault", "pause-etcd", "--etcd", "http://127.0.0.1:2379"}, "needs the etcd up starts"},
		{[]string{"--cp", "2"}, "not up's"},
		{[]string{"--batches", "2", "--fault", "kill-decode", "--fault-batch", "2"}, "--fault-batch 2"},
		// A negative batch never comes: the fault was never injected.
		{[]string{"--fault", "kill-decode", "--fault-batch", "-5"}, "--fault-batch -5: want a batch of the run, counted from 0"},
		{[]string{"--room-timeout", "-1s"}, "--room-timeout -1s: want 0 (rooms never time out) or more"},
		{[]string{"--fault", "pause-etcd", "--fault-for", "1000000h"}, "--fault-for 1000000h0m0s: want 0 to 10m0s"},
		{[]string{"--link-gbps", "100"}, "--link-gbps: up does not take it (the ranks' link is real)"},
		{[]string{"--time-scale", "2"}, "--time-scale: up does not take it"},
		{[]string{"--heartbeat", "1s", "--heartbeat-interval", "900ms", "--transport", "ucx"}, "--heartbeat-interval"},
		{[]string{"--drain-timeout", "0s", "--transport", "ucx"}, "--drain-timeout"},
		{[]string{"--etcd-tls-dir", "/nonexistent", "--etcd-ca", "x"}, "give one or the other"},
		{[]string{"--etcd-ca", "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"},
	} {
		out, err := run(t, append([]string{"up"}, tc.args...)...)
		if assert.Error(t, err, "%v: %s", tc.args, out) {
			assert.Contains(t, err.Error(), tc.want, "%v", tc.args)
		}
	}
}

// TestClusterNodesNeedEtcd: the node commands find their peers on etcd and
// say so when it is not given.
func TestClusterNodesNeedEtcd(t *testing.T) {
	for _, cmd := range []string{"decode-instance", "prefill-rank"} {
		_, err := run(t, cmd, "--transport", "loopback")
		if assert.Error(t, err, cmd) {
			assert.Contains(t, err.Error(), "--etcd is required", cmd)
		}
	}
}

// TestClusterNodesRefuseBadFlags: each node says what is wrong before it
// starts anything.
func TestClusterNodesRefuseBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prefill-rank", "--etcd", "http://127.0.0.1:1", "--link-gbps", "9"}, "--link-gbps: prefill-rank does not take it"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--etcd-tls-dir", "/x", "--etcd-key", "k"}, "give one or the other"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--etcd-tls-dir", "/nonexistent"}, "/nonexistent/ca.pem"},
		{[]string{"decode-instance", "--etcd", "https://127.0.0.1:1", "--etcd-cert", "c"}, "go together"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--room-timeout", "-1s"}, "--room-timeout -1s: want 0 (rooms never time out) or more"},
	} {
		_, err := run(t, tc.args...)
		if assert.Error(t, err, "%v", tc.args) {
			assert.Contains(t, err.Error(), tc.want, "%v", tc.args)
		}
	}
}

// TestHelpGroupsFlags: the cluster commands' help lists flags by group
// (cluster, transport, TLS, model, run, operations), names a value's
// placeholder (never the "kvstream certs" of a backquoted command), and
// leaves out the shared flags the command ignores.
func TestHelpGroupsFlags(t *testing.T) {
	for _, tc := range []struct {
		cmd            string
		groups, hidden []string
	}{
		{"up", []string{"Cluster flags:", "Transport flags:", "Model and workload flags:", "Run flags:", "Operations flags:"}, []string{"--link-gbps", "--time-scale", "--cp-rank", "--cp int"}},
		{"decode-instance", []string{"Cluster flags:", "Transport flags:", "TLS flags:", "Model and workload flags:", "Operations flags:"}, nil},
		{"prefill-rank", []string{"Cluster flags:", "Transport flags:", "TLS flags:", "Model and workload flags:", "Operations flags:"}, []string{"--link-gbps", "--link-latency-us", "--time-scale"}},
		{"decode", nil, nil},
		{"prefill", nil, nil},
	} {
		out, err := run(t, tc.cmd, "--help")
		require.NoError(t, err)
		last := -1
		for _, g := range tc.groups {
			i := strings.Index(out, g)
			if assert.GreaterOrEqual(t, i, 0, "%s --help lacks %q:\n%s", tc.cmd, g, out) {
				assert.Greater(t, i, last, "%s: %q out of order", tc.cmd, g)
				last = i
			}
		}
		_, usage, ok := strings.Cut(out, "Usage:")
		require.True(t, ok, "%s --help has no usage", tc.cmd)
		for _, h := range tc.hidden {
			assert.NotContains(t, usage, h, "%s --help lists a flag it ignores", tc.cmd)
		}
		assert.NotContains(t, out, "kvstream certs:", tc.cmd)
		assert.NotRegexp(t, `--tls-dir kvstream`, out, tc.cmd)
		if strings.Contains(out, "--tls-dir") {
			assert.Contains(t, out, "--tls-dir DIR", tc.cmd)
		}
		if strings.Contains(out, "--heartbeat ") {
			assert.Contains(t, out, "--heartbeat-interval", tc.cmd)
		}
	}
}
