// Package stallprobe measures how long this process could not run a
// goroutine when it wanted to: the evidence with which a test's oracle
// tells CPU starvation (a loaded machine, other builds, a stopped process)
// from a fault. It is for tests; nothing in the engine uses it.
package stallprobe
