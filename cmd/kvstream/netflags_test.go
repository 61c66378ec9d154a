package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNetFlagsNameTheFlag: every bad control or data plane flag of decode
// and prefill is an error that names it, before anything is started.
func TestNetFlagsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"decode", "--listen", "nohostport"}, "--listen"},
		{[]string{"decode", "--listen", "127.0.0.1:99999"}, "--listen"},
		{[]string{"decode", "--listen", "0.0.0.0:0"}, "0.0.0.0:0"},
		{[]string{"decode", "--advertise", "[::]:9100"}, "--advertise"},
		{[]string{"decode", "--data-addr", "eth0"}, "--data-addr"},
		{[]string{"decode", "--heartbeat", "-1s"}, "--heartbeat"},
		{[]string{"decode", "--heartbeat", "1ms"}, "--heartbeat"},
		{[]string{"decode", "--wait", "-1s"}, "--wait"},
		{[]string{"decode", "--drain-timeout", "0s"}, "--drain-timeout"},
		{[]string{"decode", "--sessions", "-1"}, "--sessions"},
		{[]string{"decode", "--max-pool-mib", "0"}, "--max-pool-mib"},
		{[]string{"decode", "--tls-ca", "x"}, "--tls-key"},
		{[]string{"decode", "--tls-dir", dir, "--tls-ca", "x"}, "--tls-dir"},
		{[]string{"decode", "--tls-dir", filepath.Join(dir, "none")}, "--tls-*"},
		{[]string{"decode", "--prefill-name", "prefill"}, "--prefill-name"},
		{[]string{"prefill", "--decode", "0.0.0.0:9100"}, "--decode"},
		{[]string{"prefill", "--decode", "nohostport"}, "--decode"},
		{[]string{"prefill", "--decode-name", ""}, "--decode-name"},
		{[]string{"prefill", "--listen", "10.1.2.3:0"}, "10.1.2.3:0"},
		{[]string{"certs", dir, "--nodes", "ca"}, "ca"},
	} {
		root := newRoot()
		root.SetArgs(tc.args)
		err := root.Execute()
		require.Error(t, err, "%v", tc.args)
		require.Contains(t, err.Error(), tc.flag, "%v", tc.args)
	}
}

// TestCertsWritesFiles: `kvstream certs` writes what --tls-dir reads.
func TestCertsWritesFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "c")
	root := newRoot()
	root.SetArgs([]string{"certs", dir, "--hosts", "127.0.0.2"})
	require.NoError(t, root.Execute())
	for _, f := range []string{"ca.pem", "ca.key", "decode.pem", "decode.key", "prefill.pem", "prefill.key"} {
		require.FileExists(t, filepath.Join(dir, f))
	}
	var nf netFlags
	nf.listen, nf.tlsDir, nf.heartbeat = "127.0.0.1:0", dir, 0
	tlsm, err := nf.check("decode")
	require.NoError(t, err)
	require.NotNil(t, tlsm)
}
