//go:build race

package scalebench

// raceEnabled: the race detector slows the engine tenfold, so the sweep
// test runs fewer points.
const raceEnabled = true
