package soak

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
)

// maxOutput bounds the output a child keeps: its last bytes.
const maxOutput = 64 << 10

// child is a process of the kvstream binary that the soak started: what it
// printed (stdout and stderr together, the last maxOutput bytes), and how
// it ended.
type child struct {
	cmd     *exec.Cmd
	started time.Time

	mu      sync.Mutex
	out     []byte
	partial []byte // a line not ended yet
	onLine  func(string)

	done chan struct{} // closed once it exited; then err and end
	err  error
	end  time.Time
}

// startChild starts the kvstream binary with args; onLine, if set, hears
// every line it prints (from the goroutine that reads them).
func startChild(command func(...string) *exec.Cmd, onLine func(string), args ...string) (*child, error) {
	c := &child{cmd: command(args...), onLine: onLine, done: make(chan struct{})}
	// One writer for both: exec then reads them through one pipe, one
	// goroutine, so that lines arrive whole and in order.
	c.cmd.Stdout, c.cmd.Stderr = c, c
	setDeathSignal(c.cmd)
	if err := c.cmd.Start(); err != nil {
		return nil, errors.Wrapf(err, "start %s", strings.Join(args, " "))
	}
	c.started = time.Now()
	go func() {
		err := c.cmd.Wait()
		c.mu.Lock()
		if len(c.partial) > 0 && c.onLine != nil {
			line := string(c.partial)
			c.partial = nil
			c.mu.Unlock()
			c.onLine(line)
			c.mu.Lock()
		}
		c.err, c.end = err, time.Now()
		c.mu.Unlock()
		close(c.done)
	}()
	return c, nil
}

// Write takes the child's output.
func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.out = append(c.out, p...)
	if len(c.out) > maxOutput {
		c.out = append(c.out[:0], c.out[len(c.out)-maxOutput:]...)
	}
	var lines []string
	if c.onLine != nil {
		c.partial = append(c.partial, p...)
		for {
			i := bytes.IndexByte(c.partial, '\n')
			if i < 0 {
				break
			}
			lines = append(lines, string(c.partial[:i]))
			c.partial = c.partial[i+1:]
		}
		c.partial = append([]byte(nil), c.partial...)
	}
	c.mu.Unlock()
	for _, l := range lines {
		c.onLine(l)
	}
	return len(p), nil
}

// output is what it printed so far (its last maxOutput bytes).
func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return string(c.out)
}

// wait waits up to bound for the process to exit; it reports whether it
// did.
func (c *child) wait(bound time.Duration) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
		return false
	}
}

// exited reports whether the process exited, and how.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		c.mu.Lock()
		defer c.mu.Unlock()
		return true, c.err
	default:
		return false, nil
	}
}

// ended is when it exited (zero while it runs).
func (c *child) ended() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.end
}

// signal sends sig; it reports whether the process was still there to
// take it (not yet reaped: a process that just exited takes it harmlessly,
// and its exit status says so).
func (c *child) signal(sig syscall.Signal) bool {
	if done, _ := c.exited(); done {
		return false
	}
	return c.cmd.Process.Signal(sig) == nil
}

// killedBy reports whether the process ended by sig.
func (c *child) killedBy(sig syscall.Signal) bool {
	done, err := c.exited()
	var ee *exec.ExitError
	if !done || !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// kill ends the process, if it still runs, and waits for it (bounded).
func (c *child) kill() {
	c.signal(syscall.SIGKILL)
	c.wait(30 * time.Second)
}
