// Package rdmatest is the transport contract as a test suite: one set of
// checks that every rdma.Transport implementation must pass (loopback, ucx),
// and the checks of the optional parts (rdma.PeerAccessor) for the
// transports that offer them.
package rdmatest
