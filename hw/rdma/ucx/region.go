//go:build ucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// region is one ucp_mem_map registration, or allocation. Its fields are
// immutable once it is in Transport.regions.
type region struct {
	t         *Transport
	key       rdma.LocalKey
	addr, len uint64
	memh      C.ucp_mem_h
	packed    []byte // ucp_rkey_pack output, or in message mode the message key
	mem       []byte // an allocation's bytes (nil for registered memory)
	slot      uint32 // message mode: the region's entry in the C table
	table     bool   // message mode: in the C table (host memory)
}

// A message key is what a message-mode region gives peers in place of a
// UCX remote key: the region's slot and generation in this side's table
// (kvs_region_set), and 64 random bits, the region's secret, which every
// write to it must carry. Slot and generation are small counters: without
// the secret a peer given one region's key could name another region of
// the same transport (another decode server's pool, beside its own) and
// write it. It begins with eight zero bytes, a memory-domain map no UCX
// key has, then a magic and a version; Import tells the two apart by it.
const messageKeyLen = 32

// messageKeyVersion is the key format: 2 added the secret.
const messageKeyVersion = "KVSWMSG\x02"

var messageKeyMagic = [8]byte{0, 0, 0, 0, 0, 0, 0, 0}

func messageKey(slot, gen uint32, secret uint64) []byte {
	k := make([]byte, messageKeyLen)
	copy(k, messageKeyMagic[:])
	copy(k[8:], messageKeyVersion)
	binary.LittleEndian.PutUint32(k[16:], slot)
	binary.LittleEndian.PutUint32(k[20:], gen)
	binary.LittleEndian.PutUint64(k[24:], secret)
	return k
}

// parseMessageKey reads a message key; ok is false for anything else (a
// UCX remote key, or garbage Import's other checks refuse).
func parseMessageKey(k []byte) (slot, gen uint32, secret uint64, ok bool) {
	if len(k) != messageKeyLen || string(k[:8]) != string(messageKeyMagic[:]) || string(k[8:16]) != messageKeyVersion {
		return 0, 0, 0, false
	}
	return binary.LittleEndian.Uint32(k[16:]), binary.LittleEndian.Uint32(k[20:]), binary.LittleEndian.Uint64(k[24:]), true
}

// newSecret is a region's secret: 64 bits from the system's random source.
func newSecret() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, errors.Wrap(err, "ucx: a region's secret")
	}
	return binary.LittleEndian.Uint64(b[:]), nil
}

// allocation is a region whose memory UCX allocated.
type allocation struct{ *region }

var (
	_ rdma.TypedRegistrar = (*Transport)(nil)
	_ rdma.Allocator      = (*Transport)(nil)
)

// memTypeDetect leaves the memory type out of ucp_mem_map's parameters, for
// UCX to detect.
const memTypeDetect = -1

// ucsMemoryType is UCX's name for a memory type.
func ucsMemoryType(mt rdma.MemoryType) (C.int, error) {
	switch mt {
	case rdma.MemoryHost:
		return C.UCS_MEMORY_TYPE_HOST, nil
	case rdma.MemoryCUDA:
		return C.UCS_MEMORY_TYPE_CUDA, nil
	}
	return 0, errors.Mark(errors.Newf("ucx: memory type %d unknown", mt), rdma.ErrInvalidWrite)
}

// Register maps [addr, addr+length) with ucp_mem_map, and gives peers a
// key to it: in WriteMessages an entry in the table of regions message
// writes may land in, in WriteRMA UCX's packed remote key. UCX detects the
// memory's type (with a CUDA-enabled UCX, device memory too). The memory
// must be mapped (hostmem, device memory) and must stay mapped and in
// place until Deregister or Close.
func (t *Transport) Register(addr, length uint64) (rdma.Region, error) {
	if err := checkRange(addr, length); err != nil {
		return nil, err
	}
	if err := mapped(addr, length); err != nil {
		// UCX would accept it and a peer's write would fault inside the
		// receiver's progress goroutine. (Device memory registered without
		// its type may fail here: RegisterTyped says what it is.)
		return nil, errors.Mark(errors.Wrapf(err, "ucx: register [%#x, +%d): not mapped", addr, length), rdma.ErrInvalidWrite)
	}
	return t.mapRegion(addr, length, memTypeDetect, false)
}

// RegisterTyped is Register that tells UCX the memory's type
// (UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE) instead of letting it detect it: a
// UCX built with CUDA support then registers CUDA memory with its CUDA
// domains (cuda_ipc on one host, GPUDirect RDMA on NICs that can). Host
// memory is checked to be mapped as by Register; device memory is not
// host-mapped, and UCX's CUDA domains check it. A UCX without CUDA support
// refuses CUDA memory or registers it with no domain, and then a peer's
// writes to it fail.
func (t *Transport) RegisterTyped(addr, length uint64, mt rdma.MemoryType) (rdma.Region, error) {
	if err := checkRange(addr, length); err != nil {
		return nil, err
	}
	cmt, err := ucsMemoryType(mt)
	if err != nil {
		return nil, err
	}
	if mt == rdma.MemoryHost {
		if err := mapped(addr, length); err != nil {
			return nil, errors.Mark(errors.Wrapf(err, "ucx: register [%#x, +%d): not mapped", addr, length), rdma.ErrInvalidWrite)
		}
	}
	return t.mapRegion(addr, length, cmt, false)
}

// Allocate allocates and registers length bytes of host memory in one
// ucp_mem_map call (UCP_MEM_MAP_ALLOCATE). UCX picks the allocator by
// UCX_ALLOC_PRIO, shared memory segments first (sysv, posix) when the
// context has those transports: in WriteRMA a peer on the same host then
// maps the memory and its put is a memcpy, at memory speed, where memory
// registered by Register is reached through the shared-memory FIFO. In
// WriteMessages it is a region like Register's, writable by messages only.
// The memory is zeroed here (UCX's heap fallback does not zero it).
//
// Free (or Close) releases it with ucp_mem_unmap. doc.go ("Per-peer access
// points") says why a peer mapping it is a write Revoke cannot stop.
func (t *Transport) Allocate(length uint64) (rdma.Allocation, error) {
	if length == 0 {
		return nil, errors.Mark(errors.New("ucx: allocate: zero length"), rdma.ErrInvalidWrite)
	}
	if length > maxAllocation {
		return nil, errors.Mark(errors.Newf("ucx: allocate %d bytes: at most %d", length, uint64(maxAllocation)), rdma.ErrInvalidWrite)
	}
	r, err := t.mapRegion(0, length, C.UCS_MEMORY_TYPE_HOST, true)
	if err != nil {
		return nil, err
	}
	clear(r.mem)
	return allocation{r}, nil
}

// maxAllocation bounds one Allocate: 1 TiB, more than any host's memory, so
// that a corrupted size fails here rather than inside UCX.
const maxAllocation = 1 << 40

func checkRange(addr, length uint64) error {
	if length == 0 {
		return errors.Mark(errors.Newf("ucx: register %#x: zero length", addr), rdma.ErrInvalidWrite)
	}
	if addr+length < addr {
		return errors.Mark(errors.Newf("ucx: register [%#x, +%d): wraps around", addr, length), rdma.ErrInvalidWrite)
	}
	return nil
}

// mapRegion registers (or with alloc, allocates) memory on the progress
// goroutine and adds the region.
func (t *Transport) mapRegion(addr, length uint64, mt C.int, alloc bool) (*region, error) {
	r := &region{t: t, addr: addr, len: length}
	calloc := C.int(0)
	if alloc {
		calloc = 1
	}
	messages := t.opts.Writes == WriteMessages
	host := mt == C.UCS_MEMORY_TYPE_HOST || mt == memTypeDetect
	if messages && !host {
		// The receiver applies message writes with memcpy on the host.
		return nil, errors.Mark(errors.Newf("ucx: register [%#x, +%d) as %s memory: message writes land in host memory only; device memory needs Options.Writes WriteRMA (a UCX with the device's transports)", addr, length, memTypeName(mt)), rdma.ErrUnsupported)
	}
	err := t.do(func() error {
		var rkey, at unsafe.Pointer
		var n C.size_t
		prkey := &rkey
		if messages {
			prkey = nil // no peer gets a UCX key
		}
		if st := C.kvs_mem_map(t.ctx, C.uint64_t(addr), C.uint64_t(length), mt, calloc, &r.memh, &at, prkey, &n); st != C.UCS_OK {
			if alloc {
				return errors.Mark(statusErr(st, "ucx: allocate %d bytes", length), rdma.ErrInvalidWrite)
			}
			return errors.Mark(statusErr(st, "ucx: register [%#x, +%d)", addr, length), rdma.ErrInvalidWrite)
		}
		if alloc {
			r.addr = uint64(uintptr(at))
			r.mem = unsafe.Slice((*byte)(at), length)
		}
		if messages {
			secret, err := newSecret()
			if err != nil {
				C.kvs_mem_unmap(t.ctx, r.memh)
				return err
			}
			var slot, gen C.uint32_t
			if st := C.kvs_region_set(t.ctx, C.uint64_t(r.addr), C.uint64_t(length), C.uint64_t(secret), &slot, &gen); st != C.UCS_OK {
				C.kvs_mem_unmap(t.ctx, r.memh)
				return errors.Mark(statusErr(st, "ucx: register [%#x, +%d)", r.addr, length), rdma.ErrInvalidWrite)
			}
			r.slot, r.table = uint32(slot), true
			r.packed = messageKey(uint32(slot), uint32(gen), secret)
		} else {
			r.packed = C.GoBytes(rkey, C.int(n))
			C.ucp_rkey_buffer_release(rkey)
		}
		if !messages && mt != C.UCS_MEMORY_TYPE_HOST && mt != memTypeDetect && len(r.packed) >= 8 && binary.LittleEndian.Uint64(r.packed) == 0 {
			// A UCX without support for the type maps it with no memory
			// domain: no peer could import the key.
			C.kvs_mem_unmap(t.ctx, r.memh)
			return errors.Mark(errors.Newf("ucx: register [%#x, +%d) as %s memory: no memory domain of this UCX takes it (built without support for it? ucx_info -d lists cuda_copy and cuda_ipc when it has CUDA)", addr, length, memTypeName(mt)), rdma.ErrUnsupported)
		}
		t.mu.Lock()
		t.nextKey++
		r.key = t.nextKey
		t.regions[r.key] = r
		t.mu.Unlock()
		return nil
	})
	if err != nil {
		return nil, err
	}
	return r, nil
}

func memTypeName(mt C.int) string {
	if mt == C.UCS_MEMORY_TYPE_CUDA {
		return "CUDA"
	}
	return fmt.Sprintf("type %d", int(mt))
}

// mapParams is what kvs_mem_map passes to ucp_mem_map for these arguments
// (the same C function fills both): the field mask, the address, the
// flags and the memory type (-1 when the mask leaves it out). Tests read it
// where no GPU can show the type taking effect.
func mapParams(addr, length uint64, mt rdma.MemoryType, typed, alloc bool) (mask, address uint64, flags uint32, memType int) {
	var p C.ucp_mem_map_params_t
	cmt := C.int(memTypeDetect)
	if typed {
		var err error
		if cmt, err = ucsMemoryType(mt); err != nil {
			return 0, 0, 0, -2
		}
	}
	calloc := C.int(0)
	if alloc {
		calloc = 1
	}
	C.kvs_map_params(&p, C.uint64_t(addr), C.uint64_t(length), cmt, calloc)
	memType = -1
	if p.field_mask&C.UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE != 0 {
		memType = int(p.memory_type)
	}
	return uint64(p.field_mask), uint64(uintptr(p.address)), uint32(p.flags), memType
}

// mapped checks that every page of the range is mapped: madvise(MADV_NORMAL)
// changes nothing and fails with ENOMEM on an unmapped page.
func mapped(addr, length uint64) error {
	page := uint64(os.Getpagesize())
	start := addr &^ (page - 1)
	_, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(start), uintptr(addr+length-start), syscall.MADV_NORMAL)
	if errno != 0 {
		return errno
	}
	return nil
}

// Desc returns the region's address, length and packed remote key.
func (r *region) Desc() rdma.RegionDesc {
	return rdma.RegionDesc{Addr: r.addr, Len: r.len, Key: append([]byte(nil), r.packed...)}
}

// Key names the region as a write source.
func (r *region) Key() rdma.LocalKey { return r.key }

// Deregister unmaps the region (ucp_mem_unmap; an allocation's memory is
// released with it). In WriteMessages it first leaves the table of regions
// messages may land in, on the progress goroutine: no write lands in it
// afterwards. Batches posted earlier that read it must have completed.
// After Close it does nothing.
func (r *region) Deregister() error {
	t := r.t
	unmap := func() error {
		if r.table {
			// First out of the table: no message write lands in it from
			// here on (this runs on the progress goroutine, with the
			// handlers).
			C.kvs_region_clear(t.ctx, C.uint32_t(r.slot))
		}
		if st := C.kvs_mem_unmap(t.ctx, r.memh); st != C.UCS_OK {
			return statusErr(st, "ucx: deregister [%#x, +%d)", r.addr, r.len)
		}
		return nil
	}
	t.mu.Lock()
	if t.closed || t.regions[r.key] != r {
		t.mu.Unlock()
		return nil // already deregistered, or left for Close to unmap
	}
	// Removing it under the lock Post validates under orders every later
	// Post's rejection before the unmap; queueing the unmap under the same
	// lock orders it after every earlier Post's puts.
	delete(t.regions, r.key)
	if t.onLoop() {
		t.mu.Unlock()
		return unmap()
	}
	ch := make(chan error, 1)
	t.enqueueLocked(item{fn: func() { ch <- unmap() }})
	t.mu.Unlock()
	return <-ch
}

// Bytes is the allocated memory.
func (a allocation) Bytes() []byte { return a.mem }

// Free releases the allocation: ucp_mem_unmap of memory UCX allocated
// frees it. rdma.Allocation.Free says when a peer's access allows it.
func (a allocation) Free() error { return a.Deregister() }

// UCX's constants, for the tests, which cannot use cgo.
const (
	fieldMemoryType = uint64(C.UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE)
	fieldFlags      = uint64(C.UCP_MEM_MAP_PARAM_FIELD_FLAGS)
	flagAllocate    = uint32(C.UCP_MEM_MAP_ALLOCATE)
	ucsHost         = int(C.UCS_MEMORY_TYPE_HOST)
	ucsCUDA         = int(C.UCS_MEMORY_TYPE_CUDA)
)
