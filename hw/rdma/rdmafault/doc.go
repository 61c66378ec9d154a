// Package rdmafault injects faults into any rdma.Transport, the way pebble's
// vfs/errorfs wraps any file system: Wrap returns a transport whose
// endpoints ask a decision function, per posted batch, whether the batch
// fails to post, loses or delays its completion, fails, finds its peer
// gone, or breaks its connection half-way. The transport underneath (loopback, UCX) stays as it is, so the same
// reliability tests run over either.
//
// What the wrapper keeps of the rdma contract: done runs exactly once, never
// inside Post; a Post that returns an error never calls done; after an
// endpoint's Close returns nothing of it lands (the batches the wrapper holds
// have landed already or never reach the transport) and every batch not yet
// reported fails. Link behaviour (rate, latency, a slow link) is not a fault
// here: a modeled link belongs to the transport that models it
// (hw/rdma/loopback).
package rdmafault
