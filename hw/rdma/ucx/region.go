//go:build ucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"os"
	"syscall"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// region is one ucp_mem_map registration. Its fields are immutable once it
// is in Transport.regions.
type region struct {
	t         *Transport
	key       rdma.LocalKey
	addr, len uint64
	memh      C.ucp_mem_h
	packed    []byte // ucp_rkey_pack output
}

// Register maps [addr, addr+length) with ucp_mem_map and packs its remote
// key. The memory must be mapped (hostmem, device memory) and must stay
// mapped and in place until Deregister or Close.
func (t *Transport) Register(addr, length uint64) (rdma.Region, error) {
	if length == 0 {
		return nil, errors.Mark(errors.Newf("ucx: register %#x: zero length", addr), rdma.ErrInvalidWrite)
	}
	if addr+length < addr {
		return nil, errors.Mark(errors.Newf("ucx: register [%#x, +%d): wraps around", addr, length), rdma.ErrInvalidWrite)
	}
	if err := mapped(addr, length); err != nil {
		// UCX would accept it and a peer's write would fault inside the
		// receiver's progress goroutine.
		return nil, errors.Mark(errors.Wrapf(err, "ucx: register [%#x, +%d): not mapped", addr, length), rdma.ErrInvalidWrite)
	}
	r := &region{t: t, addr: addr, len: length}
	err := t.do(func() error {
		var rkey unsafe.Pointer
		var n C.size_t
		if st := C.kvs_mem_map(t.ctx, C.uint64_t(addr), C.uint64_t(length), &r.memh, &rkey, &n); st != C.UCS_OK {
			return errors.Mark(statusErr(st, "ucx: register [%#x, +%d)", addr, length), rdma.ErrInvalidWrite)
		}
		r.packed = C.GoBytes(rkey, C.int(n))
		C.ucp_rkey_buffer_release(rkey)
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

// Deregister unmaps the region (ucp_mem_unmap). Batches posted earlier that
// read it must have completed. After Close it does nothing.
func (r *region) Deregister() error {
	t := r.t
	unmap := func() error {
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
