package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvstream/kvstream/netsec"

	"github.com/stretchr/testify/require"
)

// TestNetFlagsNameTheFlag: every bad control or data plane flag of decode
// and prefill, and every bad flag of soak, is an error that names it,
// before anything is started.
func TestNetFlagsNameTheFlag(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM"), 0o600))
	certs, err := netsec.GenerateDevCerts(filepath.Join(dir, "certs"), []string{"decode"}, nil)
	require.NoError(t, err)
	ca := certs["decode"].CA
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
		{[]string{"decode", "--heartbeat", "2s", "--heartbeat-interval", "1500ms"}, "--heartbeat-interval 1.5s"},
		{[]string{"decode", "--heartbeat-interval", "1ms"}, "--heartbeat-interval"},
		// More misses than the node's bound (1000): named here, before the
		// metrics endpoint or the node starts, not by the node as
		// "--listen/--advertise: heartbeat: ...".
		{[]string{"decode", "--heartbeat", "10m", "--heartbeat-interval", "10ms"}, "--heartbeat 10m0s, --heartbeat-interval 10ms: 59999 unanswered heartbeats"},
		{[]string{"prefill", "--heartbeat", "20s", "--heartbeat-interval", "10ms"}, "--heartbeat 20s, --heartbeat-interval 10ms: 1999 unanswered heartbeats"},
		{[]string{"up", "--heartbeat", "10m", "--heartbeat-interval", "10ms"}, "--heartbeat-interval 10ms"},
		{[]string{"decode", "--data-addr", "127.0.0.3"}, "--data-addr 127.0.0.3: the UCX data plane would listen on 127.0.0.1"},
		{[]string{"decode", "--data-addr", "192.0.2.77"}, "--data-addr 192.0.2.77"},
		{[]string{"decode", "--max-pool-mib", "0"}, "--max-pool-mib"},
		{[]string{"decode", "--ucx-writes", "puts"}, `--ucx-writes "puts": want messages or rma`},
		{[]string{"prefill", "--ucx-writes", "RMA"}, `--ucx-writes "RMA": want messages or rma`},
		{[]string{"decode", "--tls-ca", "x"}, "--tls-key"},
		{[]string{"decode", "--tls-dir", dir, "--tls-ca", "x"}, "--tls-dir"},
		{[]string{"decode", "--tls-dir", filepath.Join(dir, "none")}, "--tls-dir: " + filepath.Join(dir, "none", "ca.pem") + ": stat "},
		{[]string{"decode", "--tls-ca", filepath.Join(dir, "no-ca.pem"), "--tls-cert", "c", "--tls-key", "k"}, "--tls-ca: " + filepath.Join(dir, "no-ca.pem")},
		{[]string{"prefill", "--tls-ca", garbage, "--tls-cert", garbage, "--tls-key", "k"}, "--tls-key: k"},
		{[]string{"prefill", "--tls-ca", garbage, "--tls-cert", garbage, "--tls-key", garbage}, "--tls-ca " + garbage + ": tls: CA file " + garbage + " holds no PEM certificate"},
		{[]string{"prefill", "--tls-ca", ca, "--tls-cert", garbage, "--tls-key", garbage}, "--tls-cert " + garbage + ", --tls-key " + garbage + ": tls: certificate"},
		// Read through a bound: /dev/zero grew decode past 4.2 GB.
		{[]string{"decode", "--tls-ca", "/dev/zero", "--tls-cert", "/dev/zero", "--tls-key", "/dev/zero"}, "--tls-ca /dev/zero: tls: CA file /dev/zero: longer than the bound of 1 MiB for a PEM file"},
		{[]string{"decode", "--tls-ca", ca, "--tls-cert", "/dev/zero", "--tls-key", "/dev/zero"}, "--tls-cert /dev/zero: tls: certificate file /dev/zero: longer than the bound of 1 MiB"},
		{[]string{"prefill", "--tls-ca", ca, "--tls-cert", certs["decode"].Cert, "--tls-key", "/dev/zero"}, "--tls-key /dev/zero: tls: key file /dev/zero: longer than the bound of 1 MiB"},
		{[]string{"decode", "--prefill-name", "prefill"}, "--prefill-name"},
		{[]string{"prefill", "--decode", "0.0.0.0:9100"}, "--decode"},
		{[]string{"prefill", "--decode", "nohostport"}, "--decode"},
		{[]string{"prefill", "--decode-name", ""}, "--decode-name"},
		{[]string{"prefill", "--listen", "10.1.2.3:0"}, "10.1.2.3:0"},
		{[]string{"certs", dir, "--nodes", "ca"}, "ca"},
		{[]string{"soak", "--mix", "clean=1,crash=1"}, `--mix "clean=1,crash=1": unknown kind "crash": want clean, kill, stop, pause-decode, vanish, refused or bye-writer`},
		{[]string{"soak", "--mix", "vanish=1"}, "--mix"},
		{[]string{"soak", "--for", "0s"}, "--for 0s"},
		{[]string{"soak", "--episodes", "-1"}, "--episodes -1"},
		{[]string{"soak", "--heartbeat", "10ms"}, "--heartbeat 10ms: want 500ms to 1m0s"},
		{[]string{"soak", "--max-fd-growth", "-1"}, "--max-fd-growth -1"},
		{[]string{"soak", "--scale", "0"}, "--scale 0"},
		{[]string{"soak", "--chunk-tokens", "8"}, "--chunk-tokens 8"},
		{[]string{"soak", "vanish", "--decode", "nohostport", "--name", "x"}, "--decode"},
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

// TestHeartbeatFlags: --heartbeat is the loss bound, --heartbeat-interval
// the pace; the number of unanswered heartbeats follows from both.
func TestHeartbeatFlags(t *testing.T) {
	for _, tc := range []struct {
		bound, interval time.Duration
		want            netsec.HeartbeatConfig
	}{
		{defaultHeartbeat, 0, netsec.HeartbeatConfig{Interval: defaultHeartbeat / 7, Misses: 6}},
		{10 * time.Second, time.Second, netsec.HeartbeatConfig{Interval: time.Second, Misses: 9}},
		{2 * time.Second, 500 * time.Millisecond, netsec.HeartbeatConfig{Interval: 500 * time.Millisecond, Misses: 3}},
		{0, 0, netsec.HeartbeatConfig{Misses: -1}},
	} {
		nf := netFlags{heartbeat: tc.bound, hbInterval: tc.interval}
		got, err := nf.heartbeatConfig()
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
		if tc.bound > 0 {
			require.LessOrEqual(t, got.Bound(), tc.bound, "lost within --heartbeat")
		}
	}
}

// TestDataAddrIsTheBoundAddress: --data-addr takes the address UCX binds
// on its interface (an interface's own address); any other address of the
// interface's network is refused naming the one UCX would bind, instead of
// silently listening elsewhere.
func TestDataAddrIsTheBoundAddress(t *testing.T) {
	require.NoError(t, checkDataAddr("127.0.0.1"))
	err := checkDataAddr("127.0.0.3")
	require.ErrorContains(t, err, "would listen on 127.0.0.1, the address of lo")
	require.ErrorContains(t, err, "give --data-addr 127.0.0.1")
	ifc, bound, err := interfaceAddr(net.ParseIP("127.0.0.3"))
	require.NoError(t, err)
	require.Equal(t, "lo", ifc)
	require.Equal(t, "127.0.0.1", bound.String())
}

// TestCertsRefusesBadHosts: kvstream certs --hosts takes IP addresses and
// host names; a port, a space, a wildcard or a malformed IP address (each
// once written into every certificate as a DNS name) is refused naming
// --hosts and the value, and nothing is written.
func TestCertsRefusesBadHosts(t *testing.T) {
	for _, h := range []string{"1.2.3.4:80", "a b", "*", "999.1.1.1", "*.example"} {
		dir := filepath.Join(t.TempDir(), "c")
		root := newRoot()
		root.SetArgs([]string{"certs", dir, "--hosts", "10.0.0.7," + h})
		err := root.Execute()
		require.Error(t, err, h)
		require.Contains(t, err.Error(), fmt.Sprintf("--hosts: host %q: want an IP address or a host name", h))
		require.NoDirExists(t, dir, "%s: nothing written", h)
	}
}

// TestHeartbeatMissesBound: --heartbeat / --heartbeat-interval - 1
// unanswered heartbeats may reach the node's bound (1000), not pass it.
func TestHeartbeatMissesBound(t *testing.T) {
	n := netFlags{heartbeat: 10010 * time.Millisecond, hbInterval: 10 * time.Millisecond}
	hb, err := n.heartbeatConfig()
	require.NoError(t, err)
	require.Equal(t, netsec.HeartbeatConfig{Interval: 10 * time.Millisecond, Misses: 1000}, hb)
	n.heartbeat += 10 * time.Millisecond
	_, err = n.heartbeatConfig()
	require.ErrorContains(t, err, "--heartbeat 10.02s, --heartbeat-interval 10ms: 1001 unanswered heartbeats")
}
