package hostmem

import (
	"sort"
	"sync"
	"syscall"
	"unsafe"

	"github.com/cockroachdb/errors"
)

// Block is one mapping. Bytes aliases the mapped memory; Addr is its address.
type Block struct {
	Addr  uint64
	Bytes []byte
}

const pageSize = 4096

// hugePage is the size of a transparent huge page (x86-64, arm64 with 4 KiB
// pages). Pools are asked for huge pages (MADV_HUGEPAGE: many kernels
// default to THP "madvise"): one TLB entry, and one fault, per 2 MiB instead
// of per 4 KiB. That matters where faults are dear: under a hypervisor that
// traps every guest fault, and with a kernel that makes idle memory fault
// again (a DAMON pageout scheme), a copy into a pool of small pages can run
// at a fraction of memory speed, in the middle of a transfer
// (docs/PERFORMANCE.md, "The machine").
const hugePage = 2 << 20

// madvHugepage is MADV_HUGEPAGE, which package syscall does not name.
const madvHugepage = 14

var (
	mu     sync.RWMutex
	blocks []*Block // sorted by Addr
)

// Alloc maps n zeroed bytes. n must be positive. Every page is touched at
// once, as registering memory for RDMA pins it anyway: first-touch page
// faults would otherwise land in the middle of transfers (and in a VM they
// are expensive). A block of at least hugePage bytes asks for transparent
// huge pages first (see hugePage).
func Alloc(n int) (*Block, error) {
	if n <= 0 {
		return nil, errors.Newf("hostmem: allocation of %d bytes: must be positive", n)
	}
	flags := syscall.MAP_ANON | syscall.MAP_PRIVATE
	if n < hugePage {
		flags |= syscall.MAP_POPULATE
	}
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, flags)
	if err != nil {
		return nil, errors.Wrapf(err, "hostmem: mmap %d bytes", n)
	}
	if n >= hugePage {
		// Before the first touch, or the pages are already small. A kernel
		// without transparent huge pages refuses the advice: small pages
		// then, as before.
		_ = syscall.Madvise(mem, madvHugepage)
	}
	// Touch every page: MAP_POPULATE asks the guest kernel, but under a
	// hypervisor that backs guest memory lazily the first write to each page
	// still traps, and a copy into fresh pages runs an order of magnitude
	// slower than into touched ones. Registered memory is resident on a
	// real NIC too.
	for i := 0; i < len(mem); i += pageSize {
		mem[i] = 0
	}
	b := &Block{Addr: uint64(uintptr(unsafe.Pointer(&mem[0]))), Bytes: mem}
	mu.Lock()
	i := sort.Search(len(blocks), func(i int) bool { return blocks[i].Addr > b.Addr })
	blocks = append(blocks, nil)
	copy(blocks[i+1:], blocks[i:])
	blocks[i] = b
	mu.Unlock()
	return b, nil
}

// Free unmaps the block. Its bytes must not be used afterwards.
func (b *Block) Free() error {
	mu.Lock()
	for i, x := range blocks {
		if x == b {
			blocks = append(blocks[:i], blocks[i+1:]...)
			break
		}
	}
	mu.Unlock()
	if b.Bytes == nil {
		return nil
	}
	err := syscall.Munmap(b.Bytes)
	b.Bytes = nil
	return errors.Wrap(err, "hostmem: munmap")
}

// Lookup returns the live bytes [addr, addr+n) if one block holds them all.
func Lookup(addr, n uint64) ([]byte, error) {
	mu.RLock()
	defer mu.RUnlock()
	i := sort.Search(len(blocks), func(i int) bool { return blocks[i].Addr > addr }) - 1
	if i < 0 {
		return nil, errors.Newf("hostmem: address %#x is not in any live block", addr)
	}
	b := blocks[i]
	off := addr - b.Addr
	if off+n > uint64(len(b.Bytes)) || off+n < off {
		return nil, errors.Newf("hostmem: [%#x, +%d) runs past the block at %#x of %d bytes", addr, n, b.Addr, len(b.Bytes))
	}
	return b.Bytes[off : off+n : off+n], nil
}
