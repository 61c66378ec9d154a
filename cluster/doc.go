// Package cluster is kvstream's membership and discovery: decode instances
// and prefill ranks register themselves (identity, role, CP group and rank,
// control-plane address) under a lease that a keep-alive holds, and the
// scheduler side finds them by identity, lists them by role and watches them
// join and leave.
//
// Two providers share one interface: etcd (go.etcd.io/etcd/client/v3) for a
// real cluster, where a member that dies vanishes when its lease expires and a
// clean Close revokes the lease at once; and an in-process provider for a
// quick start and unit tests. Open picks one from Config. On etcd a record
// counts as a member only when its key is attached to the live lease the
// record names, and a live member puts its record back, at its next
// keep-alive, when someone else overwrote or deleted it, unless another live
// member registered the same identity meanwhile: then its registration ends
// with ErrConflict rather than the two overwriting each other.
//
// Discovery is a session-time concern. A Resolver answers repeated lookups
// from memory and, following a role's watch, picks a live member per
// request from memory too, so the per-request and per-forward paths never
// ask the provider anything. Group tells whether a CP group's ranks are all
// registered.
//
// The package imports nothing of kvstream's: the processes that use it (the
// decode package, `kvstream up`) sit above it.
package cluster
