package etcdproc

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/internal/portlease"
)

// ErrNoBinary marks Start's failure to find an etcd binary.
var ErrNoBinary = errors.New("etcd binary not found")

// Binary returns the etcd binary: $ETCD_BIN, else etcd on PATH.
func Binary() (string, error) {
	name := "etcd"
	if b := os.Getenv("ETCD_BIN"); b != "" {
		name = b
	}
	b, err := exec.LookPath(name)
	if err != nil {
		return "", errors.Mark(errors.Wrap(err, "install the Debian package etcd-server or set ETCD_BIN"), ErrNoBinary)
	}
	return b, nil
}

// Options configures Start. Only DataDir is required.
type Options struct {
	// Binary is the etcd executable (Binary() when empty).
	Binary string
	// DataDir holds etcd's data; a restart on the same directory keeps it.
	DataDir string
	// ClientURL and PeerURL are where etcd listens ("http://127.0.0.1:2379");
	// empty picks a free loopback port for each.
	ClientURL, PeerURL string
	// HeartbeatMs and ElectionMs are etcd's raft ticks (etcd's defaults,
	// 100 and 1000, when zero). Short ticks shorten a restart and etcd's
	// minimum lease TTL (1.5 election timeouts).
	HeartbeatMs, ElectionMs int
	// StartTimeout bounds the wait for etcd's health check (20 s when zero).
	StartTimeout time.Duration
	// Output receives etcd's log (errors only) besides the last 64 KiB
	// Proc.Output keeps.
	Output io.Writer
	// TLS, when set, makes etcd serve its clients over TLS and require a
	// client certificate of the CA (the picked client URL is https).
	TLS *TLS
	// Args are further etcd flags, appended to those Start sets (a test
	// that needs "--strict-reconfig-check=false", say).
	Args []string
}

// TLS is etcd's client-facing TLS, as operators run it: its certificate
// and key, and the CA that every client's certificate must chain to
// (etcd's --cert-file, --key-file, --trusted-ca-file, --client-cert-auth).
type TLS struct {
	CertFile, KeyFile, CAFile string
	// ClientCertFile and ClientKeyFile are a client's, for the health
	// check (etcd refuses clients without one).
	ClientCertFile, ClientKeyFile string
}

// clientConfig is the health check's TLS: the CA, and a client
// certificate.
func (t *TLS) clientConfig() (*tls.Config, error) {
	ca, err := os.ReadFile(t.CAFile)
	if err != nil {
		return nil, errors.Wrap(err, "etcdproc: CA file")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return nil, errors.Newf("etcdproc: CA file %s holds no PEM certificate", t.CAFile)
	}
	cert, err := tls.LoadX509KeyPair(t.ClientCertFile, t.ClientKeyFile)
	if err != nil {
		return nil, errors.Wrap(err, "etcdproc: client certificate")
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

// Proc is one running (or stopped) etcd.
type Proc struct {
	o Options

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been reaped
	log    *boundedBuffer
}

// Start runs etcd and returns once it answers its health check. With free
// ports chosen here, a port another process took between the probe and
// etcd's bind is retried on fresh ports.
func Start(o Options) (*Proc, error) {
	if o.DataDir == "" {
		return nil, errors.New("etcdproc: no data directory")
	}
	if o.Binary == "" {
		b, err := Binary()
		if err != nil {
			return nil, err
		}
		o.Binary = b
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 20 * time.Second
	}
	pick := o.ClientURL == "" || o.PeerURL == ""
	attempts := 1
	if pick {
		attempts = 3
	}
	p := &Proc{o: o, log: &boundedBuffer{max: 64 << 10}}
	var last error
	for range attempts {
		var held []*portlease.Lease
		if pick {
			// Both ports are held for etcd (its listeners set
			// SO_REUSEADDR) until it started: no other bind or
			// connection is given them meanwhile.
			for range 2 {
				l, err := portlease.Take("127.0.0.1", true)
				if err != nil {
					release(held)
					return nil, errors.Wrap(err, "etcdproc: free ports")
				}
				held = append(held, l)
			}
			scheme := "http"
			if o.TLS != nil {
				scheme = "https"
			}
			p.o.ClientURL = fmt.Sprintf("%s://127.0.0.1:%d", scheme, held[0].Port)
			p.o.PeerURL = fmt.Sprintf("http://127.0.0.1:%d", held[1].Port)
		}
		last = p.start()
		release(held)
		if last == nil {
			return p, nil
		}
	}
	return nil, last
}

func release(ls []*portlease.Lease) {
	for _, l := range ls {
		l.Release()
	}
}

// Endpoint is the client URL to give an etcd client.
func (p *Proc) Endpoint() string { return p.o.ClientURL }

// start runs the process on p's URLs and data directory and waits for its
// health check.
func (p *Proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return errors.New("etcdproc: etcd already running")
	}
	args := []string{
		"--name", "kvstream",
		"--data-dir", p.o.DataDir,
		"--listen-client-urls", p.o.ClientURL,
		"--advertise-client-urls", p.o.ClientURL,
		"--listen-peer-urls", p.o.PeerURL,
		"--initial-advertise-peer-urls", p.o.PeerURL,
		"--initial-cluster", "kvstream=" + p.o.PeerURL,
		"--logger", "zap",
		"--log-outputs", "stderr",
		"--log-level", "error",
	}
	if p.o.HeartbeatMs > 0 {
		args = append(args, "--heartbeat-interval", fmt.Sprint(p.o.HeartbeatMs))
	}
	if p.o.ElectionMs > 0 {
		args = append(args, "--election-timeout", fmt.Sprint(p.o.ElectionMs))
	}
	var health *tls.Config
	if t := p.o.TLS; t != nil {
		args = append(args, "--cert-file", t.CertFile, "--key-file", t.KeyFile, "--trusted-ca-file", t.CAFile, "--client-cert-auth")
		var err error
		if health, err = t.clientConfig(); err != nil {
			return err
		}
	}
	args = append(args, p.o.Args...)
	cmd := exec.Command(p.o.Binary, args...)
	var out io.Writer = p.log
	if p.o.Output != nil {
		out = io.MultiWriter(p.log, p.o.Output)
	}
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return errors.Wrapf(err, "etcdproc: start %s", p.o.Binary)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	p.cmd, p.exited = cmd, exited
	if err := waitHealthy(p.o.ClientURL, health, exited, p.o.StartTimeout); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		p.cmd = nil
		return errors.Wrapf(err, "etcd on %s; its output:\n%s", p.o.ClientURL, p.log.String())
	}
	return nil
}

func waitHealthy(clientURL string, tlsc *tls.Config, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	cl := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: tlsc, DisableKeepAlives: true}}
	defer cl.CloseIdleConnections()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, clientURL+"/health", nil)
		if err != nil {
			return errors.Wrapf(err, "client URL %q", clientURL)
		}
		if resp, err := cl.Do(req); err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"true"`) {
				return nil
			}
		}
		select {
		case <-exited:
			return errors.New("exited before it was healthy")
		case <-ctx.Done():
			return errors.Newf("not healthy within %v", timeout)
		case <-tick.C:
		}
	}
}

// Kill stops etcd as a crash would (SIGKILL) and reaps it; the data
// directory stays for Restart. Killing a stopped etcd does nothing.
func (p *Proc) Kill() { p.stop(syscall.SIGKILL, 0) }

// Stop asks etcd to exit (SIGTERM), kills it if it has not within grace,
// and reaps it. Stopping a stopped etcd does nothing.
func (p *Proc) Stop(grace time.Duration) { p.stop(syscall.SIGTERM, grace) }

func (p *Proc) stop(sig syscall.Signal, grace time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	// A paused etcd would never act on SIGTERM.
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(sig)
	if sig != syscall.SIGKILL {
		select {
		case <-p.exited:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
		}
	}
	<-p.exited
	p.cmd = nil
}

// Restart starts etcd again on the same URLs and data directory, and waits
// until it is healthy.
func (p *Proc) Restart() error { return p.start() }

// Pause freezes etcd (SIGSTOP): its sockets stay open but nothing answers,
// like a host that hangs. It returns once the kernel reports every thread
// stopped (a group stop is asynchronous: a thread can still serve a request
// just after the signal was sent). Resume undoes it.
func (p *Proc) Pause() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("etcdproc: pause: etcd is not running")
	}
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return errors.Wrap(err, "etcdproc: pause")
	}
	pid := p.cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for !ThreadsStopped(pid) {
		if time.Now().After(deadline) {
			return errors.Newf("etcdproc: etcd (pid %d) not stopped 5s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// Resume continues a paused etcd (SIGCONT).
func (p *Proc) Resume() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return errors.New("etcdproc: resume: etcd is not running")
	}
	return errors.Wrap(p.cmd.Process.Signal(syscall.SIGCONT), "etcdproc: resume")
}

// ThreadsStopped reports whether every thread of process pid is stopped by
// a signal ('T' in /proc/PID/task/*/stat). kill(2) only queues a SIGSTOP:
// until the thread that takes it runs, the others go on, so whoever pauses
// a process to test what a hung peer does (Pause here; tests of other
// processes too) waits for this.
func ThreadsStopped(pid int) bool {
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

// Output is what etcd printed (its last 64 KiB), for error messages.
func (p *Proc) Output() string { return p.log.String() }

// boundedBuffer keeps the last max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	max int
	b   bytes.Buffer
}

func (w *boundedBuffer) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(b)
	if over := w.b.Len() - w.max; over > 0 {
		w.b.Next(over)
	}
	return len(b), nil
}

func (w *boundedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
