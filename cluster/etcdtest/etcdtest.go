package etcdtest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StartTimeout bounds how long etcd may take to answer its health check.
const StartTimeout = 20 * time.Second

// Binary returns the etcd binary: $ETCD_BIN, else etcd on PATH.
func Binary() (string, error) {
	if b := os.Getenv("ETCD_BIN"); b != "" {
		return b, nil
	}
	return exec.LookPath("etcd")
}

// Server is one etcd process owned by a test.
type Server struct {
	t         testing.TB
	bin, dir  string
	clientURL string
	peerURL   string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been reaped
	log    *boundedBuffer
}

// Start runs etcd and waits until it is healthy; the test is skipped, with
// the reason, when there is no etcd binary. The server is killed and reaped
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Skipf("etcd binary not found (%v): install the Debian package etcd-server or set ETCD_BIN", err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Stop)
	// Another process may take a port between our probe and etcd's bind:
	// try fresh ports a few times.
	var last error
	for range 3 {
		c, p, err := freePorts()
		if err != nil {
			t.Fatalf("etcdtest: free ports: %v", err)
		}
		s.clientURL = fmt.Sprintf("http://127.0.0.1:%d", c)
		s.peerURL = fmt.Sprintf("http://127.0.0.1:%d", p)
		if last = s.start(); last == nil {
			return s
		}
	}
	t.Fatalf("etcdtest: %v", last)
	return nil
}

// Endpoint is the client URL to give an etcd client.
func (s *Server) Endpoint() string { return s.clientURL }

func freePorts() (int, int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range 2 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, 0, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports[0], ports[1], nil
}

// start runs the process on s's ports and data directory (a restart reuses
// both, so the data survives) and waits for its health check.
func (s *Server) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return fmt.Errorf("etcd already running")
	}
	cmd := exec.Command(s.bin,
		"--name", "etcdtest",
		"--data-dir", s.dir,
		"--listen-client-urls", s.clientURL,
		"--advertise-client-urls", s.clientURL,
		"--listen-peer-urls", s.peerURL,
		"--initial-advertise-peer-urls", s.peerURL,
		"--initial-cluster", "etcdtest="+s.peerURL,
		// A single member elects itself; short ticks make (re)starts and
		// the minimum lease TTL (1.5 election timeouts) short too.
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "error",
	)
	s.log = &boundedBuffer{max: 64 << 10}
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.cmd, s.exited = cmd, exited
	if err := waitHealthy(s.clientURL, exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		s.cmd = nil
		return fmt.Errorf("etcd on %s: %w; its output:\n%s", s.clientURL, err, s.log.String())
	}
	return nil
}

func waitHealthy(clientURL string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	cl := &http.Client{Timeout: time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		if resp, err := cl.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"true"`) {
				cl.CloseIdleConnections()
				return nil
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("exited before it was healthy")
		case <-ctx.Done():
			return fmt.Errorf("not healthy within %v", StartTimeout)
		case <-tick.C:
		}
	}
}

// Stop kills etcd (SIGKILL, as a crash would) and reaps it; the data
// directory stays for Restart. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts etcd again on the same ports and data directory, and
// waits until it is healthy.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Pause freezes etcd (SIGSTOP): its sockets stay open but nothing answers,
// like a host that hangs. It returns once the kernel reports the process
// stopped (a group stop is asynchronous: a thread can still serve a request
// just after the signal was sent). Resume undoes it.
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP)
	s.mu.Lock()
	pid := s.cmd.Process.Pid
	s.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !stopped(pid) {
		if time.Now().After(deadline) {
			s.t.Fatalf("etcdtest: etcd (pid %d) not stopped 5s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
}

// stopped reads the process state from /proc: 'T' is stopped by a signal.
// Every thread must have stopped, not only the main one.
func stopped(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, task := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, task.Name()))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'T' {
			return false
		}
	}
	return true
}

// Resume continues a paused etcd (SIGCONT).
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		s.t.Fatalf("etcdtest: %v: etcd is not running", sig)
	}
	if err := s.cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("etcdtest: %v: %v", sig, err)
	}
}

// Output is what etcd printed (its last 64 KiB), for failure messages.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

// boundedBuffer keeps the last max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if over := w.b.Len() - w.max; over > 0 {
		w.b.Next(over)
	}
	return len(p), nil
}

func (w *boundedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
