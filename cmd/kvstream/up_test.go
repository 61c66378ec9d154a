package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
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
