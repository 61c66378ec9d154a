// Package tests holds kvstream's cross-package tests: the byte-equality
// oracle on randomized scenarios, every scenario of the commit log against
// the real engine on the simulated GPU and the loopback transport, and the
// benchmarks of the forward thread's hook.
package tests
