// Package simsession is `kvstream decode` and `kvstream prefill`: their
// programs (RunDecodeProcess, RunPrefillProcess, RunTinyPrefillProcess;
// the commands are their flags and a call), and what is sim-specific in
// them: the decode side sizes its pool from the prefill's
// layout and checks every page a successful chunk wrote against the sim
// model's pattern; the prefill side is a workload.DataPlane over a
// decode.Client. For a tiny model (lab/tinylm, session metadata
// TinyKey) the decode side instead decodes each room's tokens from its pool
// as the room's last chunk lands and compares them with the model's own
// (tiny.go), and the prefill side is a generate.Decode over a
// decode.Client (TinyPrefill). The control plane itself (sessions,
// notices, goodbye, loss) is package decode.
package simsession
