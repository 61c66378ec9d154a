// Package service is what every long-running kvstream command has in
// common, whatever it serves: an operations endpoint (HTTP: /metrics,
// /healthz, /readyz) that starts before the work and shuts down gracefully
// after it, readiness that the command defines by named checks, and the
// drain on SIGTERM (stop accepting, let the work in flight finish within a
// bound, say goodbye to peers, report whether anything in flight was lost).
//
// A command uses it in four steps:
//
//	ops, err := service.Start(service.Config{Addr: metricsAddr, Log: log}) // listens now: a bad address fails at once
//	defer ops.Close(context.Background())
//	sd := service.OnSignals()                                              // SIGTERM, SIGINT: the drain starts
//	defer sd.Stop()
//	ops.Ready("registered", func(context.Context) error { ... })           // /readyz is 503 until every check passes
//	... serve until <-sd.Draining() ...
//	rep := service.Drain{Timeout: drainTimeout, Ops: ops, Stop: ..., Wait: inflight.Wait, Goodbye: ...}.Run(sd.Hard())
//	fmt.Println(rep)                                                       // and exit non-zero only if rep.Lost()
//
// Nothing here knows about engines or sessions: the command supplies what
// "ready", "in flight" and "goodbye" mean.
package service
