package soak

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"
)

// decodeProc is the decode process under test, as its output tells it: its
// addresses, the sessions it opened and ended (by the prefill's name), and
// whether it crashed.
type decodeProc struct {
	*child
	addr    string // its control plane
	metrics string // its operations endpoint, host:port

	mu       sync.Mutex
	open     map[string]int  // sessions opened and not ended, by prefill name
	opened   map[string]bool // every name that opened a session
	openedAt map[string]time.Time
	endedAt  map[string]time.Time
	outcome  map[string]string // how each name's last session ended
	changed  chan struct{}     // closed, and replaced, at every change
	crash    string            // the first line that says it crashed, or how it exited
	crashed  chan struct{}     // closed with crash
	summary  string            // its "decode: served ..." line
	stopping bool              // the soak sent SIGTERM: an exit is no crash
	paused   bool              // SIGSTOPped by a pause-decode: no /metrics
	tail     []string          // its last lines
	crashCtx []string          // the lines around its first crash line
	copyTo   io.Writer         // Config.DecodeOutput
}

// Lines of kvstream decode that the soak reads.
var (
	listeningLine = regexp.MustCompile(`^decode: listening on (\S+)`)
	metricsLine   = regexp.MustCompile(`serving metrics at http://(\S+)/metrics`)
	// The DEBUG line of a session opened (--verbose), its fields in JSON.
	openedLine = regexp.MustCompile(`\tprefill session\t(\{.*\})\s*$`)
	endedLine  = regexp.MustCompile(`^decode: session of (.+) ended (\w+): `)
	// A crash: UCX's fatal errors and failed assertions (then an abort),
	// Go's panics and fatal errors, signals UCX or Go caught, a panic the
	// decode recovered, a data race report (a binary built with -race).
	crashLine = regexp.MustCompile("Fatal|Assertion `|^panic: |fatal error: |SIGSEGV|SIGABRT|Caught signal|recovered a panic|handler panicked|WARNING: DATA RACE")
)

// Bounds of what is kept of the decode's output: its last lines, and
// around its first crash line the lines before and after it.
const (
	maxTail     = 40
	crashBefore = 10
	crashAfter  = 40
)

// startDecode starts kvstream decode as a service (no session bound, no
// wait) and waits for its addresses.
func startDecode(cfg *Config) (*decodeProc, error) {
	d := &decodeProc{copyTo: cfg.DecodeOutput, open: map[string]int{}, opened: map[string]bool{}, openedAt: map[string]time.Time{}, endedAt: map[string]time.Time{}, outcome: map[string]string{},
		changed: make(chan struct{}), crashed: make(chan struct{})}
	ready := make(chan struct{})
	var once sync.Once
	c, err := startChild(cfg.Command, func(line string) {
		if d.line(line) {
			once.Do(func() { close(ready) })
		}
	}, "decode", "--listen", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", "--heartbeat", cfg.Heartbeat.String(),
		"--drain-timeout", drainTimeout.String(), "--verbose")
	if err != nil {
		return nil, err
	}
	d.child = c
	go func() {
		<-c.done
		d.mu.Lock()
		if !d.stopping {
			d.crashLocked("exited before the soak stopped it: " + exitText(c.err))
		}
		d.mu.Unlock()
	}()
	t := time.NewTimer(startBound)
	defer t.Stop()
	select {
	case <-ready:
		return d, nil
	case <-d.crashed:
	case <-t.C:
	}
	c.kill()
	return nil, errors.Newf("soak: the decode process did not say where it listens within %v; it printed:\n%s", startBound, c.output())
}

// Bounds of the decode process's life.
const (
	startBound   = time.Minute
	drainTimeout = 10 * time.Second
)

// line reads one line of the decode's output; it reports whether both
// addresses are known.
func (d *decodeProc) line(l string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.copyTo != nil {
		fmt.Fprintln(d.copyTo, l)
	}
	d.tail = append(d.tail, l)
	if len(d.tail) > maxTail {
		d.tail = d.tail[1:]
	}
	if d.crash != "" && len(d.crashCtx) < crashBefore+1+crashAfter {
		d.crashCtx = append(d.crashCtx, l)
	}
	switch {
	case crashLine.MatchString(l):
		d.crashLocked(l)
	case listeningLine.MatchString(l):
		d.addr = listeningLine.FindStringSubmatch(l)[1]
	case metricsLine.MatchString(l):
		d.metrics = metricsLine.FindStringSubmatch(l)[1]
	case openedLine.MatchString(l):
		var f struct {
			Prefill string `json:"prefill"`
		}
		if json.Unmarshal([]byte(openedLine.FindStringSubmatch(l)[1]), &f) == nil {
			d.open[f.Prefill]++
			d.opened[f.Prefill] = true
			d.openedAt[f.Prefill] = time.Now()
			d.changedLocked()
		}
	case endedLine.MatchString(l):
		m := endedLine.FindStringSubmatch(l)
		if d.open[m[1]]--; d.open[m[1]] <= 0 {
			delete(d.open, m[1])
		}
		d.outcome[m[1]] = m[2]
		d.endedAt[m[1]] = time.Now()
		d.changedLocked()
	case strings.HasPrefix(l, "decode: served "):
		d.summary = l
	}
	return d.addr != "" && d.metrics != ""
}

func (d *decodeProc) changedLocked() {
	close(d.changed)
	d.changed = make(chan struct{})
}

func (d *decodeProc) crashLocked(why string) {
	if d.crash == "" {
		d.crashCtx = slices.Clone(d.tail[max(0, len(d.tail)-crashBefore-1):])
		d.crash = why
		close(d.crashed)
		d.changedLocked()
	}
}

// crashedWhy is why the decode crashed, or "".
func (d *decodeProc) crashedWhy() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.crash
}

// crashLines is what it printed around its first crash line, or last.
func (d *decodeProc) crashLines() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.crashCtx) > 0 {
		return strings.Join(d.crashCtx, "\n")
	}
	return strings.Join(d.tail, "\n")
}

// waitFor waits until cond (called under the lock) holds, the decode
// crashed, or bound passed; it reports whether cond held. It looks again
// at every session change and when wake (if not nil) closes.
func (d *decodeProc) waitFor(bound time.Duration, wake <-chan struct{}, cond func() bool) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		d.mu.Lock()
		ok, ch := cond(), d.changed
		d.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-ch:
		case <-wake:
			wake = nil
		case <-d.crashed:
			return false
		case <-t.C:
			return false
		}
	}
}

// span is when name's last session opened and ended, if it did both.
func (d *decodeProc) span(name string) (opened, ended time.Time, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	opened, ok1 := d.openedAt[name]
	ended, ok2 := d.endedAt[name]
	return opened, ended, ok1 && ok2
}

// hasOpened reports whether name opened a session.
func (d *decodeProc) hasOpened(name string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.opened[name]
}

// endOf is how name's last session ended, if it did and none is open.
func (d *decodeProc) endOf(name string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	o, ok := d.outcome[name]
	return o, ok && d.open[name] == 0
}

// openSessions names the sessions open now, those of the soak's own
// clients (sidePrefix) only if side.
func (d *decodeProc) openSessions(side bool) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.openLocked(side)
}

func (d *decodeProc) openLocked(side bool) []string {
	var out []string
	for n := range d.open {
		if side || !strings.HasPrefix(n, sidePrefix) {
			out = append(out, n)
		}
	}
	return out
}

// sidePrefix starts the names of the side lane's sessions.
const sidePrefix = "soak-"

// setPaused says whether a pause-decode stopped the process.
func (d *decodeProc) setPaused(p bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.paused = p
}

// figures is one sample of what the process holds.
type figures struct {
	rssMiB            float64
	fds, goroutines   int
	sessions          map[string]int // kvstream_decode_sessions_total by outcome
	quarantinedPages  int
	metricsWereRead   bool
	procFilesWereRead bool
}

var httpClient = &http.Client{Timeout: 2 * time.Second}

// sample reads the process's RSS and open files (/proc) and its
// goroutines and session counts (/metrics). A stopped process is read
// from /proc only.
func (d *decodeProc) sample() (figures, error) {
	var f figures
	pid := d.cmd.Process.Pid
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return f, errors.Wrap(err, "read the decode's /proc status")
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return f, errors.Newf("the decode's VmRSS %q", v)
			}
			f.rssMiB = kb / 1024
		}
	}
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return f, errors.Wrap(err, "list the decode's open files")
	}
	f.fds, f.procFilesWereRead = len(fds), true
	d.mu.Lock()
	paused := d.paused
	d.mu.Unlock()
	if paused {
		return f, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+d.metrics+"/metrics", nil)
	if err != nil {
		return f, errors.Wrap(err, "the decode's /metrics")
	}
	res, err := httpClient.Do(req)
	if err != nil {
		return f, errors.Wrap(err, "the decode's /metrics")
	}
	defer res.Body.Close()
	f.sessions = map[string]int{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	goroutines := false
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch {
		case name == "go_goroutines":
			f.goroutines, goroutines = int(v), true
		case name == "kvstream_decode_quarantined_pages_total":
			f.quarantinedPages = int(v)
		case strings.HasPrefix(name, `kvstream_decode_sessions_total{outcome="`):
			f.sessions[strings.TrimSuffix(strings.TrimPrefix(name, `kvstream_decode_sessions_total{outcome="`), `"}`)] = int(v)
		}
	}
	if err := sc.Err(); err != nil {
		return f, errors.Wrap(err, "read the decode's /metrics")
	}
	if !goroutines {
		return f, errors.New("the decode's /metrics has no go_goroutines")
	}
	f.metricsWereRead = true
	return f, nil
}

// pause stops (SIGSTOP) or resumes (SIGCONT) the process.
func (d *decodeProc) pause(stop bool) {
	if stop {
		d.setPaused(true)
		d.signal(syscall.SIGSTOP)
		return
	}
	d.signal(syscall.SIGCONT)
	d.setPaused(false)
}

// stop drains the process (SIGTERM) and says how it exited, within its
// drain timeout and a margin; then it is killed.
func (d *decodeProc) stop() string {
	d.mu.Lock()
	d.stopping = d.crash == ""
	d.mu.Unlock()
	d.signal(syscall.SIGCONT) // a pause-decode cut short
	d.signal(syscall.SIGTERM)
	if !d.wait(drainTimeout + 20*time.Second) {
		d.kill()
		return "no exit within " + (drainTimeout + 20*time.Second).String() + " of SIGTERM: killed"
	}
	_, err := d.exited()
	return exitText(err)
}

// exitText says how a process exited.
func exitText(err error) string {
	if err == nil {
		return exitClean
	}
	return err.Error()
}
