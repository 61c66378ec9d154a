package netsec

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckListen(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:9100", "127.0.0.2:0", "[::1]:9100", "localhost:9100"} {
		require.NoError(t, CheckListen(addr, false), addr)
	}
	for _, addr := range []string{"0.0.0.0:9100", ":9100", "[::]:9100", "10.0.0.7:9100", "decode-host:9100"} {
		err := CheckListen(addr, false)
		require.ErrorContains(t, err, `"`+addr+`"`)
		require.ErrorContains(t, err, "TLS")
		require.NoError(t, CheckListen(addr, true), addr)
	}
	require.ErrorContains(t, CheckListen("no-port", true), `"no-port"`)
}

// RemoteOptions applies the rule before building anything.
func TestRemoteOptionsRefusesClearTextOffLoopback(t *testing.T) {
	_, err := RemoteOptions(nil, "0.0.0.0:9100", Options{})
	require.ErrorContains(t, err, `"0.0.0.0:9100"`)
	_, err = RemoteOptions(nil, "127.0.0.1:0", Options{Limits: Limits{MaxRecvMsgSize: -1}})
	require.ErrorContains(t, err, "MaxRecvMsgSize -1")
}
