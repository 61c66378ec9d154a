// Package etcdtest runs a throwaway single-member etcd (the etcd binary of
// the Debian package etcd-server, or $ETCD_BIN) for tests: free loopback
// ports, a temporary data directory, stopped and reaped at the end of the
// test. Tests stop, pause and restart it to exercise discovery while etcd
// is away.
package etcdtest
