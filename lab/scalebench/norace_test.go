//go:build !race

package scalebench

const raceEnabled = false
