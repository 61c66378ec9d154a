// Package buildinfo says what a kvstream binary is: its module version,
// the commit it was built from, the Go release, the UCX it was built
// against and runs with, and the control protocol version it speaks.
// `kvstream version` prints it and every command that serves /metrics
// exports it as kvstream_build_info, so that an operator can tell which
// nodes of a fleet run which build (both sides of a session must speak one
// protocol version).
package buildinfo
