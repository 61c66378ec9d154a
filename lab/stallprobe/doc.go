// Package stallprobe measures how long this process could not run a
// goroutine when it wanted to: the evidence with which a test's oracle
// tells CPU starvation (a loaded machine, other builds, a stopped process)
// from a fault, and with which `kvstream sim`'s verdict says that a loaded
// machine made its figures high. Nothing in the engine uses it.
package stallprobe
