package netsec

import (
	"fmt"
	"io"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(peerRoleEnv); dir != "" {
		if err := runPeerProcess(dir); err != nil {
			fmt.Fprintln(os.Stderr, "peer process:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(withNode{m})
}

// peerRoleEnv makes the test binary a peer process: a real protoactor node
// with the prefill's certificate from the directory it names, serving
// heartbeats, bound to the node named "decode". It prints its address and
// runs until its stdin closes.
const peerRoleEnv = "NETSEC_TEST_PEER_CERTS"

func runPeerProcess(dir string) error {
	c, err := makeCertsFrom(dir)
	if err != nil {
		return err
	}
	p := NewSessionPolicy(HeartbeatActor, HeartbeatMonitor)
	if err := p.Bind("decode"); err != nil {
		return err
	}
	n, err := startNode(Options{TLS: c.prefill, Authorize: p.Authorize})
	if err != nil {
		return err
	}
	defer n.stop()
	if _, err := ServeHeartbeats(n.system); err != nil {
		return err
	}
	os.Stdout.WriteString(n.system.Address() + "\n")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}
