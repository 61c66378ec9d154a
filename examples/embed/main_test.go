package main

import "testing"

// TestEmbed runs the example as a user would: main exits non-zero (failing
// this test) on any error or on a destination byte that differs.
func TestEmbed(t *testing.T) { main() }
