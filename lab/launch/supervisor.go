package launch

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/cluster"
)

// ChildSpec is one node process: its identity, role, CP rank (prefill)
// and the arguments of the binary that runs it.
type ChildSpec struct {
	ID   string
	Role cluster.Role
	Rank int
	Args []string
	// Env is added to the supervisor's environment for this node.
	Env []string
}

// ChildEvent is what the supervisor hears from a node: an event line, or
// the process's exit.
type ChildEvent struct {
	ID    string
	Role  cluster.Role
	Rank  int
	Event Event
	// Exit: the process ended (Event is empty); ExitErr is its status.
	Exit    bool
	ExitErr error
}

// ChildState is what the supervisor knows of a node now.
type ChildState struct {
	Spec ChildSpec
	Pid  int
	// Addr is the control-plane address its running process announced
	// ("ready"); "" until then, and after a restart until the new process
	// announces its own.
	Addr string
	// Running: started and not exited. Gone: exited and not restarted.
	Running, Gone bool
	Row           *Row
}

// Supervisor runs node processes of one binary: it starts them with their
// stdin a pipe (commands) and their stdout read as events, restarts one
// under the same id, kills one, and stops them all in order. Events come
// out of Events in the order each node wrote them.
type Supervisor struct {
	exe    string
	env    []string
	stderr io.Writer
	events chan ChildEvent

	// runMu orders starts against Stop: no process starts once Stop
	// began, so Stop ends every process there is.
	runMu     sync.RWMutex
	readers   sync.WaitGroup
	closeOnce sync.Once

	mu       sync.Mutex
	children map[string]*child
	stopping atomic.Bool // Stop or Cut began: no process starts
	stopped  atomic.Bool // Stop began
	cutters  sync.WaitGroup
}

// child is one node's process and what it announced.
type child struct {
	spec ChildSpec

	mu     sync.Mutex
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	addr   string
	row    *Row
	stderr bytes.Buffer
	exited chan struct{}
	gone   bool
}

// NewSupervisor runs nodes of the binary exe with env (nil: this
// process's); their stderr goes to stderr, each chunk prefixed with the
// node's id, and the last 256 KiB of each is kept for errors.
func NewSupervisor(exe string, env []string, stderr io.Writer) *Supervisor {
	if env == nil {
		env = os.Environ()
	}
	if stderr == nil {
		stderr = io.Discard
	}
	return &Supervisor{exe: exe, env: env, stderr: stderr, events: make(chan ChildEvent, 1024), children: map[string]*child{}}
}

// Events delivers every node's events and exits. Read it until the
// supervisor is stopped: a node blocks on its stdout otherwise.
func (s *Supervisor) Events() <-chan ChildEvent { return s.events }

// Start starts a node. Its id must be new.
func (s *Supervisor) Start(spec ChildSpec) error {
	s.mu.Lock()
	if s.children[spec.ID] != nil {
		s.mu.Unlock()
		return errors.Newf("node %s: already started", spec.ID)
	}
	c := &child{spec: spec}
	s.children[spec.ID] = c
	s.mu.Unlock()
	return s.run(c)
}

// Restart starts node id's process again with its arguments, once its
// previous process exited.
func (s *Supervisor) Restart(id string) error {
	c := s.child(id)
	if c == nil {
		return errors.Newf("restart %s: no such node", id)
	}
	c.mu.Lock()
	exited := c.exited
	c.mu.Unlock()
	if exited != nil {
		<-exited
	}
	return s.run(c)
}

func (s *Supervisor) child(id string) *child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.children[id]
}

func (s *Supervisor) run(c *child) error {
	s.runMu.RLock()
	defer s.runMu.RUnlock()
	if s.stopping.Load() {
		return errors.Newf("start %s: the supervisor is stopping", c.spec.ID)
	}
	cmd := exec.Command(s.exe, c.spec.Args...)
	cmd.Env = append(append([]string(nil), s.env...), c.spec.Env...)
	cmd.SysProcAttr = childAttr()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	c.mu.Lock()
	c.stderr.Reset()
	cmd.Stderr = io.MultiWriter(&lockedWriter{mu: &c.mu, w: &c.stderr}, &prefixWriter{prefix: c.spec.ID + ": ", w: s.stderr})
	c.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return errors.Wrapf(err, "start node %s", c.spec.ID)
	}
	exited := make(chan struct{})
	c.mu.Lock()
	// No address until the new process announces it: the old one's
	// registration may still be listed.
	c.cmd, c.stdin, c.exited, c.gone, c.row, c.addr = cmd, stdin, exited, false, nil, ""
	c.mu.Unlock()
	id, role, rank := c.spec.ID, c.spec.Role, c.spec.Rank
	s.readers.Add(1)
	go func() {
		defer s.readers.Done()
		_ = ReadEvents(stdout, func(e Event) {
			c.mu.Lock()
			switch e.Event {
			case EventReady:
				c.addr = e.Addr
			case EventNode:
				c.row = e.Row
			}
			c.mu.Unlock()
			s.events <- ChildEvent{ID: id, Role: role, Rank: rank, Event: e}
		}, nil)
		werr := cmd.Wait()
		c.mu.Lock()
		c.gone = true
		c.mu.Unlock()
		close(exited)
		s.events <- ChildEvent{ID: id, Role: role, Rank: rank, Exit: true, ExitErr: werr}
	}()
	return nil
}

// Send writes one command line to node id's stdin.
func (s *Supervisor) Send(id, line string) error {
	c := s.child(id)
	if c == nil {
		return errors.Newf("send to %s: no such node", id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stdin == nil {
		return errors.Newf("send to %s: not started", id)
	}
	_, err := fmt.Fprintln(c.stdin, line)
	return errors.Wrapf(err, "send %q to %s", line, id)
}

// Kill sends SIGKILL to node id's process, as a crash would, and returns
// its pid.
func (s *Supervisor) Kill(id string) (int, error) {
	c := s.child(id)
	if c == nil {
		return 0, errors.Newf("kill %s: no such node", id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return 0, errors.Newf("kill %s: not started", id)
	}
	return c.cmd.Process.Pid, c.cmd.Process.Kill()
}

// Term sends SIGTERM to node id's process, as an orchestrator stopping it
// does (it drains), and returns its pid.
func (s *Supervisor) Term(id string) (int, error) {
	c := s.child(id)
	if c == nil {
		return 0, errors.Newf("terminate %s: no such node", id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil || c.gone {
		return 0, errors.Newf("terminate %s: not running", id)
	}
	return c.cmd.Process.Pid, c.cmd.Process.Signal(syscall.SIGTERM)
}

// State is node id's state now (zero when there is no such node).
func (s *Supervisor) State(id string) ChildState {
	c := s.child(id)
	if c == nil {
		return ChildState{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	st := ChildState{Spec: c.spec, Addr: c.addr, Gone: c.gone, Running: c.cmd != nil && !c.gone, Row: c.row}
	if c.cmd != nil {
		st.Pid = c.cmd.Process.Pid
	}
	return st
}

// IDs lists the nodes of a role ("" for all), in id order.
func (s *Supervisor) IDs(role cluster.Role) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []string
	for id, c := range s.children {
		if role == "" || c.spec.Role == role {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids
}

// AnyGone reports the first node of a role ("" for any) whose process
// exited and was not restarted.
func (s *Supervisor) AnyGone(role cluster.Role) (string, bool) {
	for _, id := range s.IDs(role) {
		if s.State(id).Gone {
			return id, true
		}
	}
	return "", false
}

// Stopping reports whether Stop began: a node that exits now is not to be
// restarted.
func (s *Supervisor) Stopping() bool { return s.stopping.Load() }

// Stop ends every node in order: first the prefill ranks (stdin closed:
// they drain, say goodbye to their decode instances and print their row),
// then the decode instances (SIGTERM: they deregister and drain); a node
// that has not exited within grace is killed. It returns once every
// process exited. A second Stop does nothing.
func (s *Supervisor) Stop(grace time.Duration) {
	s.runMu.Lock()
	s.stopping.Store(true)
	already := s.stopped.Swap(true)
	s.runMu.Unlock()
	if already {
		return
	}
	var ranks, decodes []*child
	s.mu.Lock()
	for _, c := range s.children {
		if c.spec.Role == cluster.RolePrefill {
			ranks = append(ranks, c)
		} else {
			decodes = append(decodes, c)
		}
	}
	s.mu.Unlock()
	end := func(cs []*child, stop func(*child)) {
		var wait []*child
		for _, c := range cs {
			c.mu.Lock()
			started := c.cmd != nil
			c.mu.Unlock()
			if started {
				stop(c)
				wait = append(wait, c)
			}
		}
		// One deadline for them all, and a kill for each one still there
		// at it: a timer's channel fires once, so a second node that
		// ignored its stop was waited for without bound.
		deadline := time.NewTimer(grace)
		defer deadline.Stop()
		late := false
		for _, c := range wait {
			c.mu.Lock()
			exited, p := c.exited, c.cmd.Process
			c.mu.Unlock()
			if !late {
				select {
				case <-exited:
					continue
				case <-deadline.C:
					late = true
				}
			}
			select {
			case <-exited:
			default:
				_ = p.Kill()
				<-exited
			}
		}
	}
	end(ranks, func(c *child) { c.mu.Lock(); _ = c.stdin.Close(); c.mu.Unlock() })
	end(decodes, func(c *child) { c.mu.Lock(); _ = c.cmd.Process.Signal(syscall.SIGTERM); c.mu.Unlock() })
}

// Cut ends every node at once, as a second signal ends a command: each
// running node gets the end of its stdin and a SIGTERM, its two stops
// whatever it was told before (the second cuts its drain short), and
// SIGKILL if it has not exited within grace. It may run beside Stop, which
// it hurries; no process starts after it. It returns at once; the exits
// come on Events, and Close waits for them.
func (s *Supervisor) Cut(grace time.Duration) {
	s.runMu.Lock()
	s.stopping.Store(true)
	s.runMu.Unlock()
	s.mu.Lock()
	cs := make([]*child, 0, len(s.children))
	for _, c := range s.children {
		cs = append(cs, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		c.mu.Lock()
		if c.cmd == nil || c.gone {
			c.mu.Unlock()
			continue
		}
		_ = c.stdin.Close()
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		exited, p, id := c.exited, c.cmd.Process, c.spec.ID
		c.mu.Unlock()
		s.cutters.Go(func() {
			t := time.NewTimer(grace)
			defer t.Stop()
			select {
			case <-exited:
			case <-t.C:
				// A node that does not honour its own second stop.
				fmt.Fprintf(s.stderr, "%s: not exited %v after its cut: SIGKILL\n", id, grace)
				_ = p.Kill()
			}
		})
	}
}

// Stderrs is what the nodes wrote on stderr (the last 256 KiB of each),
// for an error that explains why the cluster did not come up.
func (s *Supervisor) Stderrs() string {
	var b bytes.Buffer
	for _, id := range s.IDs("") {
		c := s.child(id)
		c.mu.Lock()
		if c.stderr.Len() > 0 {
			fmt.Fprintf(&b, "--- %s:\n%s", id, c.stderr.String())
		}
		c.mu.Unlock()
	}
	return b.String()
}

// Rows are the nodes' rows (those that printed none get an empty row
// with their id and role), in role then id order.
func (s *Supervisor) Rows() []Row {
	var rows []Row
	for _, id := range s.IDs("") {
		st := s.State(id)
		row := Row{ID: id, Role: string(st.Spec.Role), Rank: st.Spec.Rank}
		if st.Row != nil {
			row = *st.Row
		}
		rows = append(rows, row)
	}
	slices.SortStableFunc(rows, func(a, b Row) int {
		if a.Role != b.Role {
			if a.Role < b.Role {
				return -1
			}
			return 1
		}
		return 0
	})
	return rows
}

// prefixWriter names the node on each chunk of its stderr.
type prefixWriter struct {
	prefix string
	w      io.Writer
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	_, _ = p.w.Write(append([]byte(p.prefix), b...))
	return len(b), nil
}

// lockedWriter keeps the first 256 KiB of a node's stderr.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 256<<10 {
		return len(p), nil
	}
	return l.w.Write(p)
}

// Close ends Events once every node's process exited and its events were
// delivered: call it after Stop.
func (s *Supervisor) Close() {
	s.Stop(0)
	s.readers.Wait()
	s.cutters.Wait()
	s.closeOnce.Do(func() { close(s.events) })
}
