// Package gpucheck runs the engine end to end on a real GPU: the prefill
// pool lives in device memory, each layer's "attention kernel" is a
// cuMemsetD8Async per page on the engine's compute stream (writing a byte
// that names room, buffer and position), group events come from that real
// stream, the loopback transport reads the pool with cuMemcpyDtoH (as a
// GPUDirect NIC would read it) into a decode pool in host memory, and every
// owned destination byte is checked. It also times event record and query
// on the device. It needs an NVIDIA GPU; the tests and `kvstream sim --gpu`
// that call it say so plainly when there is none.
package gpucheck
