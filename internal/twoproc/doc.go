// Package twoproc is what is sim-specific in `kvstream decode` and
// `kvstream prefill`: the decode side sizes its pool from the prefill's
// layout and checks every page a successful chunk wrote against the sim
// model's pattern; the prefill side is a workload.DataPlane over a
// decode.Client. The control plane itself (sessions, notices, goodbye,
// loss) is package decode.
package twoproc
