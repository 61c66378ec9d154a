//go:build ucx

package main

import (
	"fmt"
	"net"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ssKill destroys the TCP connection between local ports a and b (both
// ends) with `ss -K`, the way a reset from the network would end it.
func ssKill(a, b int) error {
	filter := fmt.Sprintf("( ( sport = :%d and dport = :%d ) or ( sport = :%d and dport = :%d ) )", a, b, b, a)
	out, err := exec.Command("ss", "-K", "-tnH", filter).CombinedOutput()
	return errors.Wrapf(err, "ss -K %s: %s", filter, out)
}

// ssKillWorks says why `ss -K` cannot break a connection here, or nil: it
// needs the ss tool, CAP_NET_ADMIN and a kernel built with
// CONFIG_INET_DIAG_DESTROY.
func ssKillWorks() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := ssKill(c.LocalAddr().(*net.TCPAddr).Port, l.Addr().(*net.TCPAddr).Port); err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err = c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		return errors.New("ss -K destroyed nothing (a kernel without CONFIG_INET_DIAG_DESTROY, or no CAP_NET_ADMIN)")
	}
	return nil
}

// ssPorts lists the TCP sockets of process pid: listening ports, or for
// established connections (local, remote) port pairs.
func ssPorts(t *testing.T, pid int, listening bool) [][2]int {
	t.Helper()
	args := []string{"-tnpH", "state", "established"}
	col := 2
	if listening {
		args, col = []string{"-tlnpH"}, 3
	}
	out, err := exec.Command("ss", args...).Output()
	require.NoError(t, err)
	port := func(addr string) int {
		p, err := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
		if err != nil {
			return 0 // a listening socket's peer, "*"
		}
		return p
	}
	var ports [][2]int
	for _, l := range strings.Split(string(out), "\n") {
		fs := strings.Fields(l)
		if len(fs) < col+2 || !strings.Contains(l, fmt.Sprintf("pid=%d,", pid)) {
			continue
		}
		ports = append(ports, [2]int{port(fs[col]), port(fs[col+1])})
	}
	return ports
}

// unread sums the bytes waiting unread in the receive queues of process
// pid's established TCP sockets, but those of its control address's port.
func unread(t *testing.T, pid, control int) int {
	t.Helper()
	out, err := exec.Command("ss", "-tnpH", "state", "established").Output()
	require.NoError(t, err)
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		fs := strings.Fields(l) // Recv-Q Send-Q Local Peer Process
		if len(fs) < 4 || !strings.Contains(l, fmt.Sprintf("pid=%d,", pid)) {
			continue
		}
		q, qerr := strconv.Atoi(fs[0])
		p, perr := strconv.Atoi(fs[2][strings.LastIndex(fs[2], ":")+1:])
		if qerr == nil && perr == nil && p != control {
			n += q
		}
	}
	return n
}

// ucxAssertion finds UCX aborting on one of its own assertions in a
// process's output: UCX 1.13's TCP connection manager does now and then
// when a connection is destroyed under it (tcp_iface.c, tcp_cm.c), in
// either process. That is UCX's defect, not the engine's.
var ucxAssertion = regexp.MustCompile(`\S+\.c:\d+\s+Assertion .* failed.*`)

// TestUCXResumeAfterConnectionKilled: over UCX's TCP transport, the
// prefill's data connections to the decode process are destroyed from
// outside (`ss -K`, as a reset on the network would) while batches are in
// flight on them. Those batches fail as broken endpoints; the engine
// quiesces each broken endpoint, re-sends what did not land on a fresh
// one, and the prefill completes with no chunk failed and every page
// byte-equal in the decode process. An attempt in which UCX itself
// aborted (ucxAssertion) is run again, up to three times.
func TestUCXResumeAfterConnectionKilled(t *testing.T) {
	if err := ssKillWorks(); err != nil {
		t.Skipf("cannot break a TCP connection from outside here: %v", err)
	}
	var aborts []string
	for attempt := 1; attempt <= 3; attempt++ {
		dec, pre := streamAndKill(t)
		if m := ucxAssertion.FindString(pre.out() + pre.errOut() + dec.out() + dec.errOut()); m != "" {
			t.Logf("attempt %d: UCX aborted: %s", attempt, m)
			aborts = append(aborts, m)
			continue
		}
		require.NoError(t, pre.err, "prefill:\n%s\n%s", pre.out(), pre.errOut())
		require.NoError(t, dec.err, "decode:\n%s\n%s", dec.out(), dec.errOut())
		out := pre.out()
		t.Log(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
		assert.Contains(t, out, "0 chunks failed")
		assert.Contains(t, out, "bytes equal: true")
		assert.Regexp(t, `[1-9]\d* groups re-sent after a broken connection, [1-9]\d* chunks resumed`, out)
		assert.Regexp(t, `decode: served 1 sessions \(1 complete\): 128 chunks \(0 not successful\), 16 rooms complete, 147456 pages verified, bytes equal: true`, dec.out())
		return
	}
	t.Skipf("UCX aborted in every attempt, so the engine could not be judged: %s", strings.Join(aborts, "; "))
}

// streamAndKill runs a decode and a prefill process over UCX's TCP
// transport and, once the prefill streams, stops the decode process (so
// that the batches posted meanwhile stay in flight: their data in the
// socket buffers, their flush unanswered), destroys every data connection,
// both ends, and lets the decode process go on. It returns once both
// exited.
func streamAndKill(t *testing.T) (dec, pre *cli) {
	env := []string{"UCX_TLS=tcp"}
	dec = startCLI(t, env, "decode", "--listen", "127.0.0.1:0", "--sessions", "1", "--wait", "2m")
	addr := dec.waitLine(t, listening, 30*time.Second)[1]
	control, err := strconv.Atoi(addr[strings.LastIndex(addr, ":")+1:])
	require.NoError(t, err)
	pre = startCLI(t, env, "prefill", "--decode", addr, "--model", "small", "--requests", "16",
		"--prompt-tokens", "16384", "--chunk-tokens", "2048", "--page-size", "16", "--layer-us-per-ktok", "500",
		"--finish-timeout", "20s")
	pre.waitLine(t, regexp.MustCompile(`prefill: forward 2/\d+ done`), time.Minute)

	// The data connections: the prefill's connections to a port the decode
	// process listens on other than its control address (UCX's TCP
	// interface of the session's access point).
	decodePorts := map[int]bool{}
	for _, p := range ssPorts(t, dec.cmd.Process.Pid, true) {
		if p[0] != control {
			decodePorts[p[0]] = true
		}
	}
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGSTOP))
	// Break the connections only once batches are in flight on them:
	// bytes the stopped decode has not read wait in its data sockets.
	for deadline := time.Now().Add(time.Minute); unread(t, dec.cmd.Process.Pid, control) == 0; {
		if !time.Now().Before(deadline) {
			ss, _ := exec.Command("ss", "-tnpH", "state", "established").Output()
			require.Fail(t, "nothing reached the stopped decode's data sockets within a minute", "data ports %v; sockets:\n%s\nprefill:\n%s", decodePorts, ss, pre.out())
		}
		time.Sleep(10 * time.Millisecond)
	}
	kills := 0
	for _, c := range ssPorts(t, pre.cmd.Process.Pid, false) {
		if decodePorts[c[1]] {
			require.NoError(t, ssKill(c[0], c[1]))
			kills++
		}
	}
	require.NoError(t, dec.cmd.Process.Signal(syscall.SIGCONT))
	require.NotZero(t, kills, "the prefill had no data connection to break")
	t.Logf("destroyed %d data connections", kills)
	_ = pre.wait(t, 2*time.Minute)
	_ = dec.wait(t, time.Minute)
	return dec, pre
}
