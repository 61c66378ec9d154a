// Package launch is kvstream's local cluster: the launcher (`kvstream up`)
// and the two node programs it starts (`kvstream decode-instance`,
// `kvstream prefill-rank`), each behind a Config, so that the commands are
// flags and a call.
//
// The launcher is cut by concern, one file each, each tested on its own:
//
//   - protocol.go: the node protocol, JSON-line events on a node's stdout
//     and "run BATCH DECODE" commands on its stdin;
//   - stdin.go: a node's stdin, its commands and, at its end, its drain;
//   - supervisor.go: the node processes (start, restart under the same
//     id, kill, the orderly stop: ranks first, then decode instances);
//   - batches.go: the bookkeeping of batches (which rank and room
//     reported, when a batch ends);
//   - router.go: which decode instance runs each batch, one batch per
//     instance at a time;
//   - faults.go: the injected faults (kill-decode, kill-prefill,
//     pause-etcd);
//   - report.go: the report, as text or JSON;
//   - up.go: Up, which wires them to etcd and the membership;
//   - decode_instance.go, prefill_rank.go: the node programs.
//
// Every long-running piece serves /metrics, /healthz and /readyz through
// package service and drains on SIGTERM.
package launch
