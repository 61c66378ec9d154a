package etcdtest

import (
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/kvstream/kvstream/cluster/etcdproc"
)

// Server is one etcd process owned by a test.
type Server struct {
	t testing.TB
	p *etcdproc.Proc
}

// Start runs etcd and waits until it is healthy; the test is skipped, with
// the reason, when there is no etcd binary.
func Start(t testing.TB) *Server { t.Helper(); return start(t, nil) }

// StartTLS runs etcd as operators do, serving its clients over TLS only
// and requiring a client certificate of its CA (its certificate and key,
// the CA's and a client's, in tls; netsec.GenerateDevCerts writes such
// files). Its Endpoint is https.
func StartTLS(t testing.TB, tls etcdproc.TLS) *Server { t.Helper(); return start(t, &tls) }

func start(t testing.TB, tls *etcdproc.TLS) *Server {
	t.Helper()
	p, err := etcdproc.Start(etcdproc.Options{
		DataDir: t.TempDir(),
		// A single member elects itself; short ticks make (re)starts and
		// the minimum lease TTL (1.5 election timeouts: 1 s) short too.
		HeartbeatMs: 50,
		ElectionMs:  500,
		TLS:         tls,
	})
	if errors.Is(err, etcdproc.ErrNoBinary) {
		t.Skipf("etcd tests skipped: %v", err)
	}
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(p.Kill)
	return &Server{t: t, p: p}
}

// Endpoint is the client URL to give an etcd client.
func (s *Server) Endpoint() string { return s.p.Endpoint() }

// Stop kills etcd (SIGKILL, as a crash would) and reaps it; the data
// directory stays for Restart.
func (s *Server) Stop() { s.p.Kill() }

// Restart starts etcd again on the same ports and data directory.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.p.Restart(); err != nil {
		s.t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Pause freezes etcd (SIGSTOP) and returns once it is stopped.
func (s *Server) Pause() {
	s.t.Helper()
	if err := s.p.Pause(); err != nil {
		s.t.Fatalf("etcdtest: %v", err)
	}
}

// Resume continues a paused etcd (SIGCONT).
func (s *Server) Resume() {
	s.t.Helper()
	if err := s.p.Resume(); err != nil {
		s.t.Fatalf("etcdtest: %v", err)
	}
}

// Output is what etcd printed (its last 64 KiB), for failure messages.
func (s *Server) Output() string { return s.p.Output() }
