package decode

import "context"

// AbandonForTest stops a client's session actor without Bye: to the decode
// server, the prefill vanished.
func AbandonForTest(c *Client) error {
	c.mu.Lock()
	c.ended = true // our own doing: not a loss of the decode server
	c.mu.Unlock()
	return c.node.stopActor(context.Background(), c.self)
}
