//go:build ucx

// The C side of the ucx transport. Everything here is called by the
// transport's progress goroutine, which owns the UCP context and worker
// (UCS_THREAD_MODE_SERIALIZED: one caller at a time, on whatever OS thread
// Go runs it), except kvs_signal, which UCX documents as safe from any
// thread.
//
// UCX callbacks never call into Go: they append (id, kind, status) records
// to a C-owned event queue, which the progress goroutine drains after every
// ucp_worker_progress. That keeps Go pointers out of C memory entirely and
// saves a cgo callback per completion.

#ifndef KVS_UCX_SHIM_H
#define KVS_UCX_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <poll.h>
#include <pthread.h>
#include <ucp/api/ucp.h>

enum {
    KVS_EV_BATCH     = 1, // a batch's flush completed (status: its outcome)
    KVS_EV_EP_ERROR  = 2, // UCX reported an endpoint failure (peer lost, ...)
    KVS_EV_EP_CLOSED = 3, // an endpoint's close request completed
    KVS_EV_EP_DRAINED = 4, // the flush started by kvs_ep_drain completed
    KVS_EV_ACK       = 5, // a peer answered a batch's FLUSH message (aux: the
                          // ucp_ep_h it came back on; status: its verdict)
    KVS_EV_ACK_FENCED = 6, // the same, from a receiver that fences epochs
                           // (an access point: KVS_ACK_FENCED)
    KVS_EV_FENCE     = 7  // a stale refusal's fence, pushed before its ACK
                          // (aux: the ucp_ep_h; status: the epoch)
};

// The active messages of the message write path (doc.go, "Writes"): a
// sender's WRITE carries bytes the receiver applies after checking them
// against its table of writable regions; FLUSH follows a group's writes and
// is answered by ACK once every write before it was applied (or refused).
enum {
    KVS_AM_WRITE = 0x6b01,
    KVS_AM_FLUSH = 0x6b02,
    KVS_AM_ACK   = 0x6b03
};

// A WRITE's header: which region (its slot and generation in the
// receiver's table, and the region's secret from its key), where in it,
// and the sender's epoch for this receiver (doc.go, "Epochs"). 32 bytes,
// copied out of the message before use (a header need not be aligned).
typedef struct {
    uint32_t slot;
    uint32_t gen;
    uint64_t dst;
    uint32_t epoch;
    uint32_t pad;
    uint64_t secret;
} kvs_am_write_hdr_t;

// A FLUSH's header: the batch tag its ACK carries back, and the epoch of
// the writes before it.
typedef struct {
    uint64_t tag;
    uint32_t epoch;
    uint32_t pad;
} kvs_am_flush_hdr_t;

// An ACK's header: the batch tag its FLUSH carried, the verdict, flags
// (KVS_ACK_FENCED), and the receiver's fence (the highest epoch it
// applied), which a sender refused as stale adopts.
typedef struct {
    uint64_t tag;
    int32_t  status;
    uint32_t flags;
    uint32_t epoch;
    uint32_t pad;
} kvs_am_ack_hdr_t;

// KVS_ACK_FENCED: the receiver refuses every write of an epoch below the
// highest it applied, so that once a write of a later epoch landed, nothing
// of an earlier one can land any more.
#define KVS_ACK_FENCED 1u

// KVS_STALE is the verdict on a FLUSH whose writes carried an epoch below
// the receiver's fence: refused, and nothing of them was applied since the
// fence rose.
#define KVS_STALE UCS_ERR_CANCELED

typedef struct {
    uint64_t id;
    uint64_t aux;
    int32_t  kind;
    int32_t  status;
} kvs_event_t;

// One write, resolved in Go: raw addresses and UCX handles as integers so
// that Go can hold an array of them without holding C pointers typed as
// pointers.
typedef struct {
    uint64_t src;
    uint64_t dst;
    uint64_t len;
    uint64_t rkey; // ucp_rkey_h; 0 for a message write
    uint64_t memh; // ucp_mem_h of the source region
    uint32_t slot; // a message write's region in the receiver's table
    uint32_t gen;
    uint64_t secret; // that region's secret, from its key
} kvs_write_t;

// One region of the receiver's table of memory that message writes may
// land in (kvs_region_set). A slot is reused with a new generation, so
// that a write naming a deregistered region is refused, not applied to
// whatever took its slot.
typedef struct {
    uint64_t addr;
    uint64_t len;
    uint32_t gen;
    int      live;
    // secret: 64 random bits of the region's key, which a write must
    // carry: slot and generation are small counters a peer could guess,
    // and a peer holds the keys of the regions offered to it only.
    uint64_t secret;
} kvs_region_t;

typedef struct kvs_ctx kvs_ctx_t;

// The most connections an access point's listener accepts (kvs_conn_cb):
// a peer opens one per submitter, and a hostile one gets no more.
#define KVS_ACCEPT_MAX 64 // open at once; a failed one frees its place

// The most connections of one worker with a refused write not yet
// answered by a FLUSH that the worker tells apart (kvs_wk_t.nacked).
#define KVS_NACK_MAX 128

// What a worker's message handlers need: its context and whether the
// peers connected to it are cut off. One per worker (the transport's own,
// and each access point's).
typedef struct {
    kvs_ctx_t   *ctx;
    ucp_worker_h worker;
    int          revoked;  // set by kvs_access_revoke: apply nothing more
    // The connections on which a write was refused since their last
    // FLUSH (by the endpoint a reply goes back on: writes are sent with
    // UCP_AM_SEND_FLAG_REPLY). Per connection, not per worker: an access
    // point takes one connection per submitter, and a FLUSH must answer
    // for its own connection's writes only (kvs_nack_take). nack_all: a
    // refused write that named no connection, or more connections than
    // nacked holds: every FLUSH from then on is answered as refused.
    ucp_ep_h     nacked[KVS_NACK_MAX];
    unsigned     nnacked;
    int          nack_all;
    // Epoch fence (doc.go, "Epochs"): set on access points, whose single
    // peer counts epochs for them; epoch is the highest applied.
    int          fence;
    uint32_t     epoch;
    uint64_t     stale;    // message writes refused for an old epoch
    uint64_t     applied;  // message writes applied (fragments)
    uint64_t     refused;  // message writes refused (fragments)
    uint64_t     acks_lost; // ACKs that could not be sent
    // An access point's sockaddr listener (kvs_access_listen), through
    // which its peer connects; NULL for the transport's own worker, and
    // once revoked. The endpoints it accepted go with the worker, or
    // once they failed (the peer closed them, or went away): failed holds
    // those until kvs_poll closes them, after the worker's progress.
    ucp_listener_h listener;
    ucp_ep_h     accepted[KVS_ACCEPT_MAX];
    unsigned     naccepted;
    ucp_ep_h     failed[KVS_ACCEPT_MAX];
    unsigned     nfailed;
    uint64_t     rejected;  // connection requests refused
    uint64_t     ep_errors; // accepted endpoints that failed (peer lost)
} kvs_wk_t;

struct kvs_ctx {
    ucp_context_h   context;
    ucp_worker_h    worker;
    kvs_wk_t        wk; // the transport's own worker's handler state
    int             efd; // -1 without UCP_FEATURE_WAKEUP
    int             wakeup;
    // Peer access points (kvs_access_open): workers of the same context
    // that only receive; kvs_poll progresses and kvs_wait arms them all.
    ucp_worker_h   *aw;
    kvs_wk_t      **awk; // their handler states
    int            *aefd;
    size_t          naw, caw;
    struct pollfd  *pfd; // kvs_wait's array, 1 + caw entries
    // Parked access points (kvs_access_park): never progressed again, never
    // destroyed (see kvs_access_park); the context is then not cleaned up.
    ucp_worker_h   *parked;
    size_t          nparked, cparked;
    pthread_mutex_t lock;
    kvs_event_t    *ev;
    size_t          nev, cap;
    int             oom; // an event could not be queued (see kvs_push)
    unsigned        progressed; // kvs_poll's last progress count
    // Message writes: the regions they may land in, and the size a write
    // is cut into (one message each, so that UCX delivers each without
    // reassembling it).
    kvs_region_t   *regs;
    size_t          nregs, cregs;
    uint64_t        frag;
    // The protocol flag of message writes, FLUSHes and their answers:
    // eager. Tests play a hostile peer with rendezvous (sendByRendezvous).
    uint32_t        am_proto;
};

// Per-batch record, the user_data of the batch's flush request. Owned by
// Go's batch; reused only after its own event was drained.
typedef struct {
    kvs_ctx_t   *ctx;
    uint64_t     id;
    ucs_status_t first_err; // the first write that failed, if any
    // Writes UCX took as requests and has not completed: the batch's
    // flush reports once they did (report_st holds its status meanwhile),
    // so that a write that fails after kvs_post returned (UCX 1.13 over
    // shared memory fails the first message of a fresh connection with
    // "Invalid am_short_iov length") fails its batch instead of passing
    // unseen.
    uint32_t     writes_out;
    int          report_due;
    ucs_status_t report_st;
    // Message writes' headers and the FLUSH's tag: UCX reads a message's
    // header when it sends it, which may be after kvs_post returned, so
    // they live here until the batch's flush completed.
    kvs_am_write_hdr_t *hdrs;
    size_t              chdrs;
    kvs_am_flush_hdr_t  flush_hdr;
    uint32_t            epoch; // stamped on every message of the group
} kvs_req_t;

// Per-endpoint record, the argument of the error handler and the user_data
// of the close request.
typedef struct {
    kvs_ctx_t *ctx;
    uint64_t   id;
    ucp_ep_h   ep;
} kvs_ep_t;

ucs_status_t kvs_init(kvs_ctx_t **out, const char **keys, const char **vals,
                      int nkv, int wakeup, int rma, uint64_t frag,
                      const char *name);
void         kvs_destroy(kvs_ctx_t *c);
void         kvs_setenv_default(const char *name, const char *val);
ucs_status_t kvs_address(ucp_worker_h w, void **buf, size_t *len);

ucs_status_t kvs_access_open(kvs_ctx_t *c, ucp_worker_h *w, kvs_wk_t **wk);
void         kvs_access_revoke(kvs_wk_t *wk);
void         kvs_access_close(kvs_ctx_t *c, ucp_worker_h w);
ucs_status_t kvs_access_park(kvs_ctx_t *c, ucp_worker_h w);
ucs_status_t kvs_access_listen(kvs_wk_t *wk, const char *ip, int v6,
                               uint16_t *port);

ucs_status_t kvs_region_set(kvs_ctx_t *c, uint64_t addr, uint64_t len,
                            uint64_t secret, uint32_t *slot, uint32_t *gen);
void         kvs_region_clear(kvs_ctx_t *c, uint32_t slot);
void         kvs_req_free(kvs_req_t *r);

void         kvs_map_params(ucp_mem_map_params_t *p, uint64_t addr,
                            uint64_t len, int mt, int alloc);
ucs_status_t kvs_mem_map(kvs_ctx_t *c, uint64_t addr, uint64_t len, int mt,
                         int alloc, ucp_mem_h *memh, void **addr_out,
                         void **rkey, size_t *rkey_len);
ucs_status_t kvs_mem_unmap(kvs_ctx_t *c, ucp_mem_h memh);

ucs_status_t kvs_ep_create(kvs_ctx_t *c, kvs_ep_t *e, const void *addr);
ucs_status_t kvs_ep_connect(kvs_ctx_t *c, kvs_ep_t *e, const char *ip, int v6,
                            uint16_t port);
ucs_status_t kvs_ep_close(kvs_ctx_t *c, kvs_ep_t *e);
void         kvs_ep_drain(kvs_ctx_t *c, kvs_ep_t *e);
ucs_status_t kvs_rkey_unpack(kvs_ep_t *e, const void *buf, uint64_t *rkey);
void         kvs_rkey_destroy(uint64_t rkey);

int          kvs_post(kvs_ctx_t *c, kvs_ep_t *e, const kvs_write_t *ws,
                      const uint32_t *counts, int32_t *errs, size_t nb,
                      kvs_req_t *r);
unsigned     kvs_poll(kvs_ctx_t *c, kvs_event_t *out, unsigned cap,
                      unsigned max_iter);
int          kvs_wait(kvs_ctx_t *c, long timeout_us);
ucs_status_t kvs_signal(kvs_ctx_t *c);

#endif
