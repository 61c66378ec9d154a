// Package etcdproc runs a single-member etcd as a child process (the etcd
// binary of the Debian package etcd-server, or $ETCD_BIN): on free loopback
// ports unless told otherwise, on a data directory the caller owns, waited
// for until healthy, and stopped, killed, paused or restarted on demand.
// Tests use it through etcdtest; a local cluster launcher uses it directly.
package etcdproc
