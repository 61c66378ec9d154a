//go:build ucx

// Package ucx implements the rdma.Transport contract over UCX's UCP layer
// (libucx through cgo). It is built only with the build tag ucx and needs
// the UCX development files (pkg-config name "ucx", tested with 1.13.1):
//
//	go test -race -tags ucx ./hw/rdma/ucx/
//
// The tests run every check once over UCX_TLS=tcp and once over
// UCX_TLS=sm,self, setting the variable themselves.
//
// # Mapping to UCP
//
// A Transport is one UCP context (UCP_FEATURE_RMA, plus UCP_FEATURE_WAKEUP
// unless Options.NoWakeup) with one worker; Address is the worker address.
// Register is ucp_mem_map of the caller's memory plus ucp_rkey_pack, whose
// bytes are RegionDesc.Key; UCX detects the memory's type. RegisterTyped
// (rdma.TypedRegistrar) passes the type in ucp_mem_map's parameters
// (UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE): CUDA memory then goes to a
// CUDA-enabled UCX's CUDA domains (cuda_ipc within a host, GPUDirect RDMA on
// NICs that support it); this host's UCX has none, and the tests check only
// that the type reaches ucp_mem_map (scripts/gpu-check.sh has the GPU step).
// Allocate (rdma.Allocator) is ucp_mem_map with UCP_MEM_MAP_ALLOCATE: UCX
// allocates by UCX_ALLOC_PRIO, shared-memory segments first (sysv, posix)
// when the context has those transports, and a peer on the same host maps
// such memory, so that its put is one memcpy; memory from Register is
// reached through the shared-memory FIFO (or cma) instead, several times
// slower (docs/TRANSPORT-BENCH.md). Connect is ucp_ep_create by worker address with
// UCP_ERR_HANDLING_MODE_PEER, so that a lost peer fails the endpoint instead
// of hanging it. Import is ucp_ep_rkey_unpack. A peer's worker address and
// packed keys come from the network: Connect and Import check their
// structure first (the address's format version, the key's domain map,
// memory type and length-prefixed domain keys), since UCX asserts and aborts
// the process on malformed ones; what the structure carries is UCX's to
// parse, and trusted to come from an authenticated peer. Post is one ucp_put_nbx per
// write followed by one ucp_ep_flush_nbx; the batch completes when the flush
// does, which UCP defines as completion at the target. Batches queued one
// after the other for one endpoint (up to 64) share one flush, issued after
// all their puts: the flush completes each of them, and small writes do not
// pay a flush (over TCP a round trip) apiece. Endpoint.Close drains
// the endpoint with one more flush (bounded by Options.CloseDrain), then
// closes it with ucp_ep_close_nbx and UCP_EP_CLOSE_FLAG_FORCE.
//
// # Per-peer access points
//
// The Transport is an rdma.PeerAccessor. OpenPeerAccess creates one more
// UCP worker on the same context (access.go); its worker address is the
// access point's Address. Memory registrations and packed remote keys
// belong to the context, so every region's RegionDesc is valid through any
// of its workers, those registered later too. The progress goroutine
// progresses every access point's worker along with its own, and sleeps on
// all their event fds. Access points only receive: Connect and Import are
// made on the transport's own worker.
//
// Revoke destroys the access point's worker (ucp_worker_destroy), closing
// every connection peers made to it. Where the receiver's worker applies
// what arrives (TCP, and ud, whose puts are messages) the sockets close
// unread and nothing more is applied; over RDMA NICs (rc, dc) the queue
// pairs or DC target the peer writes through are destroyed, and the NIC
// refuses its later writes. Either way the peer's endpoint fails
// (rdma.ErrEndpointBroken at the sender) and Revoke returns nil.
//
// Where the sender writes the receiver's memory itself, destroying a worker
// cannot stop it: posix and sysv shared memory (a peer maps memory UCX
// allocated), cma, knem and xpmem (the kernel or a
// mapping copies into the receiver's pages), cuda_ipc and rocm_ipc (a peer
// maps device memory). Revoke then still destroys the worker, and returns an
// error marked rdma.ErrNotQuiesced: the memory that peer could write must
// not be reused or unmapped while the process lives. Which transports a
// peer may use is decided from UCX_TLS as the context reads it
// (Options.Config's "TLS", else the environment), conservatively: unset,
// "all", a "^..." exclusion list, the aliases "sm", "shm", "mm", "cuda" and
// any name not known to be safe count as direct; tcp, self, ib, rc*, dc*,
// ud*, cuda_copy, gdr_copy and rocm_copy do not. Over shared memory a peer
// whose worker was destroyed is not noticed either (UCX detects a lost peer
// by its process), so its endpoint hangs until Close, whose drain times
// out (Options.CloseDrain).
//
// Measured here (TestRevokedPeerKeepsWriting, UCX_TLS=tcp): a receiving
// process revokes with 64 KiB writes in flight, unmaps the memory at once,
// and survives its peer's further posts and reconnections.
//
// A peer that stopped answering (SIGSTOPped, hung) is cut off with
// RevokeLost (rdma.LostPeerRevoker) instead: UCX 1.13 aborts the process
// destroying a worker whose connection setup with such a peer is pending
// (ucp_request_send_state_ff asserts on the setup's reply message that
// ucp_ep_purge_lanes hands it; the assertion was removed in 1.14,
// openucx/ucx 9ccaf31). RevokeLost parks the worker: it leaves the progress
// and wait sets, so nothing that arrives for it is applied (TCP and ud puts
// are applied when the receiver's worker progresses), and it is never
// destroyed; its sockets stay open, unread, and Close then leaves the
// context to the process's exit. The peer's later batches hang rather
// than fail. Over rc and dc the NIC applies writes without the worker, so
// RevokeLost answers rdma.ErrNotQuiesced there (and wherever Revoke does).
// kvstream's decode server calls it for a session lost by its heartbeats
// (TestUCXHungPrefillIsLost SIGSTOPs the prefill mid-transfer; before it,
// about 1 run in 2 aborted there).
//
// # Threading
//
// One progress goroutine per Transport owns the context and the worker
// (UCS_THREAD_MODE_SERIALIZED: every UCP call is made by that goroutine,
// whichever OS thread it runs on). Post validates the writes in Go, appends
// the batch to a queue under a mutex and returns; it never waits for the
// network or for the progress goroutine. The progress goroutine drains the
// queue, posts all the puts of the batches queued together for an endpoint
// and their flush in one cgo call,
// progresses the worker, and runs done callbacks from the completions that
// UCX callbacks queued on the C side (UCX never calls into Go). After
// running callbacks it yields (runtime.Gosched), so that the goroutines they
// woke run at once instead of waiting for preemption behind a polling loop.
// When idle for Options.Spin it arms the worker and sleeps in ppoll(2) on
// the worker's event fd (ucp_worker_get_efd); Post wakes it with
// ucp_worker_signal, only when it sleeps. While batches are in flight the
// sleeps are 50µs naps, because not every transport signals the fd when
// queued sends can proceed (shared-memory FIFO space freed by the peer). So done callbacks run on the progress goroutine: they must be
// short and must not block (sending on a buffered channel or to an actor is
// fine). They may call Post, and Endpoint.Close, Connect, Import, Register,
// Deregister or Close, which then run inline.
//
// The receiving Transport's progress goroutine matters too: over TCP and
// shared memory, UCX 1.13 emulates puts into registered memory with active
// messages that the receiver's worker applies when it is progressed.
//
// # Configuration
//
// UCX reads its configuration from UCX_* environment variables when New
// calls ucp_config_read; they pass through unchanged, and Options.Config
// overrides them per Transport. The ones that matter here (all exist in UCX
// 1.13; see `ucx_info -c` and `ucx_info -f`):
//
//   - UCX_TLS: transports, e.g. "rc,cuda_copy" on InfiniBand/RoCE, "tcp", or
//     "sm,self" (alias "shm,self") within one host. Default "all".
//   - UCX_NET_DEVICES: which NICs/ports, e.g. "mlx5_0:1" or "eth0".
//   - UCX_ZCOPY_THRESH, UCX_BCOPY_THRESH: where puts switch between copy and
//     zero-copy protocols. UCX_RNDV_THRESH and UCX_RNDV_SCHEME exist but
//     govern two-sided (tag/AM/stream) rendezvous, not puts.
//   - UCX_TCP_CM_REUSEADDR: applies only to UCX's sockaddr connection
//     manager (listeners), which this package does not use: endpoints are
//     created from worker addresses. UCX_TCP_PORT_RANGE picks the TCP
//     transport's listening ports (firewalls).
//   - UCX_KEEPALIVE_INTERVAL, UCX_TCP_KEEPIDLE: how fast a silent peer is
//     declared lost (error handling mode peer).
//   - UCX_RCACHE_ENABLE, UCX_IB_REG_METHODS: registration caches. They are
//     kept coherent by UCX's memory hooks (UCM), which do not see munmap(2)
//     issued as a raw system call, as Go's syscall.Munmap (hostmem) does. A
//     stale cache entry would hand a later mapping at the same address an old
//     registration, and on a real NIC the writes would silently go to the old
//     pages. New therefore sets RCACHE_ENABLE=n, and IB_REG_METHODS=direct
//     on hosts with InfiniBand devices, unless the environment or
//     Options.Config sets them.
//   - UCX_MM_ERROR_HANDLING (UCX_POSIX_/UCX_SYSV_ERROR_HANDLING): the
//     shared-memory transports refuse endpoints in error handling mode peer
//     unless it is y, so New sets it to y unless the environment or
//     Options.Config sets it.
//   - UCX_LOG_LEVEL, UCX_HANDLE_ERRORS: UCX logging and signal handling.
//
// # Limits
//
// Registered memory must be mapped and must not move (hostmem, device
// memory): never the Go heap. Deregister a region only after every batch
// that reads it completed.
//
// A forced close cancels only what UCX has not sent yet. Where the sender
// performs the writes (RDMA NICs) that stops them; where the receiver
// applies them (UCX's put emulation over TCP and shared memory) bytes
// already in socket buffers or shared-memory FIFOs still land afterwards
// (measured here: megabytes over TCP, hundreds of kilobytes over shared
// memory). That is why Endpoint.Close drains first, and why it returns an
// error when the drain times out: invariant 10 of docs/ARCHITECTURE.md then does not hold
// and the caller must not reuse the destination pages on the strength of
// that Close. Options.CloseDrain < 0 skips the drain, for RDMA NICs.
//
// Over shared memory UCX detects a lost peer through its process, so a peer
// Transport closed inside a live process is not noticed: its batches hang
// until Endpoint.Close, whose drain then times out.
//
// Connect checks a worker address's size and format version only: UCX
// 1.13 parses the rest without its length, up to the address's own "last"
// flags, so a truncated or crafted address is read past its end and can
// abort the process inside UCX (measured: a 19-byte prefix of a TCP worker
// address, followed by 0xff bytes, aborts in ucp_wireup_select_lanes). Worker addresses must come
// from an authenticated peer; a parser of UCX's address format in Go, which
// would refuse what UCX cannot parse safely, is not written yet.
package ucx
