// Package clock sleeps until an instant with the precision a model needs.
// Go's timers can wake a millisecond late on a virtual machine (a 200 µs
// sleep can return about 1 ms late), which would add a millisecond of fake
// latency to every modeled kernel and transfer.
package clock
