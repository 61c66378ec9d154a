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
// # Writes
//
// How a peer writes this Transport's memory is Options.Writes, the
// receiver's choice; its RegionDescs say it, and a sender of either mode
// follows them.
//
// WriteMessages (the default): a write is one or more UCX active messages
// (ucp_am_send_nbx, eager, at most Options.Fragment bytes each) whose header
// names the region by its slot and generation in the receiver's table and
// the destination address. The receiver's handler (shim.c, on its progress
// goroutine) applies a message only when its region is live and the bytes
// fall inside it, so a peer writes nothing but the memory this side
// registered, whatever it sends. After a group's writes the sender sends a
// FLUSH message; the receiver answers it once every write before it on the
// connection was handled (one lane per endpoint, delivered in order:
// UCX_MAX_EAGER_LANES=1), with a refusal when any was refused or the access
// point was revoked. A batch completes when that answer arrived (checked to
// come back on the batch's own endpoint), the endpoint's flush completed
// the messages locally, and UCX completed each write it took as a request:
// a write that fails after ucp_am_send_nbx returned fails its batch and
// breaks the endpoint (UCX 1.13 over shared memory fails the first message
// of a fresh connection that way, "mm_ep.c: Invalid am_short_iov length",
// and its FLUSH behind it is still answered: the shim released such a
// request unseen, and the batch reported success with the bytes never
// written; TestFirstWriteOnAFreshConnection). A refusal breaks the
// endpoint. A
// message sent by UCX's rendezvous protocol (no kvstream peer sends one) has
// its payload never received: a write is refused, a FLUSH or an answer is
// acted on from its header alone, and UCX drops the descriptor once the
// handler returns (TestRendezvousMessagesRefused). The
// context has no UCP_FEATURE_RMA, so UCX installs none of its RMA
// emulation handlers, and a region's key is a kvstream message key (32
// bytes, beginning with eight zero bytes, which no UCX key does), not a UCX
// remote key. Besides its slot and generation (small counters), a key holds
// the region's secret, 64 random bits each write must carry: a peer writes
// only the regions whose keys it was given, not another region of the same
// transport (another decode server's pool, where several share one) by
// naming its slot (TestForgedKeyRefused). Host memory only: the receiver
// applies writes with memcpy.
//
// This mode exists because of what UCX's RMA does where the hardware has
// none. Over tcp and shared-memory FIFOs UCX 1.13 (and 1.18, and its master
// branch) emulates a put with an active message that the receiver's worker
// applies to whatever address the header names, unchecked
// (ucp_put_handler), and answers with a completion message; when that
// answer cannot be sent (the peer died, its connection reset),
// ucp_progress_rma_cmpl hands the send error to ucp_request_try_send,
// which calls ucs_fatal: the receiving process aborts ("ucp_request.inl
// Fatal: unexpected error: Endpoint timeout"). A prefill killed
// mid-transfer, or a decode paused while its prefill gave up on it, killed
// the decode that way. With message writes the receiver's own handlers
// answer, and a failed answer only means the peer is gone.
//
// WriteRMA: a write is a ucp_put_nbx into memory registered with ucp_mem_map
// (the region's key is UCX's packed remote key), followed by
// ucp_ep_flush_nbx, which UCP defines as completion at the target. It is
// the zero-copy path of RDMA NICs (rc, dc) and GPUs (GPUDirect, cuda_ipc,
// RegisterTyped of device memory). Use it with UCX_TLS restricted to those
// transports and self, between trusted peers: wherever UCX emulates puts,
// the abort and the unchecked address above apply, and a peer that maps
// shared memory or uses cross-memory attach writes this side's memory
// itself, which no revocation stops (see below).
//
// # Epochs
//
// In WriteMessages the receiver's progress applies what a connection
// delivered whenever it gets to it, also after the sender closed that
// connection: a connection that broke (a TCP reset, a lost peer) may have
// bytes in the receiver's socket buffer, in the network, or in a
// shared-memory FIFO. A sender that re-sends on a fresh connection needs
// those leftovers never to land after its re-send, or a page it then
// hands to another room could be overwritten.
//
// So every WRITE and FLUSH carries an epoch. A Transport counts, per
// address it connects to, the endpoints to it that broke (the connection
// failed, a flush or send failed; Transport.broke), counting each before
// any of its batches reports the failure, and stamps the current count on
// every group it starts. An access point (one peer each) remembers the
// highest epoch it applied and applies nothing below it: such a WRITE is
// dropped (counted as stale) and its FLUSH answered with a stale refusal,
// which fails the batch as rdma.ErrEndpointBroken, to be re-sent; the
// refused endpoint drains and closes quiet, without counting a break, so
// that two endpoints of one sender never fence each other in turn. The
// refusal carries the access point's fence, which the sender adopts as its
// count for that address: several transports writing through one access
// point (each with its own count) converge instead of refusing each other
// for good. Once a
// group posted after a broken endpoint's Close was answered, nothing that
// endpoint sent can land any more. Until then its Close, and the batches
// it failed, return errors marked rdma.ErrNotQuiesced and rdma.ErrFenced
// (rdma.ErrFenced only where the receiver fences: an access point, known
// by its address, a listener's or a worker address behind the prefix
// "KVSW", or by an answer's flag). The transport's own worker takes any
// number of peers with unrelated counts and does not fence: a broken
// endpoint to it says rdma.ErrNotQuiesced alone. A refusal of a revoked
// access point, of a write outside the receiver's regions, or of a
// connection by an access point's listener is marked rdma.ErrRevoked:
// nothing to re-send. WriteRMA is not fenced (see Limits).
//
// Either mode: batches queued one after the other for one endpoint (up to
// 64) share one flush (and one FLUSH message), issued after all their
// writes, so small writes do not pay a flush (over TCP a round trip)
// apiece.
//
// # Mapping to UCP
//
// A Transport is one UCP context (UCP_FEATURE_AM, UCP_FEATURE_RMA in
// WriteRMA, UCP_FEATURE_WAKEUP unless Options.NoWakeup) with one worker;
// Address is the worker address. Register is ucp_mem_map of the caller's
// memory (the sender's zero-copy path needs the handle in either mode),
// plus in WriteRMA ucp_rkey_pack, whose bytes are RegionDesc.Key, and in
// WriteMessages an entry in the table of regions messages may land in.
// UCX detects the memory's type. RegisterTyped
// (rdma.TypedRegistrar) passes the type in ucp_mem_map's parameters
// (UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE): CUDA memory then goes to a
// CUDA-enabled UCX's CUDA domains (cuda_ipc within a host, GPUDirect RDMA on
// NICs that support it); this host's UCX has none, and the tests check only
// that the type reaches ucp_mem_map (scripts/gpu-check.sh has the GPU step).
// Allocate (rdma.Allocator) is ucp_mem_map with UCP_MEM_MAP_ALLOCATE: UCX
// allocates by UCX_ALLOC_PRIO, shared-memory segments first (sysv, posix)
// when the context has those transports; in WriteRMA a peer on the same
// host maps such memory, so that its put is one memcpy (memory from
// Register is reached through the shared-memory FIFO, or cma, instead,
// several times slower: docs/TRANSPORT-BENCH.md). Connect is ucp_ep_create
// with UCP_ERR_HANDLING_MODE_PEER, so that a lost peer fails the endpoint
// instead of hanging it: to an access point's listener by its socket
// address (see "Connection setup"), to a transport's own worker by its
// worker address. Import is ucp_ep_rkey_unpack
// for a UCX key, a table lookup for a message key. A peer's worker address
// and packed keys come from the network: Connect and Import check their
// structure first (the address's format version, the key's domain map,
// memory type and length-prefixed domain keys), since UCX asserts and
// aborts the process on malformed ones; what the structure carries is
// UCX's to parse, and trusted to come from an authenticated peer.
// Endpoint.Close drains the endpoint with one more flush, and in
// WriteMessages waits for the answers to every FLUSH sent on it (bounded by
// Options.CloseDrain), then closes it with ucp_ep_close_nbx and
// UCP_EP_CLOSE_FLAG_FORCE.
//
// # Per-peer access points
//
// The Transport is an rdma.PeerAccessor. OpenPeerAccess creates one more
// UCP worker on the same context (access.go), and where
// Options.AccessConnect picks one, a listener its peer connects through
// (see "Connection setup"); the access point's Address is where the
// listener is, or else the worker's address. Memory registrations, packed remote keys and the
// table of message regions belong to the context, so every region's
// RegionDesc is valid through any of its workers, those registered later
// too. The progress goroutine progresses every access point's worker along
// with its own, and sleeps on all their event fds. Access points only
// receive: Connect and Import are made on the transport's own worker.
//
// In WriteMessages, Revoke marks the access point's worker revoked, on the
// progress goroutine where its handlers run: a barrier, on every UCX
// transport; its listener, if it has one, refuses every new connection.
// From then on the worker applies nothing and answers every
// FLUSH with a refusal, so the peer's batches fail (its endpoint breaks,
// marked rdma.ErrRevoked)
// even over shared memory, where nothing else would tell it; after
// Options.RevokeLinger the worker is destroyed with its connections, and
// every resource of the session (sockets, FIFOs, memory) goes with it.
// RevokeLost does the same. Revoke returns nil.
//
// In WriteRMA, Revoke destroys the access point's worker
// (ucp_worker_destroy), closing every connection peers made to it. Where
// the receiver's worker applies what arrives (TCP, and ud, whose puts are
// messages) the sockets close unread and nothing more is applied; over RDMA
// NICs (rc, dc) the queue pairs or DC target the peer writes through are
// destroyed, and the NIC refuses its later writes. Either way the peer's
// endpoint fails (rdma.ErrEndpointBroken at the sender) and Revoke returns
// nil. Where the sender writes the receiver's memory itself, destroying a
// worker cannot stop it: posix and sysv shared memory (a peer maps memory
// UCX allocated), cma, knem and xpmem (the kernel or a mapping copies into
// the receiver's pages), cuda_ipc and rocm_ipc (a peer maps device memory).
// Revoke then still destroys the worker, and returns an error marked
// rdma.ErrNotQuiesced: the memory that peer could write must not be reused
// or unmapped while the process lives. Which transports a peer may use is
// decided from UCX_TLS as the context reads it (Options.Config's "TLS",
// else the environment), conservatively: unset, "all", a "^..." exclusion
// list, the aliases "sm", "shm", "mm", "cuda" and any name not known to be
// safe count as direct; tcp, self, ib, rc*, dc*, ud*, cuda_copy, gdr_copy
// and rocm_copy do not. A peer that stopped answering (SIGSTOPped, hung) is
// cut off with RevokeLost (rdma.LostPeerRevoker) instead: by worker
// address (see "Connection setup") UCX 1.13 aborts the process
// destroying a worker whose connection setup with such a peer is pending
// (ucp_request_send_state_ff asserts on the setup's reply message that
// ucp_ep_purge_lanes hands it; the assertion was removed in 1.14,
// openucx/ucx 9ccaf31). In WriteRMA RevokeLost parks the worker of an
// access point without a listener (in WriteMessages, and through a
// listener, it is Revoke, above): it leaves the
// progress and wait sets and is never destroyed (its sockets stay open,
// unread, until the process exits). Over rc and dc the NIC applies writes
// without the worker, so RevokeLost answers rdma.ErrNotQuiesced there.
//
// Measured here (TestRevokedPeerKeepsWriting): a receiving process revokes
// with 64 KiB writes in flight, unmaps the memory at once, and survives its
// peer's further posts and reconnections.
//
// # Connection setup
//
// Options.AccessConnect says how a peer connects to an access point: by
// its worker address, or through a listener of its own. AccessAuto, the
// default, picks the listener where the UCX library loaded is older than
// 1.14, the transport is of WriteMessages and UCX_TLS names a network
// transport; the worker address everywhere else. Why:
//
// By worker address, a peer sends a wireup request; the access point's
// worker creates an endpoint back to the peer's worker and queues its
// wireup reply (REP) on that endpoint's tcp transport endpoint itself, no
// wireup proxy in between, while it connects in the background. When the
// peer is dead by then (killed, or stopped then killed), the connect
// fails, uct_tcp_ep_set_failed fails the UCP endpoint, and discarding its
// lanes purges the queued reply through ucp_request_send_state_ff, which
// in UCX 1.13 asserts that only EP_REMOVED, EP_CHECK and ACK messages are
// ever purged there (ucp_request.c:684, "got REP message") and aborts the
// process: the decode, with every session it served. Destroying the
// worker in that state purges the same way. UCX 1.14 removed the
// assertion (openucx/ucx 9ccaf31); on 1.18.1 the same kills pass by worker
// address.
//
// Through a listener (ucp_listener_create on Options.AccessHost, a port the
// kernel picks), with UCX's client-server connection establishment,
// Connect is ucp_ep_create with UCP_EP_PARAM_FIELD_SOCK_ADDR, and the
// listener's handler, which UCX calls from ucp_worker_progress on the
// progress goroutine, accepts the request with ucp_ep_create(CONN_REQUEST)
// in error handling mode peer. The accepted endpoint's lanes stay wireup
// proxies until the peer's final ACK (ucp_wireup_process_request with a CM
// lane: UCP_EP_INIT_CM_WIREUP_SERVER, and the reply is sent before the
// endpoint counts as connected), and a proxy purges the wireup messages
// queued behind it itself (ucp_wireup_ep_pending_purge frees them in
// ucp_wireup_ep_pending_req_release, never through the assertion): a peer
// that dies at any point of the setup only fails its endpoint.
// TestPeerKilledDuringConnectionSetup kills connecting peer processes
// while the receiver's progress is held; by worker address on UCX 1.13
// that aborted the test process in 3 of 3 runs, through the listener in
// none.
//
// The handler accepts while the access point is not revoked, up to 64
// connections open at once (a prefill opens one per submitter, and one
// more each time one broke; a hostile peer gets no more), and refuses the
// rest with ucp_listener_reject: after a Revoke it refuses every one. An
// accepted endpoint that failed (its peer closed it, or went away) is
// closed and frees its place (TestAccessPointTakesReconnections). The
// listener and the accepted endpoints go with the
// worker (after Options.RevokeLinger), not before: UCX's tcp connection
// manager frees a listener while a connection it accepted but has not
// read the first bytes of still points to it, and calls through it when
// they arrive (a decode crashed with SIGSEGV in UCX's async thread when a
// prefill SIGSTOPped between its connect and its first send was resumed
// after its session was revoked; TestHalfOpenConnectionOutlivesRevoke);
// destroying the worker closes such connections. The window left is the
// one between the two calls. RevokeLost destroys an access point with a
// listener as Revoke does, never parks it (TestHalfOpenConnectionOutlivesRevokeLost);
// a parked worker would keep its listener, as it is never destroyed. The same connection manager aborts the
// process on a connection header that announces fewer bytes than it sends
// (tcp_sockcm_ep.c:825 in 1.13, :827 in 1.18, "offset <= length"): anyone
// who reaches a listener's port can abort the receiver with 20 bytes. That
// is why a listener is used only where it removes a worse abort (1.13,
// whose peers die while connecting as a matter of course) and the data
// plane must stay on a network only the fleet reaches.
//
// A listener's Address is "KVSL", the IP's length (4 or 16), the IP and
// the port (16-bit, big-endian): its first byte is no UCX worker address
// format version, so Connect tells the two apart, and it checks the
// length, a unicast IP and a port other than 0 before UCX sees any of it.
// UCX connects a client-server connection's tcp lanes to the IP the
// connection came in to, so AccessHost must be the address UCX's tcp
// transport binds on its interface.
//
// UCX sets a client-server connection up on the network device it came in
// by (tcp, or InfiniBand through rdmacm) before the lanes UCX_TLS allows
// take over: where UCX_TLS names no network transport (sm,self) the
// peer's endpoint would fail ("Destination is unreachable"), so there
// access points give out their worker address; over shared memory nothing
// connects back in the background (the abort above is tcp's), and 80
// prefill kills over sm,self did not abort a decode. UCX_TLS does not
// select connection managers; the tcp one is part of every UCX build. In
// WriteRMA a sender unpacks a region's remote key (Import) as soon as it
// connected, which on a client-server endpoint is before the setup
// replaced the endpoint's configuration, and UCX 1.18 then asserts on the
// put through it (proto_common.inl:219, "thresh_elem->proto_config.
// ep_cfg_index == ep->cfg_index"): AccessAuto gives worker addresses
// there, and a WriteRMA Transport on UCX 1.18 or later refuses to Connect
// to a listener's address (an access point set to AccessListener), with an
// error that says so, rather than abort at its first put (seen on 1.18.1
// in TestHalfOpenConnectionOutlivesRevokeLost, about one run in ten). A
// peer that learns the access point's worker address during the setup (UCX
// sends it) and deliberately connects by it, then dies, can still reach the
// REP abort on 1.13: listeners, like worker addresses, go only to an
// authenticated peer.
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
// The receiving Transport's progress goroutine matters too: it applies
// message writes (and, in WriteRMA over TCP and shared memory, UCX's
// emulated puts) when it progresses its workers.
//
// The Transports of one process share one lock in shim.c, never held while
// a progress goroutine sleeps or runs Go code: a UCP call that may add one
// of UCX's async handlers (a worker, a listener, a client connection, the
// progress of an access point that accepts connections) takes it
// exclusively, every other call that may remove one or progress a worker
// shared; and a forced endpoint close progresses its worker once before it
// returns. UCX keys every worker's async handlers by file descriptor in one
// table, and a UCX without openucx/ucx#9942 (1.13 here) hands an event a
// worker missed while a call held it to whatever handler holds that
// descriptor when the worker next progresses: after a close and the
// descriptor's reuse by another worker, the other worker's, and a UCX built
// with assertions aborts (async.c:643, "handler->async == async"). A
// prefill's Transport beside a decode's in one process did that in about
// one of 50 runs of TestAccessPointTakesReconnections' 192 reconnections on
// a loaded VM before, in none of 350 after. Transports that only send and receive progress side
// by side under the shared lock; a Transport alone in its process, as in
// production, never waits for it. Not covered: UCX's async thread closing
// an accepted connection itself (docs/DEPLOYMENT.md).
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
//     govern two-sided (tag/AM/stream) rendezvous, not puts; kvstream's own
//     messages are sent eager whatever they say (UCP_AM_SEND_FLAG_EAGER).
//   - UCX_TCP_CM_REUSEADDR: applies to UCX's sockaddr connection
//     manager, whose listeners access points open (see "Connection
//     setup"), on ports the kernel picks. UCX_TCP_PORT_RANGE picks the
//     TCP transport's listening ports (firewalls).
//   - UCX_KEEPALIVE_INTERVAL, UCX_TCP_KEEPIDLE: how fast a silent peer is
//     declared lost (error handling mode peer).
//   - UCX_RCACHE_ENABLE, UCX_IB_REG_METHODS: registration caches. They are
//     kept coherent by UCX's memory hooks (UCM), which do not see munmap(2)
//     issued as a raw system call, as Go's syscall.Munmap (hostmem) does. A
//     stale cache entry would hand a later mapping at the same address an old
//     registration, and on a real NIC the writes would silently go to the old
//     pages. New therefore sets RCACHE_ENABLE=n, and IB_REG_METHODS=direct
//     on hosts with InfiniBand devices, unless the environment or
//     Options.Config sets them (IB_REG_METHODS through the environment, as
//     UCX_TCP_MAX_POLL below; not run here: no InfiniBand device).
//   - UCX_MM_ERROR_HANDLING (UCX_POSIX_/UCX_SYSV_ERROR_HANDLING): the
//     shared-memory transports refuse endpoints in error handling mode peer
//     unless it is y, so New sets it to y unless the environment or
//     Options.Config sets it.
//   - UCX_TCP_MAX_POLL: how many socket events one progress of a tcp
//     interface takes from epoll and handles in turn (UCX's default 16).
//     Handling one, a connection reset, can close another endpoint of the
//     same batch, whose event then fails UCX's assertion that its endpoint
//     is not closed (tcp_iface.c, 1.13 to at least 1.18) and aborts the
//     process: a decode resumed after its prefill gave it up, 2 of 12 runs
//     of that pause under load on 1.18.1. A closed endpoint's events leave
//     epoll with it, so New sets it to 1 wherever UCX_TLS may select tcp,
//     unless the environment or Options.Config sets it. It sets it in the
//     process's environment (under the shim's exclusive lock): given to
//     ucp_config_modify, a transport's prefixed variable reaches no
//     interface in UCX 1.13, which only warns "invalid configuration".
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
// applies them (message writes; UCX's put emulation over TCP and shared
// memory) bytes already in socket buffers or shared-memory FIFOs still land
// afterwards (measured here: megabytes over TCP, hundreds of kilobytes over
// shared memory). That is why Endpoint.Close drains first (in
// WriteMessages, until the receiver answered every FLUSH; a connection
// that broke cannot be drained, and its leftovers are fenced: see Epochs),
// and why it returns an error when the drain times out: invariant 10 of
// docs/ARCHITECTURE.md then does not hold at the sender, and the caller
// must not reuse the destination pages on the strength of that Close (the
// receiver's revocation is what makes them quiet). Options.CloseDrain < 0
// skips the drain, for RDMA NICs.
//
// A receiver killed while a sender waits for its answer is noticed at once
// over TCP (the connection resets). Over shared memory UCX detects a lost
// peer through its process only when it sends to it, and its keepalive
// does not check these endpoints: a sender whose writes all left waits
// until Endpoint.Close, whose drain then times out (TestPeerKilledWhileAwaited);
// the decode and prefill notice such a peer by the control plane's
// heartbeats.
//
// Connect checks a worker address's size and format version only: UCX
// 1.13 parses the rest without its length, up to the address's own "last"
// flags, so a truncated or crafted address is read past its end and can
// abort the process inside UCX (measured: a 19-byte prefix of a TCP worker
// address, followed by 0xff bytes, aborts in ucp_wireup_select_lanes). Worker addresses must come
// from an authenticated peer; a parser of UCX's address format in Go, which
// would refuse what UCX cannot parse safely, is not written yet.
package ucx
