// Package hostmem allocates memory that never moves: anonymous mmap regions,
// page aligned, outside the Go heap. RDMA registration and the simulated GPU
// need such memory, because an address handed to a NIC or a peer must stay
// valid and the Go garbage collector may move or free heap memory.
//
// Live blocks are indexed by address so that the in-process loopback
// transport can turn a registered (address, length) back into bytes without
// unsafe pointer arithmetic.
package hostmem
