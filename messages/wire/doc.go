// Package wire holds the protobuf messages of the prefill↔decode control
// plane (protoactor-go remote): the handshake (Hello, Offer), chunk notices
// and their acknowledgements, and the goodbye (Bye, Summary), with the
// protocol version in the handshake. Package decode speaks it; wire.proto
// documents every field.
package wire
