package stacks

import (
	"runtime"
	"strings"
)

// Goroutine is one goroutine of a dump.
type Goroutine struct {
	// State is runtime.Stack's, without the time parked: "running",
	// "chan receive", "sync.Mutex.Lock", ...
	State string
	// Funcs are its function lines, innermost first ("pkg.F(...)").
	Funcs []string
	// Text is its whole entry in the dump.
	Text string
}

// Parked reports whether g waits (not running, runnable or in a system
// call).
func (g Goroutine) Parked() bool {
	return g.State != "running" && g.State != "runnable" && g.State != "syscall"
}

// Innermost is the innermost of its function lines outside the runtime's
// own (runtime's, and the hooks other packages link to it, such as
// internal/sync.runtime_SemacquireMutex): where it waits, not how the
// runtime parks it.
func (g Goroutine) Innermost() string {
	for _, f := range g.Funcs {
		if !strings.HasPrefix(f, "runtime.") && !strings.Contains(f, ".runtime_") {
			return f
		}
	}
	return ""
}

// All returns every goroutine of the process.
func All() []Goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []Goroutine
	for _, text := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(text, "\n")
		head := lines[0]
		open, end := strings.Index(head, "["), strings.LastIndex(head, "]")
		if open < 0 || end < open {
			continue
		}
		state, _, _ := strings.Cut(head[open+1:end], ",") // "chan receive, 2 minutes"
		g := Goroutine{State: state, Text: text}
		// Function lines alternate with their file:line lines (tab-indented).
		for _, l := range lines[1:] {
			if l != "" && !strings.HasPrefix(l, "\t") {
				g.Funcs = append(g.Funcs, l)
			}
		}
		out = append(out, g)
	}
	return out
}

// Blocked reports whether a parked goroutine whose stack holds frame (a
// function name, or any text of its entry) is one match accepts; a nil
// match accepts any.
func Blocked(frame string, match func(Goroutine) bool) bool {
	for _, g := range All() {
		if g.Parked() && strings.Contains(g.Text, frame) && (match == nil || match(g)) {
			return true
		}
	}
	return false
}
