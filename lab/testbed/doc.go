// Package testbed builds the pieces of a prefill→decode scenario on the
// embedded defaults: KV pools in memory that never moves, decode pools
// registered with a transport, and a model that runs forwards on a virtual
// GPU whose kernels write deterministic KV bytes. Tests and `kvstream sim`
// share it; the pattern function is the oracle of what every page must hold.
package testbed
