// Package hostprobe measures two properties of the machine that bound how
// close a microsecond-scale pipeline can come to its model, whatever the
// code does: how often, and for how long, the CPU running a busy thread is
// taken away from it (a virtual machine's exits, the host's own work: the
// guest cannot see these, and they do not show as steal time everywhere),
// and what waking a goroutine costs when the other CPU sits idle (on a
// virtual machine, an inter-processor interrupt to a halted vCPU).
//
// `kvstream bench host` is its command line. The sim's exposed times
// (docs/PERFORMANCE.md) cross a handful of goroutine hand-offs between a
// forward's end and Finish's return, so on a machine where a stall or a
// wake costs tens of microseconds, a 0.2 ms floor cannot be approached
// within a few percent; this package says whether a machine is one.
package hostprobe
