// Package generate is `kvstream generate`: a real client of the engine,
// whose tokens prove the transfer. A small transformer (lab/tinylm)
// prefills a prompt in chunks on CPU compute streams (hw/cuda/cpu), one
// engine per prefill rank (CP x PP x TP), each layer's KV written into the
// paged prefill pools by a kernel and LayerEnd called after it; the engines
// stream the KV per layer group (and, for comparison, monolithically) over
// the loopback fabric into decode pools sharded the decode side's way;
// then the decode side greedily generates tokens reading its KV only from
// its pools, each decode TP rank over its own heads.
//
// Three generations are compared: the decode's from the transferred KV
// (per mode), the same decode collocated on the prefill's own pools (the
// reference: the prefill's ranks, its pages), and the model on its own
// (tinylm.Reference: one forward, one rank, no transfer). Tokens must be
// equal, logits within tinylm.LogitTolerance; the smallest top-1 margin
// says how far from a tie the picks were. Every decode byte is also
// compared with the prefill's through the independent whole-tensor reshard
// (cp/reshard/reshardtest) before anything is decoded.
//
// Timing is real: kernels take what their Go code takes, events are
// stamped when the CPU stream reached them, and each mode's exposed
// transfer (the request's last Finish return minus the end of its last
// forward on the stream) is reported against the ideal floor on the same
// measured timeline (floor.go).
//
// Plant makes the rig commit one of the production bugs that only tokens,
// or tokens and bytes, catch (the tests run each).
//
// RunRemote is the same prefill side (prefill in rig.go: streams, ranks,
// caches, transfer workers, the forward) when the decode side is another
// process (`kvstream prefill --model tiny-*`): the engines write over that
// process's transport, one room per request, each chunk told to it once
// every rank finished it, through a Decode session (lab/simsession's);
// the decode process checks the tokens (Spec says what it needs) and
// answers each room's last chunk with its verdict.
package generate
