// Package messages holds every message the engine's actors exchange. Messages
// are plain data where they can be: identifiers, counts, errors, times. Where
// a message must carry a live object (a CUDA event, the props of an actor to
// spawn, a reply channel), the field is typed by a small interface declared
// here or by a protoactor type, so that this package imports nothing of
// kvstream's and the same messages serve the actors, their functional cores
// and trace replay. A chunk's data-plane job, which only the actors know,
// travels in actors.Work, not here.
package messages
