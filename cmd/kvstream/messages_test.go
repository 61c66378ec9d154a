package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvstream/kvstream/netsec"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCommandsNameWhatIsWrong: each refusal names the argument or flag,
// its value and the bound or the choices, before any work starts, and
// the process exits non-zero.
func TestCommandsNameWhatIsWrong(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM"), 0o600))
	certs, err := netsec.GenerateDevCerts(filepath.Join(t.TempDir(), "c"), []string{"n"}, nil)
	require.NoError(t, err)
	certPath := certs["n"].Cert
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay"}, "replay: missing FILE: the trace file to replay (usage: kvstream replay FILE [flags])"},
		{[]string{"replay", "a", "b"}, `replay: one FILE (the trace file to replay), got 2 arguments: ["a" "b"]`},
		{[]string{"certs"}, "certs: missing DIR: the directory to write the certificates into"},
		{[]string{"bench", "bogus"}, `bench "bogus": no such benchmark: want host, scale or transport`},
		{[]string{"decode", "--transport", "loopback"}, "--transport loopback does not cross processes: decode needs ucx"},
		{[]string{"prefill", "--transport", "loopback"}, "--transport loopback does not cross processes: prefill needs ucx"},
		{[]string{"prefill", "--transport", "loopback", "--model", "tiny-gqa"}, "--transport loopback does not cross processes: prefill needs ucx"},
		{[]string{"up", "--member-ttl", "100ms"}, "--member-ttl 100ms: want whole seconds from 1s to 1h0m0s (etcd counts a lease's TTL in seconds)"},
		{[]string{"up", "--member-ttl", "2500ms"}, "--member-ttl 2.5s: want whole seconds"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--member-ttl", "500ms"}, "--member-ttl 500ms: want whole seconds"},
		{[]string{"prefill-rank", "--etcd", "http://127.0.0.1:1", "--member-ttl", "2h"}, "--member-ttl 2h0m0s: want whole seconds from 1s to 1h0m0s"},
		{[]string{"up", "--etcd", "http://127.0.0.1:1", "--etcd-ca", filepath.Join(missing, "ca.pem")}, "--etcd-ca: " + filepath.Join(missing, "ca.pem") + ": stat"},
		{[]string{"up", "--etcd", "http://127.0.0.1:1", "--etcd-ca", garbage}, "--etcd-ca " + garbage + ": etcd TLS: CA file " + garbage + " holds no PEM certificate"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--etcd-tls-dir", missing}, "--etcd-tls-dir: " + filepath.Join(missing, "ca.pem")},
		{[]string{"prefill-rank", "--etcd", "http://127.0.0.1:1", "--etcd-cert", garbage, "--etcd-key", garbage}, "--etcd-cert " + garbage + ", --etcd-key " + garbage + ": etcd TLS: certificate"},
		// Read through a bound: /dev/zero grew the process without one.
		{[]string{"up", "--etcd", "http://127.0.0.1:1", "--etcd-ca", "/dev/zero"}, "--etcd-ca /dev/zero: etcd TLS: CA file /dev/zero: longer than the bound of 1 MiB for a PEM file"},
		{[]string{"decode-instance", "--etcd", "http://127.0.0.1:1", "--etcd-cert", "/dev/zero", "--etcd-key", "/dev/zero"}, "--etcd-cert /dev/zero: etcd TLS: certificate file /dev/zero: longer than the bound of 1 MiB"},
		{[]string{"prefill-rank", "--etcd", "http://127.0.0.1:1", "--etcd-cert", certPath, "--etcd-key", "/dev/zero"}, "--etcd-key /dev/zero: etcd TLS: key file /dev/zero: longer than the bound of 1 MiB"},
		{append(append([]string{}, quick...), "--plot", filepath.Join(missing, "t.png")),
			`--plot "` + filepath.Join(missing, "t.png") + `": directory "` + missing + `" does not exist`},
		{append(append([]string{}, quick...), "--trace-out", filepath.Join(missing, "t.json")), `--trace-out "` + filepath.Join(missing, "t.json") + `": directory`},
		{append(append([]string{}, quick...), "--record", filepath.Join(missing, "t.jsonl")), `--record "` + filepath.Join(missing, "t.jsonl") + `": directory`},
	} {
		out, err := run(t, tc.args...)
		require.Error(t, err, "%v: %s", tc.args, out)
		assert.Contains(t, err.Error(), tc.want, "%v", tc.args)
		assert.NotContains(t, out, "bytes equal", "%v: refused before the run", tc.args)
		root := newRoot()
		root.SetArgs(tc.args)
		root.SetOut(&bytes.Buffer{})
		var stderr bytes.Buffer
		assert.Equal(t, 1, execute(root, &stderr), "%v: the exit status", tc.args)
		assert.Contains(t, stderr.String(), tc.want, "%v", tc.args)
	}
	// Without a subcommand, bench prints its help and succeeds.
	out, err := run(t, "bench")
	require.NoError(t, err)
	assert.Contains(t, out, "kvstream bench transport")
}
