// Package portlease picks a free TCP port for a listener that something
// else opens (protoactor's remote, a child process) and keeps the port from
// being given to anyone else until that listener is up.
//
// The usual way, listening on port 0 and closing the listener, frees the
// port at once: until the intended listener binds it, a bind to port 0
// elsewhere, or an outgoing connection's source port, may be given it, and
// the listen fails (or, in a test that meant to find nothing there, a dial
// reaches a stranger). On Linux a socket bound to the port and never
// listening keeps it: the kernel gives a bound port to no bind to port 0
// of an address the socket covers (an unspecified host covers them all)
// and to no connection as its source port, and refuses connections to it.
// With SO_REUSEADDR on the held socket, a listener that sets it too (Go's
// net.Listen does, and so does ucx_perftest) may still bind and listen on
// the port meanwhile; without, nothing else can bind it.
//
// Elsewhere Take falls back to the usual way: the BSDs let a second socket
// bind the same address and port only when both set SO_REUSEPORT, which
// Go's listener does not.
package portlease
