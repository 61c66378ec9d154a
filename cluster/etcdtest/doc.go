// Package etcdtest runs a throwaway single-member etcd (package etcdproc)
// for a test: free loopback ports, a temporary data directory, short raft
// ticks, killed and reaped when the test ends, skipped with the reason when
// there is no etcd binary. Tests kill, pause and restart it to exercise
// discovery while etcd is away.
package etcdtest
