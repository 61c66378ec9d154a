//go:build ucx

package ucx

/*
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cockroachdb/errors"
	"github.com/kvstream/kvstream/hw/rdma"
)

// access is one peer's access point: a UCP worker of the transport's
// context that only receives. Registrations and packed keys belong to the
// context, so every region's RegionDesc is valid through it.
type access struct {
	t    *Transport
	addr []byte
	w    C.ucp_worker_h // owned by the progress goroutine; nil once destroyed
	wk   *C.kvs_wk_t    // its message handlers' state, freed with the worker

	once sync.Once
	err  error // Revoke's answer
}

// acceptMax bounds the connections an access point's listener holds at
// once (KVS_ACCEPT_MAX; for the tests, which cannot use cgo).
const acceptMax = int(C.KVS_ACCEPT_MAX)

var (
	_ rdma.PeerAccessor    = (*Transport)(nil)
	_ rdma.PeerAccess      = (*access)(nil)
	_ rdma.LostPeerRevoker = (*access)(nil)
)

// OpenPeerAccess creates a worker of the transport's context for one peer,
// progressed by the transport's progress goroutine like its own worker.
func (t *Transport) OpenPeerAccess() (rdma.PeerAccess, error) {
	a := &access{t: t}
	err := t.do(func() error {
		var w C.ucp_worker_h
		var wk *C.kvs_wk_t
		if st := C.kvs_access_open(t.ctx, &w, &wk); st != C.UCS_OK {
			return errors.Mark(statusErr(st, "ucx: open a peer access point"), rdma.ErrEndpointBroken)
		}
		if !t.accessIP.IsValid() {
			var buf unsafe.Pointer
			var n C.size_t
			if st := C.kvs_address(w, &buf, &n); st != C.UCS_OK {
				C.kvs_access_close(t.ctx, w)
				return errors.Mark(statusErr(st, "ucx: a peer access point's worker address"), rdma.ErrEndpointBroken)
			}
			a.addr = C.GoBytes(buf, C.int(n))
			C.free(buf)
			if t.opts.Writes == WriteMessages {
				a.addr = append(append([]byte(nil), accessMagic...), a.addr...)
			}
		} else {
			ip := C.CString(t.accessIP.String())
			defer C.free(unsafe.Pointer(ip))
			var port C.uint16_t
			if st := C.kvs_access_listen(wk, ip, cBool(t.accessIP.Is6()), &port); st != C.UCS_OK {
				C.kvs_access_close(t.ctx, w)
				return errors.Mark(statusErr(st, "ucx: listen for a peer access point's connection on %s (Options.AccessHost)", t.accessIP), rdma.ErrEndpointBroken)
			}
			a.addr = encodeListenAddr(t.accessIP, uint16(port))
		}
		a.w, a.wk = w, wk
		t.accesses[a] = struct{}{}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// Address is where the access point's listener is (doc.go, "Connection
// setup"), or its worker address (Options.AccessConnect says which).
func (a *access) Address() []byte { return a.addr }

// Revoke cuts the peer off on the progress goroutine; the access point's
// listener, if it has one, refuses every connection from then on. In
// WriteMessages the worker's handlers refuse everything from then on and
// the worker goes after Options.RevokeLinger; in WriteRMA it is destroyed
// at once. With it go the connections the peer made to it: over TCP its
// sockets close unread, over RDMA NICs (rc, dc; ud emulates puts with
// messages) its queue pairs or DC target, so nothing the peer posts is
// applied any more and the peer's endpoint fails. Where UCX_TLS lets the
// peer write this memory itself (shared memory it mapped, cross-memory
// attach: see mayWriteDirectly), destroying the worker cannot stop those
// writes, and Revoke says so with an error marked rdma.ErrNotQuiesced.
func (a *access) Revoke() error {
	a.once.Do(func() { a.err = a.revoke(false) })
	return a.err
}

// RevokeLost cuts off a peer that stopped answering. In WriteMessages, and
// for an access point whose peer connects through its listener, it is
// Revoke (a client-server setup purges its own wireup: destroying the
// worker aborts nothing, and a peer connecting afterwards fails at once).
// Otherwise in WriteRMA it does not destroy the worker: with worker-address
// wireup (doc.go, "Connection setup") UCX 1.13 aborts the process
// destroying a worker whose connection setup with a stopped peer is pending
// (it purges the setup's reply under an assertion that 1.14 removed). The
// worker is parked instead: it is no
// longer progressed, so nothing the peer sends over TCP or UD is applied
// (UCX applies those puts when the receiver's worker progresses), and it is
// never destroyed (its sockets stay open, unread, until the process exits;
// the transport's Close then leaves its context too). Where the peer may
// write this memory itself (see Revoke) or a NIC applies its writes without
// the worker (rc, dc: parking stops nothing there), RevokeLost says so with
// an error marked rdma.ErrNotQuiesced. A second call returns the first
// answer, as Revoke's does.
func (a *access) RevokeLost() error {
	a.once.Do(func() { a.err = a.revoke(true) })
	return a.err
}

func (a *access) revoke(park bool) error {
	t := a.t
	// Parked, a worker would keep its listener (see kvs_access_park), and
	// a peer connecting to it would wait for an answer that never comes.
	park = park && !t.accessIP.IsValid()
	cut := func() {
		if a.w == nil {
			return
		}
		if t.opts.Writes == WriteMessages {
			// The barrier: from here on the worker's handlers apply
			// nothing and answer every FLUSH with a refusal, so the peer's
			// batches fail instead of hanging (over shared memory nothing
			// else would tell it). The worker goes after RevokeLinger.
			C.kvs_access_revoke(a.wk)
			t.retiring = append(t.retiring, retiree{a: a, at: time.Now().Add(t.opts.RevokeLinger)})
			delete(t.accesses, a)
			return
		}
		if park {
			if st := C.kvs_access_park(t.ctx, a.w); st == C.UCS_OK {
				a.w, a.wk = nil, nil
				delete(t.accesses, a)
				return
			}
			// Out of memory for the parked list: destroy, as Revoke.
		}
		a.destroy()
	}
	t.mu.Lock()
	switch {
	case t.onLoop():
		// A done callback: the context lives until the callback returns,
		// even when Close was called (teardown runs after it).
		t.mu.Unlock()
		cut()
	case t.closed:
		// The teardown destroys every worker: wait for it.
		t.mu.Unlock()
		<-t.stopped
	default:
		ch := make(chan struct{})
		t.enqueueLocked(item{fn: func() { cut(); close(ch) }})
		t.mu.Unlock()
		<-ch
	}
	if t.direct {
		return errors.Mark(errors.Newf("ucx: peer access point revoked, but UCX_TLS=%q may let the peer write this side's memory itself (shared memory it mapped, cross-memory attach), which revoking cannot stop: "+
			"memory it could write must not be reused or unmapped while this process lives", tlsOrAll(t.tls)), rdma.ErrNotQuiesced)
	}
	if park && t.opts.Writes == WriteRMA && appliedByNIC(t.tls) {
		return errors.Mark(errors.Newf("ucx: a lost peer's access point parked, but UCX_TLS=%q may carry its writes on a NIC that applies them without this side's worker (rc, dc): "+
			"memory it could write must not be reused or unmapped while this process lives", tlsOrAll(t.tls)), rdma.ErrNotQuiesced)
	}
	return nil
}

// destroy destroys the access point's worker, on the progress goroutine.
func (a *access) destroy() {
	if a.w == nil {
		return
	}
	C.kvs_access_close(a.t.ctx, a.w)
	a.w, a.wk = nil, nil
	delete(a.t.accesses, a)
}

// retiree is a revoked access point whose worker still answers its peers
// (with refusals) until at.
type retiree struct {
	a  *access
	at time.Time
}

// retire destroys the workers of revoked access points whose linger
// ended; on the progress goroutine.
func (t *Transport) retire(now time.Time) {
	keep := t.retiring[:0]
	for _, r := range t.retiring {
		if now.Before(r.at) {
			keep = append(keep, r)
			continue
		}
		r.a.destroy()
	}
	clear(t.retiring[len(keep):])
	t.retiring = keep
}

// appliedByNIC reports whether a UCX_TLS value may select an RDMA transport
// whose writes the receiving NIC applies by itself (rc, dc, or "ib", which
// includes them). mayWriteDirectly already answered for the rest.
func appliedByNIC(tls string) bool {
	for _, name := range strings.Split(tls, ",") {
		name = strings.TrimPrefix(strings.TrimSpace(name), `\`)
		if i := strings.IndexByte(name, ':'); i >= 0 {
			name = name[:i]
		}
		if name == "ib" || strings.HasPrefix(name, "rc") || strings.HasPrefix(name, "dc") {
			return true
		}
	}
	return false
}

func cBool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

func tlsOrAll(tls string) string {
	if tls == "" {
		return "all"
	}
	return tls
}

// mayWriteDirectly reports whether a UCX_TLS value may select a transport
// over which the sender writes the receiver's memory itself rather than
// sending it for the receiver's worker to apply or through a queue pair
// the receiver owns: posix and sysv shared memory (a peer maps memory that
// UCX allocated), cma, knem, xpmem (the kernel or a mapping copies into the
// receiver's pages), cuda_ipc and rocm_ipc (a peer maps device memory).
// Conservatively, anything not known to be safe counts: "all", an unset or
// "^"-excluding list, aliases like "sm", "shm", "mm", "cuda", and names this
// list does not know.
func mayWriteDirectly(tls string) bool {
	if tls == "" || strings.HasPrefix(tls, "^") {
		return true
	}
	for _, name := range strings.Split(tls, ",") {
		name = strings.TrimPrefix(strings.TrimSpace(name), `\`)
		if i := strings.IndexByte(name, ':'); i >= 0 {
			name = name[:i] // "ud:aux"
		}
		switch name {
		case "tcp", "self",
			"ib", "rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5",
			"dc", "dc_x", "dc_mlx5", "ud", "ud_v", "ud_x", "ud_verbs", "ud_mlx5",
			"cuda_copy", "gdr_copy", "rocm_copy":
		default:
			return true
		}
	}
	return false
}
