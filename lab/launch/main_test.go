package launch

import (
	"bufio"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

// fakeNodeEnv makes the test binary a fake cluster node for the
// supervisor's tests: it speaks the node protocol ("ready" with a made-up
// address, "batch" per "run" command, its row when it ends) without any
// engine. Its value is the node's id; fakeRoleEnv its role.
const (
	fakeNodeEnv = "KVSTREAM_LAUNCH_FAKE_NODE"
	fakeRoleEnv = "KVSTREAM_LAUNCH_FAKE_ROLE"
)

func TestMain(m *testing.M) {
	if id := os.Getenv(fakeNodeEnv); id != "" {
		os.Exit(fakeNode(id, os.Getenv(fakeRoleEnv)))
	}
	// protoactor's dead-letter throttle keeps a goroutine for its period
	// after a node's dead letter (a session test's Hello answer to a
	// stopped actor, a goodbye's late reply): it ends by itself.
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		// The same goroutine, as Go 1.27 names it (NewThrottle no longer inlined).
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"))
}

// nodeInput is what a test node process takes in: SIGTERM, and its stdin's
// lines (closed at its end).
func nodeInput() (term <-chan os.Signal, lines <-chan string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	ls := make(chan string)
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			ls <- sc.Text()
		}
		close(ls)
	}()
	return sig, ls
}

// fakeNode runs the fake node until its stdin ends (exit 0), SIGTERM
// (exit 0) or an "exit N" command.
func fakeNode(id, role string) int {
	out := NewEmitter(os.Stdout)
	out.Emit(Event{Event: EventReady, ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", 10000+os.Getpid()%50000), Pid: os.Getpid()})
	fmt.Fprintln(os.Stderr, "fake node", id, "up")
	term, lines := nodeInput()
	batches := 0
	end := func(why string) int {
		out.Emit(Event{Event: EventDrain, ID: id, Drain: why})
		out.Emit(Event{Event: EventNode, ID: id, Row: &Row{ID: id, Role: role, Batches: batches, Drained: true}})
		return 0
	}
	for {
		select {
		case <-term:
			return end("terminated")
		case l, ok := <-lines:
			if !ok {
				return end("stdin closed")
			}
			var code int
			if _, err := fmt.Sscanf(l, "exit %d", &code); err == nil {
				return code
			}
			c, err := ParseCommand(l)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				continue
			}
			batches++
			out.Emit(Event{Event: EventForward, ID: id, Batch: c.Batch, Decode: c.Decode})
			out.Emit(Event{Event: EventBatch, ID: id, Batch: c.Batch, Decode: c.Decode, OK: true})
			if strings.HasPrefix(c.Decode, "say-") {
				fmt.Println("not an event line")
			}
		}
	}
}
