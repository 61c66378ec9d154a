// Package hw is the parent of kvstream's hardware layers: hw/cuda (streams
// and events), hw/rdma (memory registration and remote writes) and hw/hostmem
// (memory that never moves). Nothing in hw imports the engine.
package hw
