package decode

import (
	"context"
	"slices"

	"github.com/asynkron/protoactor-go/actor"
)

// AbandonForTest stops a client's session actor without Bye: to the decode
// server, the prefill vanished.
func AbandonForTest(c *Client) error {
	c.mu.Lock()
	c.ended = true // our own doing: not a loss of the decode server
	c.mu.Unlock()
	return c.node.stopActor(context.Background(), c.self)
}

// SendToForTest sends msg from the node to an actor at addr, through
// protoactor remote's connection to that node (opened on first use).
func SendToForTest(n *Node, addr, id string, msg any) {
	n.system.Root.Send(actor.NewPID(addr, id), msg)
}

// WaitersForTest counts the Wait calls the server keeps for room id.
func WaitersForTest(s *Server, id uint64) int {
	var n int
	_ = s.inActor(context.Background(), func() { n = len(s.waiters[id]) })
	return n
}

// SetMaxUnacceptedForTest lowers the bound on the ended sessions s keeps
// for Accept (MaxUnaccepted).
func SetMaxUnacceptedForTest(s *Server, n int) {
	s.acceptMu.Lock()
	defer s.acceptMu.Unlock()
	s.maxUnaccepted = n
}

// UnacceptedForTest is the sessions s keeps for Accept, oldest first, once
// the actor handled what reached it before the call (a Hello answered).
func UnacceptedForTest(s *Server) []*Session {
	_ = s.inActor(context.Background(), func() {})
	s.acceptMu.Lock()
	defer s.acceptMu.Unlock()
	return slices.Clone(s.accepted)
}
