//go:build !linux

package decode

import "testing"

// heldForListener: elsewhere a chosen port is not held (internal/portlease
// takes it and frees it).
func heldForListener(*testing.T, int) {}
