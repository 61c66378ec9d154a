package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kvstream/kvstream/decode"
	"github.com/kvstream/kvstream/lab/simsession"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// TestDecodeSessionBoundFlags: --max-rooms-per-session and
// --max-chunks-per-room reach the decode process's configuration (0 or
// absent: decode's default, which the help names), and a value decode.New
// would refuse is refused first, naming the flag and the value.
func TestDecodeSessionBoundFlags(t *testing.T) {
	parse := func(args ...string) (sessionBounds, error) {
		var b sessionBounds
		fl := pflag.NewFlagSet("decode", pflag.ContinueOnError)
		b.add(fl)
		require.NoError(t, fl.Parse(args))
		return b, b.check()
	}
	for _, tc := range []struct {
		args          []string
		rooms, chunks int
	}{
		{nil, 0, 0},
		{[]string{"--max-rooms-per-session", "16", "--max-chunks-per-room", "32"}, 16, 32},
		{[]string{"--max-rooms-per-session", "0", "--max-chunks-per-room", "0"}, 0, 0},
		{[]string{"--max-rooms-per-session", fmt.Sprint(decode.MaxRoomsPerSessionLimit), "--max-chunks-per-room", fmt.Sprint(decode.MaxChunksPerRoomLimit)},
			decode.MaxRoomsPerSessionLimit, decode.MaxChunksPerRoomLimit},
	} {
		b, err := parse(tc.args...)
		require.NoError(t, err, "%v", tc.args)
		var cfg simsession.DecodeProcessConfig
		b.apply(&cfg)
		require.Equal(t, tc.rooms, cfg.MaxRoomsPerSession, "%v", tc.args)
		require.Equal(t, tc.chunks, cfg.MaxChunksPerRoom, "%v", tc.args)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-rooms-per-session", "-1"}, "--max-rooms-per-session -1: want 0 (the default, 4096) to 16777216"},
		{[]string{"--max-rooms-per-session", "16777217"}, "--max-rooms-per-session 16777217: want 0 (the default, 4096) to 16777216"},
		{[]string{"--max-chunks-per-room", "-2"}, "--max-chunks-per-room -2: want 0 (the default, 8192) to 16777216"},
		{[]string{"--max-chunks-per-room", "16777217"}, "--max-chunks-per-room 16777217: want 0 (the default, 8192) to 16777216"},
	} {
		_, err := parse(tc.args...)
		require.EqualError(t, err, tc.want)
		// Both commands refuse it before they start anything (a
		// decode-instance without etcd would fail later, on etcd).
		for _, cmd := range [][]string{{"decode", "--listen", "127.0.0.1:0"}, {"decode-instance"}} {
			root := newRoot()
			root.SetArgs(append(cmd, tc.args...))
			require.EqualError(t, root.Execute(), tc.want, "%v", cmd)
		}
	}

	for _, cmd := range []string{"decode", "decode-instance"} {
		out, err := run(t, cmd, "--help")
		require.NoError(t, err)
		_, runFlags, ok := strings.Cut(out, "Run flags:")
		require.True(t, ok, "%s --help has no run flags:\n%s", cmd, out)
		require.Regexp(t, `--max-rooms-per-session int +the most rooms one prefill session may hold open.*\(0: the default, 4096\)`, runFlags, cmd)
		require.Regexp(t, `--max-chunks-per-room int +the most chunks one room may hold.*\(0: the default, 8192\)`, runFlags, cmd)
	}
}
