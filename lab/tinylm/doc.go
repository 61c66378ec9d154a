// Package tinylm is a small reference transformer, in pure Go with weights
// drawn from a seed, whose tokens prove a KV transfer: a decode that reads
// the KV a transfer delivered must generate the tokens the model generates
// on its own. Bytes equal to their source prove a copy; equal tokens prove
// that the copy put every layer's, head's and position's KV where the
// decode reads it.
//
// Two variants (Presets): tiny-gqa, llama-shaped (RMSNorm, RoPE, grouped-
// query attention, SwiGLU), and tiny-mla, DeepSeek-shaped (multi-head latent
// attention: one compressed latent KV per token plus a decoupled RoPE key,
// and an extra layer after the hooked ones that fires no hook, as the MTP
// layer does; unlike DeepSeek's MTP layer it is on the token path, so that
// its KV decides tokens too).
//
// The KV lives only in paged pools, in the layouts kvstream moves: per
// layer a K and a V buffer (GQA) or one latent buffer (MLA) on every rank,
// item_len bytes per page, pages token-major or head-major (a
// reshard.Side), float32 elements. A Cache is one rank's view of one
// request: the side, the rank, and where each of the request's pages lives
// (pool and page; with CP the pages of one request live in several ranks'
// pools). Layer computes one layer for a block of tokens: it writes their
// KV into every TP rank's cache first, then attends by reading the KV back
// from the caches, each rank over its own heads, and combines the ranks'
// partial outputs as tensor parallelism does (row-parallel projections
// summed in rank order). Prefill and decode are the same Layer; decode
// (Generate) feeds one token at a time and reads the request's KV only
// through the page list.
//
// Arithmetic is float64, KV stored as float32. The same arrangement (TP,
// chunking) gives bit-identical results; a different TP degree sums the
// partials in another order, so logits agree within LogitTolerance and the
// tokens must still be equal. Weights are scaled so that greedy decoding has
// a clear top-1 margin (Generation.Margins), so that equality is not luck.
//
// It is pure: no goroutines, no hardware; it imports only cp/reshard, for
// the page layouts.
package tinylm
