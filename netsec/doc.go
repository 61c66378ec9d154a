// Package netsec secures the control plane that protoactor-go remote
// carries over gRPC between a prefill and a decode process: mutual TLS from
// certificate files (and a development certificate generator), the
// authenticated identity of the peer behind a connection, a gRPC server
// that no request can crash (panics recovered, unimplemented methods
// refused, message batches checked before protoactor indexes into them,
// bounded message sizes and streams), the rule that only loopback may run
// in the clear, and heartbeats that declare a hung peer lost within a bound.
//
// It is self-contained: the session code chooses where to use it (see
// docs/SECURITY.md for the threat model and what is not yet wired).
package netsec

//go:generate protoc --go_out=. --go_opt=paths=source_relative heartbeat.proto
