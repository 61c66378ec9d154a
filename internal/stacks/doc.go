// Package stacks reads this process's goroutine stacks, for tests that
// must see a goroutine parked where they expect (a second Close waiting
// for the first, a call blocked on a lock) instead of hoping it got there
// within some time.
package stacks
