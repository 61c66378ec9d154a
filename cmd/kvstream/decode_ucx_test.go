//go:build ucx

package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/kvstream/kvstream/decode"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sessionActor is the prefill session actor a decode started with
// --verbose logs when it opens a session.
var sessionActor = regexp.MustCompile(`prefill session.*"actor": "([^"/]+)/([^"]+)"`)

// streaming is a prefill slow enough to be mid-transfer for seconds.
var streaming = []string{"--model", "small", "--requests", "4", "--prompt-tokens", "8192", "--chunk-tokens", "1024",
	"--page-size", "16", "--layer-us-per-ktok", "3000"}

// TestUCXForgedTerminatedDuringTransfer: one protoactor Terminated naming
// the prefill's session actor, sent in the clear by another local process
// while the prefill streams over UCX, used to make the decode declare the
// session lost and unmap its pool under the prefill's writes (SIGSEGV in
// libucs, 3 of 3). A Terminated is a suspicion the heartbeats settle: the
// decode stays up and the prefill completes byte-equal.
func TestUCXForgedTerminatedDuringTransfer(t *testing.T) {
	env := []string{"UCX_TLS=tcp"}
	dec := startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "3m", "--verbose")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	pre := startCLI(t, env, append([]string{"prefill", "--decode", addr}, streaming...)...)
	m := dec.waitLine(t, sessionActor, time.Minute)
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)
	forged := batch(actor.NewPID(addr, decode.ServerActor), actor.NewPID(m[1], "rogue"), &actor.Terminated{Who: actor.NewPID(m[1], m[2])})
	for range 3 {
		require.NoError(t, attacker{t: t, addr: addr}.send(forged), "the server answers for itself; the node cuts no stream")
	}
	require.NoError(t, pre.wait(t, 3*time.Minute), "prefill:\n%s\n%s", pre.out(), pre.errOut())
	require.NoError(t, dec.wait(t, time.Minute), "decode:\n%s\n%s", dec.out(), dec.errOut())
	assert.Contains(t, pre.out(), "0 chunks failed")
	assert.Contains(t, pre.out(), "bytes equal: true")
	assert.Regexp(t, `decode: served 1 sessions \(1 complete\): 32 chunks \(0 not successful\), 4 rooms complete, \d+ pages verified, bytes equal: true`, dec.out())
	assert.Contains(t, dec.errOut(), "prefill session actor reported gone; the session goes on")
}

// TestUCXPrefillCutOffWhileWriting: the decode really declares its prefill
// lost (a test hook cuts it off after two chunks) while the prefill keeps
// writing. Nothing crashes. Over TCP the prefill's access point is revoked
// (its UCX worker destroyed): its rooms fail as lost, quiet, and the next
// prefill is served byte-equal on the same pages. Over shared memory the
// prefill may write the pool itself, which no revocation stops: its rooms
// are reported not quiesced, their pages are kept out for good, and the
// next prefill, whose schedule names the same pages, is refused them.
func TestUCXPrefillCutOffWhileWriting(t *testing.T) {
	for _, tls := range []string{"tcp", "sm,self"} {
		t.Run(strings.ReplaceAll(tls, ",", "+"), func(t *testing.T) {
			env := []string{"UCX_TLS=" + tls}
			dec := startCLI(t, append(env, disconnectAfterEnv+"=2"), "decode", "--listen", "127.0.0.1:0", "--sessions", "2", "--wait", "3m")
			addr := dec.waitLine(t, listening, 30*time.Second)[1]
			pre := startCLI(t, env, append([]string{"prefill", "--decode", addr, "--finish-timeout", "10s"}, streaming...)...)
			require.Error(t, pre.wait(t, 3*time.Minute), "the prefill that was cut off cannot succeed")
			dec.waitLine(t, regexp.MustCompile(`session of .* ended lost: .*cut off by `+disconnectAfterEnv), time.Minute)

			// The same geometry (so the same pool, and the same pages), at
			// full speed.
			next := startCLI(t, env, append([]string{"prefill", "--decode", addr}, append(streaming[:len(streaming)-2:len(streaming)-2], "--layer-us-per-ktok", "0")...)...)
			nextErr := next.wait(t, 3*time.Minute)
			decErr := dec.wait(t, time.Minute)
			if tls == "tcp" {
				require.NoError(t, nextErr, "prefill:\n%s\n%s", next.out(), next.errOut())
				assert.Contains(t, next.out(), "bytes equal: true")
				assert.NotContains(t, dec.errOut(), "access could not be revoked")
				assert.Regexp(t, `decode: served 2 sessions \(1 complete, 1 lost\)`, dec.out())
				require.Error(t, decErr, "one of its 2 sessions was lost")
				return
			}
			require.Error(t, nextErr, "the next prefill names pages kept out for good")
			assert.Contains(t, dec.errOut(), "its prefill's access could not be revoked", "the lost prefill's rooms are not quiesced")
			assert.Contains(t, next.out()+next.errOut(), "kept out for good")
			require.Error(t, decErr)
		})
	}
}
