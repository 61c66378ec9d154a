// Command kvstream runs and measures the kvstream engine: `sim` streams a
// realistic prefill→decode workload on the embedded defaults and compares it
// with the monolithic post-forward send.
//
// Each command is its flags and a call of the product or the lab (lab/...);
// the programs themselves live there.
package main
