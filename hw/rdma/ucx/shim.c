//go:build ucx

#define _GNU_SOURCE // ppoll

#include "shim.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

// ---- UCX's async handlers, shared by the workers of the process ----
//
// UCX keeps the async handlers of every worker of the process in one table,
// keyed by file descriptor. When its async thread finds a worker's context
// held (a UCP call or a progress on it), it queues the event as missed, by
// descriptor, and that worker's next ucp_worker_progress handles it. If the
// handler was removed in between (the connection closed) and the descriptor
// reused by another worker's new handler, a UCX without openucx/ucx#9942
// (1.13 here) hands the stale event to that other worker's handler: built
// with assertions, as Debian's is, it aborts first, on
// ``async.c:643 Assertion `handler->async == async' failed''. A decode's
// access points are workers of one process, and tests run a prefill's
// transport beside a decode's.
//
// Two rules keep a missed event from outliving its handler here:
//  - a shim call that may add a handler (a worker, a listener, a client
//    connection, the progress of an access point that accepts connections)
//    holds kvs_ucx_rw exclusively, and every other call that may remove one
//    or progress a worker holds it shared, so no transport of the process
//    takes a descriptor between a handler's removal and the progress that
//    drops its missed events, and transports that only send and receive
//    still progress side by side;
//  - a call that removes handlers outside a progress (a forced endpoint
//    close) progresses that worker once before it returns (kvs_settle).
// Not covered: UCX's async thread closing an accepted connection that failed
// before its request reached UCP; its missed event waits for that access
// point's next progress, and a handler added meanwhile can take its
// descriptor (docs/DEPLOYMENT.md).
static pthread_rwlock_t kvs_ucx_rw;
static pthread_once_t kvs_ucx_once = PTHREAD_ONCE_INIT;

static void kvs_ucx_rw_init(void)
{
    pthread_rwlockattr_t a;

    pthread_rwlockattr_init(&a);
#ifdef __GLIBC__
    // glibc prefers readers by default: two progress loops that keep the
    // lock shared between them would hold a Connect off for ever.
    pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    pthread_rwlock_init(&kvs_ucx_rw, &a);
    pthread_rwlockattr_destroy(&a);
}

// kvs_enter takes kvs_ucx_rw, exclusively for a call that may add an async
// handler; kvs_leave releases it. No call under it takes it again.
static void kvs_enter(int adds)
{
    pthread_once(&kvs_ucx_once, kvs_ucx_rw_init);
    if (adds) {
        pthread_rwlock_wrlock(&kvs_ucx_rw);
    } else {
        pthread_rwlock_rdlock(&kvs_ucx_rw);
    }
}

static void kvs_leave(void)
{
    pthread_rwlock_unlock(&kvs_ucx_rw);
}

// Drops the events w's async context missed while a call held it whose
// handlers the call removed, before another worker can take their
// descriptors (ucp_worker_progress ends by handling w's missed events).
static void kvs_settle(ucp_worker_h w)
{
    ucp_worker_progress(w);
}

// kvs_push may run inside any UCX call made by the progress goroutine. The lock
// is uncontended in practice; it is there in case a UCX version ever invokes
// a handler from its async thread.
static void kvs_push_aux(kvs_ctx_t *c, uint64_t id, uint64_t aux, int kind,
                         ucs_status_t status)
{
    pthread_mutex_lock(&c->lock);
    if (c->nev == c->cap) {
        size_t cap = c->cap ? 2 * c->cap : 256;
        kvs_event_t *ev = realloc(c->ev, cap * sizeof(*ev));
        if (ev == NULL) {
            // Losing a completion would hang a batch forever; Go fails
            // everything closed when it sees this flag.
            c->oom = 1;
            pthread_mutex_unlock(&c->lock);
            return;
        }
        c->ev  = ev;
        c->cap = cap;
    }
    c->ev[c->nev].id     = id;
    c->ev[c->nev].aux    = aux;
    c->ev[c->nev].kind   = kind;
    c->ev[c->nev].status = (int32_t)status;
    c->nev++;
    pthread_mutex_unlock(&c->lock);
}

static void kvs_push(kvs_ctx_t *c, uint64_t id, int kind, ucs_status_t status)
{
    kvs_push_aux(c, id, 0, kind, status);
}

// kvs_report queues a batch's completion: its flush's status, or the
// first of its writes that failed. Once its writes all completed: a write
// still in flight reports it when it completes (kvs_write_cb).
static void kvs_report(kvs_req_t *r, ucs_status_t status)
{
    if (r->writes_out > 0) {
        r->report_due = 1;
        r->report_st  = status;
        return;
    }
    if (status == UCS_OK && r->first_err != UCS_OK) {
        status = r->first_err;
    }
    kvs_push(r->ctx, r->id, KVS_EV_BATCH, status);
}

static void kvs_flush_cb(void *request, ucs_status_t status, void *user_data)
{
    kvs_report(user_data, status);
    ucp_request_free(request);
}

// A write UCX completed after kvs_post returned: a failure fails its batch
// (UCX reports it nowhere else once the request is done).
static void kvs_write_cb(void *request, ucs_status_t status, void *user_data)
{
    kvs_req_t *r = user_data;

    ucp_request_free(request);
    if (status != UCS_OK && r->first_err == UCS_OK) {
        r->first_err = status;
    }
    if (--r->writes_out == 0 && r->report_due) {
        r->report_due = 0;
        kvs_report(r, r->report_st);
    }
}

static void kvs_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvs_ep_t *e = arg;
    (void)ep;
    kvs_push(e->ctx, e->id, KVS_EV_EP_ERROR, status);
}

static void kvs_drain_cb(void *request, ucs_status_t status, void *user_data)
{
    kvs_ep_t *e = user_data;
    kvs_push(e->ctx, e->id, KVS_EV_EP_DRAINED, status);
    ucp_request_free(request);
}

static void kvs_close_cb(void *request, ucs_status_t status, void *user_data)
{
    kvs_ep_t *e = user_data;
    kvs_push(e->ctx, e->id, KVS_EV_EP_CLOSED, status);
    ucp_request_free(request);
}

// ---- Message writes (doc.go, "Writes") ----
//
// The receiver applies a WRITE only after checking it against its own table
// of regions (c->regs): the region's slot and generation must be live and
// the bytes must fall inside it. A peer therefore writes nothing but the
// memory this side registered, whatever addresses it sends, and nothing at
// all once its worker is revoked. UCX's own put emulation over TCP and
// shared memory (UCP_FEATURE_RMA without a NIC) applies whatever address a
// peer names, and aborts the receiving process when it cannot send a put's
// completion back to a peer that died (ucp_progress_rma_cmpl returns the
// send error to ucp_request_try_send, which calls ucs_fatal): neither
// happens here, because a context in message mode has no UCP_FEATURE_RMA
// and these handlers treat a failed answer as the peer's loss.

static void kvs_ack_done(void *request, ucs_status_t status, void *user_data)
{
    (void)status;
    free(user_data);
    ucp_request_free(request);
}

// Answers a FLUSH on the endpoint it came from. A peer that is gone makes
// the send fail, which only means nobody is waiting for the answer.
static void kvs_ack(kvs_wk_t *w, ucp_ep_h ep, uint64_t tag, ucs_status_t st)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    kvs_am_ack_hdr_t *h = malloc(sizeof(*h)); // read by UCX until sent

    if (h == NULL) {
        w->acks_lost++;
        return;
    }
    h->tag    = tag;
    h->status = (int32_t)st;
    h->flags  = w->fence ? KVS_ACK_FENCED : 0;
    h->epoch  = w->epoch;
    h->pad    = 0;
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA;
    // REPLY: the sender checks that the answer came back on the endpoint
    // it sent the FLUSH on.
    param.flags     = w->ctx->am_proto | UCP_AM_SEND_FLAG_REPLY;
    param.cb.send   = kvs_ack_done;
    param.user_data = h;
    sp = ucp_am_send_nbx(ep, KVS_AM_ACK, h, sizeof(*h), NULL, 0, &param);
    if (sp == NULL) {
        free(h);
    } else if (UCS_PTR_IS_ERR(sp)) {
        free(h);
        w->acks_lost++;
    }
}

// kvs_nack_set records that a write arriving on ep (NULL: it named no
// connection) was refused.
static void kvs_nack_set(kvs_wk_t *w, ucp_ep_h ep)
{
    unsigned i;

    if (ep == NULL) {
        w->nack_all = 1;
        return;
    }
    for (i = 0; i < w->nnacked; i++) {
        if (w->nacked[i] == ep) {
            return;
        }
    }
    if (w->nnacked == KVS_NACK_MAX) {
        w->nack_all = 1;
        return;
    }
    w->nacked[w->nnacked++] = ep;
}

// kvs_nack_take reports whether a write arriving on ep was refused since
// its last FLUSH, and forgets it: the FLUSH on ep answers for them.
static int kvs_nack_take(kvs_wk_t *w, ucp_ep_h ep)
{
    unsigned i;

    for (i = 0; i < w->nnacked; i++) {
        if (w->nacked[i] == ep) {
            w->nacked[i] = w->nacked[--w->nnacked];
            return 1;
        }
    }
    return w->nack_all;
}

static ucs_status_t kvs_am_write_cb(void *arg, const void *header,
                                    size_t header_length, void *data,
                                    size_t length,
                                    const ucp_am_recv_param_t *param)
{
    kvs_wk_t *w    = arg;
    kvs_ctx_t *c   = w->ctx;
    kvs_am_write_hdr_t h;
    kvs_region_t *r;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        // Never asked for (writes are sent eager): refuse the data. UCX
        // drops a rendezvous descriptor whose handler returns UCS_OK
        // without receiving it; releasing it here too gave it back twice,
        // which crashed the receiver in ucp_am_rndv_process_rts.
        goto refuse;
    }
    if (w->revoked || header_length != sizeof(h)) {
        goto refuse;
    }
    memcpy(&h, header, sizeof(h));
    if (w->fence && h.epoch < w->epoch) {
        // Left over from a connection its peer closed after it broke: a
        // write of a later epoch landed already, and the peer re-sends
        // what this carried. Its FLUSH, behind it on the same connection,
        // is refused as stale, so it does not set nack.
        w->stale++;
        return UCS_OK;
    }
    if (h.slot >= c->nregs) {
        goto refuse;
    }
    r = &c->regs[h.slot];
    if (!r->live || r->gen != h.gen || r->secret != h.secret ||
        h.dst < r->addr || length > r->len ||
        h.dst - r->addr > r->len - length) {
        goto refuse;
    }
    memcpy((void*)(uintptr_t)h.dst, data, length);
    w->applied++;
    if (w->fence && h.epoch > w->epoch) {
        w->epoch = h.epoch;
    }
    return UCS_OK;

refuse:
    w->refused++;
    kvs_nack_set(w, (param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) ?
                        param->reply_ep : NULL);
    return UCS_OK;
}

static ucs_status_t kvs_am_flush_cb(void *arg, const void *header,
                                    size_t header_length, void *data,
                                    size_t length,
                                    const ucp_am_recv_param_t *param)
{
    kvs_wk_t *w = arg;
    ucs_status_t st;
    kvs_am_flush_hdr_t h;

    // A rendezvous descriptor (never asked for: no payload) is dropped by
    // UCX once this returns UCS_OK; the header stays valid until then.
    (void)data;
    (void)length;
    if (header_length != sizeof(h) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        w->refused++;
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    // Every write before the FLUSH on this connection was handled already
    // (one lane per endpoint, in order: UCX_MAX_EAGER_LANES=1).
    if (w->revoked) {
        st = UCS_ERR_REJECTED;
    } else if (w->fence && h.epoch < w->epoch) {
        // Its writes carried the same epoch: those handled after the
        // fence rose were refused (and the peer re-sends them).
        kvs_ack(w, param->reply_ep, h.tag, KVS_STALE);
        return UCS_OK;
    } else if (kvs_nack_take(w, param->reply_ep)) {
        st = UCS_ERR_INVALID_ADDR;
    } else {
        st = UCS_OK;
        if (w->fence && h.epoch > w->epoch) {
            w->epoch = h.epoch;
        }
    }
    kvs_ack(w, param->reply_ep, h.tag, st);
    return UCS_OK;
}

static ucs_status_t kvs_am_ack_cb(void *arg, const void *header,
                                  size_t header_length, void *data,
                                  size_t length,
                                  const ucp_am_recv_param_t *param)
{
    kvs_wk_t *w = arg;
    kvs_am_ack_hdr_t h;

    // A rendezvous descriptor (never asked for: no payload) is dropped by
    // UCX once this returns UCS_OK; the header stays valid until then.
    (void)data;
    (void)length;
    if (header_length != sizeof(h) ||
        !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    if (h.status == KVS_STALE) {
        kvs_push_aux(w->ctx, h.tag, (uint64_t)(uintptr_t)param->reply_ep,
                     KVS_EV_FENCE, (ucs_status_t)(int32_t)h.epoch);
    }
    // Go matches the tag to a batch in flight and aux to its endpoint: an
    // answer from any other peer completes nothing.
    kvs_push_aux(w->ctx, h.tag, (uint64_t)(uintptr_t)param->reply_ep,
                 (h.flags & KVS_ACK_FENCED) ? KVS_EV_ACK_FENCED : KVS_EV_ACK,
                 (ucs_status_t)h.status);
    return UCS_OK;
}

static ucs_status_t kvs_set_handlers(ucp_worker_h w, kvs_wk_t *wk)
{
    static const struct {
        unsigned id;
        ucp_am_recv_callback_t cb;
    } hs[] = {{KVS_AM_WRITE, kvs_am_write_cb},
              {KVS_AM_FLUSH, kvs_am_flush_cb},
              {KVS_AM_ACK, kvs_am_ack_cb}};
    ucp_am_handler_param_t p;
    ucs_status_t status;
    size_t i;

    for (i = 0; i < sizeof(hs) / sizeof(hs[0]); i++) {
        memset(&p, 0, sizeof(p));
        p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                       UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
        p.id  = hs[i].id;
        p.cb  = hs[i].cb;
        p.arg = wk;
        status = ucp_worker_set_am_recv_handler(w, &p);
        if (status != UCS_OK) {
            return status;
        }
    }
    return UCS_OK;
}

// kvs_worker_new creates a worker of c's context, with its event fd when the
// context has UCP_FEATURE_WAKEUP.
static ucs_status_t kvs_worker_new(kvs_ctx_t *c, ucp_worker_h *w, int *efd,
                                   kvs_wk_t *wk)
{
    ucp_worker_params_t wparams;
    ucs_status_t status;

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // Serialized, not single: the progress goroutine makes every call, one
    // at a time, but Go may run it on different OS threads.
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    status = ucp_worker_create(c->context, &wparams, w);
    if (status != UCS_OK) {
        return status;
    }
    wk->ctx    = c;
    wk->worker = *w;
    status = kvs_set_handlers(*w, wk);
    if (status != UCS_OK) {
        ucp_worker_destroy(*w);
        return status;
    }
    *efd = -1;
    if (c->wakeup) {
        status = ucp_worker_get_efd(*w, efd);
        if (status != UCS_OK) {
            ucp_worker_destroy(*w);
        }
    }
    return status;
}

static ucs_status_t kvs_init_locked(kvs_ctx_t **out, const char **keys,
                                    const char **vals, int nkv, int wakeup,
                                    int rma, uint64_t frag, const char *name)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucs_status_t status;
    kvs_ctx_t *c;
    int i;

    c = calloc(1, sizeof(*c));
    if (c == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    c->efd  = -1;
    c->frag = frag;
    c->am_proto = UCP_AM_SEND_FLAG_EAGER;
    pthread_mutex_init(&c->lock, NULL);

    // Reads UCX_* from the environment; the caller's overrides come on top.
    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        goto err_free;
    }
    for (i = 0; i < nkv; i++) {
        status = ucp_config_modify(config, keys[i], vals[i]);
        if (status != UCS_OK) {
            ucp_config_release(config);
            goto err_free;
        }
    }

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_NAME;
    // RMA only where asked for: with it UCX installs its put and get
    // emulation handlers, which apply any address a peer names.
    params.features   = UCP_FEATURE_AM | (rma ? UCP_FEATURE_RMA : 0) |
                        (wakeup ? UCP_FEATURE_WAKEUP : 0);
    params.name       = name;
    status = ucp_init(&params, config, &c->context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        goto err_free;
    }

    c->wakeup = wakeup;
    status = kvs_worker_new(c, &c->worker, &c->efd, &c->wk);
    if (status != UCS_OK) {
        goto err_cleanup;
    }
    c->pfd = calloc(1, sizeof(*c->pfd));
    if (c->pfd == NULL) {
        status = UCS_ERR_NO_MEMORY;
        goto err_worker;
    }
    *out = c;
    return UCS_OK;

err_worker:
    ucp_worker_destroy(c->worker);
err_cleanup:
    ucp_cleanup(c->context);
err_free:
    pthread_mutex_destroy(&c->lock);
    free(c);
    return status;
}

static void kvs_access_close_locked(kvs_ctx_t *c, ucp_worker_h w);

static void kvs_destroy_locked(kvs_ctx_t *c)
{
    while (c->naw > 0) {
        kvs_access_close_locked(c, c->aw[c->naw - 1]);
    }
    free(c->aw);
    free(c->awk);
    free(c->aefd);
    free(c->regs);
    free(c->pfd);
    ucp_worker_destroy(c->worker);
    // A parked worker is never destroyed (see kvs_access_park), so the
    // context it belongs to is left as it is: the process's exit frees both.
    if (c->nparked == 0) {
        ucp_cleanup(c->context);
    }
    free(c->parked);
    pthread_mutex_destroy(&c->lock);
    free(c->ev);
    free(c);
}

ucs_status_t kvs_address(ucp_worker_h w, void **buf, size_t *len)
{
    ucp_address_t *addr;
    size_t n;
    ucs_status_t status;

    status = ucp_worker_get_address(w, &addr, &n);
    if (status != UCS_OK) {
        return status;
    }
    *buf = malloc(n);
    if (*buf == NULL) {
        ucp_worker_release_address(w, addr);
        return UCS_ERR_NO_MEMORY;
    }
    memcpy(*buf, addr, n);
    *len = n;
    ucp_worker_release_address(w, addr);
    return UCS_OK;
}

// Closes an access point's listener (pending connection requests are
// rejected by ucp_listener_destroy). Only right before its worker is
// destroyed: UCX 1.13's tcp connection manager frees the listener while a
// connection it accepted, whose first bytes (the peer's header) it has not
// read yet, still points to it; when those bytes arrive it calls through
// the freed listener on its async thread (a SIGSEGV: a peer stopped between
// its connect and its first send, then resumed after its session was
// revoked, did it). Destroying the worker closes such connections with its
// connection manager.
static void kvs_unlisten(kvs_wk_t *wk)
{
    if (wk->listener != NULL) {
        ucp_listener_h l = wk->listener;
        wk->listener = NULL;
        ucp_listener_destroy(l);
    }
}

// ---- Access points' connections (doc.go, "Connection setup") ----
//
// Where the transport's options pick one (UCX older than 1.14), a peer
// connects to an access point through its listener (UCX's sockaddr
// connection manager), not by its worker address. By a worker address,
// the access point's worker answers the peer's wireup
// request with a reply it queues on a transport endpoint it connects back
// to the peer, with no wireup proxy in between; over tcp, when that
// connection fails (the peer died), UCX 1.13 purges the queued reply
// through ucp_request_send_state_ff, which asserts that no reply is ever
// purged there and aborts the process (ucp_request.c:684). Through the
// listener the accepted endpoint's lanes stay wireup proxies until the
// peer's final ACK, and a proxy purges the wireup messages queued behind it
// itself (ucp_wireup_ep_pending_purge), so a peer that dies at any point
// of the setup only fails the endpoint.

static void kvs_accepted_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    kvs_wk_t *w = arg;
    unsigned i;
    (void)status;
    // The peer closed the connection, or is gone (the session's loss is
    // the control plane's to declare): the endpoint leaves the accepted
    // ones, so that the peer's next connection (a reconnection after a
    // broken one) is taken, and is closed after this progress (kvs_reap).
    w->ep_errors++;
    // Its refused writes are no later connection's (the pointer may be
    // reused once it is closed).
    (void)kvs_nack_take(w, ep);
    if (w->nfailed == KVS_ACCEPT_MAX) {
        return; // it keeps its place until the worker goes
    }
    for (i = 0; i < w->naccepted; i++) {
        if (w->accepted[i] == ep) {
            w->accepted[i] = w->accepted[--w->naccepted];
            w->failed[w->nfailed++] = ep;
            break;
        }
    }
}

// Closes the accepted endpoints that failed (kvs_accepted_err_cb), outside
// UCX's error callback; UCX releases each once its close completed.
static void kvs_reap(kvs_wk_t *w)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    int closed = 0;

    while (w->nfailed > 0) {
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags        = UCP_EP_CLOSE_FLAG_FORCE;
        sp = ucp_ep_close_nbx(w->failed[--w->nfailed], &param);
        if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
            ucp_request_free(sp);
        }
        closed = 1;
    }
    if (closed) {
        kvs_settle(w->worker);
    }
}

// Accepts a peer's connection request, while the access point is not
// revoked and holds fewer than KVS_ACCEPT_MAX; refuses it otherwise.
// Called by ucp_worker_progress of the access point's worker.
static void kvs_conn_cb(ucp_conn_request_h req, void *arg)
{
    kvs_wk_t *w = arg;
    ucp_ep_params_t params;
    ucs_status_t status;

    if (w->revoked || w->listener == NULL || w->naccepted == KVS_ACCEPT_MAX) {
        w->rejected++;
        if (w->listener != NULL) {
            ucp_listener_reject(w->listener, req);
        }
        return;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_CONN_REQUEST |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.conn_request    = req;
    params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb  = kvs_accepted_err_cb;
    params.err_handler.arg = w;
    status = ucp_ep_create(w->worker, &params, &w->accepted[w->naccepted]);
    if (status == UCS_OK) {
        w->naccepted++;
    } else {
        w->rejected++; // UCX released the request
    }
}

static int kvs_sockaddr(struct sockaddr_storage *ss, socklen_t *len,
                        const char *ip, int v6, uint16_t port)
{
    memset(ss, 0, sizeof(*ss));
    if (v6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6*)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port   = htons(port);
        *len           = sizeof(*a);
        return inet_pton(AF_INET6, ip, &a->sin6_addr) == 1;
    }
    struct sockaddr_in *a = (struct sockaddr_in*)ss;
    a->sin_family = AF_INET;
    a->sin_port   = htons(port);
    *len          = sizeof(*a);
    return inet_pton(AF_INET, ip, &a->sin_addr) == 1;
}

// Opens the access point's listener on ip (IPv6 if v6), on a port the
// kernel picks; *port is that port.
static ucs_status_t kvs_access_listen_locked(kvs_wk_t *wk, const char *ip,
                                             int v6, uint16_t *port)
{
    ucp_listener_params_t params;
    ucp_listener_attr_t attr;
    struct sockaddr_storage ss;
    socklen_t len;
    ucs_status_t status;

    if (!kvs_sockaddr(&ss, &len, ip, v6, 0)) {
        return UCS_ERR_INVALID_PARAM;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask         = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR |
                                UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
    params.sockaddr.addr      = (const struct sockaddr*)&ss;
    params.sockaddr.addrlen   = len;
    params.conn_handler.cb    = kvs_conn_cb;
    params.conn_handler.arg   = wk;
    status = ucp_listener_create(wk->worker, &params, &wk->listener);
    if (status != UCS_OK) {
        wk->listener = NULL;
        return status;
    }
    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
    status = ucp_listener_query(wk->listener, &attr);
    if (status != UCS_OK) {
        kvs_unlisten(wk);
        return status;
    }
    if (attr.sockaddr.ss_family == AF_INET6) {
        *port = ntohs(((struct sockaddr_in6*)&attr.sockaddr)->sin6_port);
    } else {
        *port = ntohs(((struct sockaddr_in*)&attr.sockaddr)->sin_port);
    }
    return UCS_OK;
}

// An access point is a worker of the same context: memory registrations and
// packed remote keys belong to the context, so every region is writable
// through any of its workers, and destroying the worker closes exactly the
// connections peers made to it.
static ucs_status_t kvs_access_open_locked(kvs_ctx_t *c, ucp_worker_h *w,
                                           kvs_wk_t **wkp)
{
    ucs_status_t status;
    kvs_wk_t *wk;
    int efd;

    if (c->naw == c->caw) {
        size_t cap = c->caw ? 2 * c->caw : 4;
        ucp_worker_h *aw = realloc(c->aw, cap * sizeof(*aw));
        if (aw == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->aw = aw;
        kvs_wk_t **awk = realloc(c->awk, cap * sizeof(*awk));
        if (awk == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->awk = awk;
        int *aefd = realloc(c->aefd, cap * sizeof(*aefd));
        if (aefd == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->aefd = aefd;
        struct pollfd *pfd = realloc(c->pfd, (1 + cap) * sizeof(*pfd));
        if (pfd == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->pfd = pfd;
        c->caw = cap;
    }
    wk = calloc(1, sizeof(*wk));
    if (wk == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    status = kvs_worker_new(c, w, &efd, wk);
    if (status != UCS_OK) {
        free(wk);
        return status;
    }
    c->aw[c->naw]   = *w;
    c->awk[c->naw]  = wk;
    c->aefd[c->naw] = efd;
    c->naw++;
    // One peer per access point: its epochs can be fenced (doc.go,
    // "Epochs"). The transport's own worker takes any number of peers,
    // whose epochs are unrelated, and does not fence.
    wk->fence = 1;
    *wkp = wk;
    return UCS_OK;
}

// Cuts the peers of an access point off: its handlers apply nothing more
// and answer every FLUSH with an error, so a peer's later batches fail.
// Called on the progress goroutine, where the handlers run, it is a
// barrier: no message write through it lands afterwards.
void kvs_access_revoke(kvs_wk_t *wk)
{
    // The listener stays until the worker goes (kvs_access_close), refusing
    // every connection request from now on (kvs_conn_cb): see kvs_unlisten.
    wk->revoked = 1;
}

// Destroys an access point's worker: its endpoints and interfaces go, and
// with them the connections peers made to it (over TCP the sockets close,
// unread; over RDMA the queue pairs and DC targets are destroyed), so that
// UCX applies nothing more that arrives for it.
static void kvs_access_close_locked(kvs_ctx_t *c, ucp_worker_h w)
{
    kvs_wk_t *wk = NULL;
    size_t i;

    for (i = 0; i < c->naw; i++) {
        if (c->aw[i] == w) {
            wk = c->awk[i];
            c->naw--;
            c->aw[i]   = c->aw[c->naw];
            c->awk[i]  = c->awk[c->naw];
            c->aefd[i] = c->aefd[c->naw];
            break;
        }
    }
    if (wk != NULL) {
        kvs_unlisten(wk);
    }
    ucp_worker_destroy(w);
    free(wk); // its handlers cannot run any more
#ifdef __GLIBC__
    // A worker's buffers and FIFOs are freed into whichever malloc arena
    // the progress goroutine's thread of the moment used, and glibc keeps
    // freed arena memory: a decode that opens and closes one worker per
    // session grew by about 0.4 MB a session without this (measured over
    // 60 sessions, 36 MB of it returned by one malloc_trim).
    malloc_trim(0);
#endif
}

// Parks an access point's worker: it leaves the progress and wait sets, so
// nothing that arrives for it is applied any more (over TCP, UD and shared
// memory FIFOs UCX applies a put only when the receiving worker is
// progressed), and it is never destroyed. Destroying it would tear down its
// connections, which UCX 1.13 cannot do while a connection setup with a
// peer that stopped answering is pending: purging the setup's reply trips
// an assertion and aborts the process (removed upstream in 1.14,
// openucx/ucx 9ccaf31). A parked worker's sockets stay open and unread
// until the process exits.
ucs_status_t kvs_access_park(kvs_ctx_t *c, ucp_worker_h w)
{
    size_t i;

    if (c->nparked == c->cparked) {
        size_t cap = c->cparked ? 2 * c->cparked : 4;
        ucp_worker_h *p = realloc(c->parked, cap * sizeof(*p));
        if (p == NULL) {
            return UCS_ERR_NO_MEMORY;
        }
        c->parked  = p;
        c->cparked = cap;
    }
    for (i = 0; i < c->naw; i++) {
        if (c->aw[i] == w) {
            // Its listener stays, as the worker does (see kvs_unlisten):
            // a connection request now waits for a progress that never
            // comes, and kvs_conn_cb would refuse it anyway.
            c->awk[i]->revoked = 1;
            c->naw--;
            c->aw[i]   = c->aw[c->naw];
            c->awk[i]  = c->awk[c->naw]; // the parked one's stays allocated
            c->aefd[i] = c->aefd[c->naw];
            break;
        }
    }
    c->parked[c->nparked++] = w;
    return UCS_OK;
}

// Adds [addr, +len) to the table of regions message writes may land in,
// in a free slot (a cleared one gets a new generation).
ucs_status_t kvs_region_set(kvs_ctx_t *c, uint64_t addr, uint64_t len,
                            uint64_t secret, uint32_t *slot, uint32_t *gen)
{
    size_t i;

    for (i = 0; i < c->nregs && c->regs[i].live; i++) {
    }
    if (i == c->nregs) {
        if (c->nregs == c->cregs) {
            size_t cap = c->cregs ? 2 * c->cregs : 16;
            kvs_region_t *r = realloc(c->regs, cap * sizeof(*r));
            if (r == NULL) {
                return UCS_ERR_NO_MEMORY;
            }
            c->regs  = r;
            c->cregs = cap;
        }
        memset(&c->regs[c->nregs], 0, sizeof(c->regs[0]));
        c->nregs++;
    }
    c->regs[i].addr = addr;
    c->regs[i].len  = len;
    c->regs[i].gen++;
    c->regs[i].live   = 1;
    c->regs[i].secret = secret;
    *slot           = (uint32_t)i;
    *gen            = c->regs[i].gen;
    return UCS_OK;
}

// Takes a region out of the table: on the progress goroutine, where the
// handlers run, no message write lands in it afterwards.
void kvs_region_clear(kvs_ctx_t *c, uint32_t slot)
{
    if (slot < c->nregs) {
        c->regs[slot].live = 0;
    }
}

void kvs_req_free(kvs_req_t *r)
{
    free(r->hdrs);
    free(r);
}

// Fills ucp_mem_map's parameters: the registration of [addr, +len) of
// memory type mt, or with alloc set an allocation of len bytes of memory
// type mt. mt < 0 leaves the type out, for UCX to detect (registration) or
// to take as host memory (allocation).
void kvs_map_params(ucp_mem_map_params_t *p, uint64_t addr, uint64_t len,
                    int mt, int alloc)
{
    memset(p, 0, sizeof(*p));
    p->field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                    UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p->address    = alloc ? NULL : (void*)(uintptr_t)addr;
    p->length     = len;
    if (alloc) {
        p->field_mask |= UCP_MEM_MAP_PARAM_FIELD_FLAGS;
        p->flags       = UCP_MEM_MAP_ALLOCATE;
    }
    if (mt >= 0) {
        p->field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        p->memory_type = (ucs_memory_type_t)mt;
    }
}

// Maps memory (kvs_map_params says what) and packs its remote key, unless
// rkey is NULL. An allocation's address comes back in *addr_out.
ucs_status_t kvs_mem_map(kvs_ctx_t *c, uint64_t addr, uint64_t len, int mt,
                         int alloc, ucp_mem_h *memh, void **addr_out,
                         void **rkey, size_t *rkey_len)
{
    ucp_mem_map_params_t params;
    ucp_mem_attr_t attr;
    ucs_status_t status;

    kvs_map_params(&params, addr, len, mt, alloc);
    status = ucp_mem_map(c->context, &params, memh);
    if (status != UCS_OK) {
        return status;
    }
    *addr_out = (void*)(uintptr_t)addr;
    if (alloc) {
        memset(&attr, 0, sizeof(attr));
        attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
        status = ucp_mem_query(*memh, &attr);
        if (status == UCS_OK && attr.length < len) {
            status = UCS_ERR_NO_MEMORY;
        }
        if (status != UCS_OK) {
            ucp_mem_unmap(c->context, *memh);
            return status;
        }
        *addr_out = attr.address;
    }
    if (rkey == NULL) {
        return UCS_OK; // message mode: no peer gets a UCX key to it
    }
    status = ucp_rkey_pack(c->context, *memh, rkey, rkey_len);
    if (status != UCS_OK) {
        ucp_mem_unmap(c->context, *memh);
    }
    return status;
}

ucs_status_t kvs_mem_unmap(kvs_ctx_t *c, ucp_mem_h memh)
{
    return ucp_mem_unmap(c->context, memh);
}

static ucs_status_t kvs_ep_create_locked(kvs_ctx_t *c, kvs_ep_t *e,
                                         const void *addr)
{
    ucp_ep_params_t params;

    memset(&params, 0, sizeof(params));
    params.field_mask      = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address         = addr;
    params.err_mode        = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb  = kvs_err_cb;
    params.err_handler.arg = e;
    e->ctx = c;
    return ucp_ep_create(c->worker, &params, &e->ep);
}

// Connects to an access point's listener at ip:port (UCX's client-server
// connection establishment; see kvs_conn_cb for why).
static ucs_status_t kvs_ep_connect_locked(kvs_ctx_t *c, kvs_ep_t *e,
                                          const char *ip, int v6,
                                          uint16_t port)
{
    ucp_ep_params_t params;
    struct sockaddr_storage ss;
    socklen_t len;

    if (!kvs_sockaddr(&ss, &len, ip, v6, port)) {
        return UCS_ERR_INVALID_PARAM;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask       = UCP_EP_PARAM_FIELD_FLAGS |
                              UCP_EP_PARAM_FIELD_SOCK_ADDR |
                              UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                              UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags            = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr    = (const struct sockaddr*)&ss;
    params.sockaddr.addrlen = len;
    params.err_mode         = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb   = kvs_err_cb;
    params.err_handler.arg  = e;
    e->ctx = c;
    return ucp_ep_create(c->worker, &params, &e->ep);
}

// Starts a forced close. The KVS_EV_EP_CLOSED event is queued whether the
// close completes now or later, so Go has a single path for it.
static ucs_status_t kvs_ep_close_locked(kvs_ctx_t *c, kvs_ep_t *e)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_USER_DATA;
    param.flags        = UCP_EP_CLOSE_FLAG_FORCE;
    param.cb.send      = kvs_close_cb;
    param.user_data    = e;
    sp = ucp_ep_close_nbx(e->ep, &param);
    if (sp == NULL) {
        kvs_push(c, e->id, KVS_EV_EP_CLOSED, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
        // The endpoint is released anyway (ucp.h), only with an error.
        kvs_push(c, e->id, KVS_EV_EP_CLOSED, UCS_PTR_STATUS(sp));
    }
    // After the close's event (a forced close completes at once): what the
    // settling progress completes of the endpoint's batches, Go finds
    // already failed by the close.
    kvs_settle(c->worker);
    if (sp == NULL) {
        return UCS_OK;
    }
    return UCS_PTR_IS_ERR(sp) ? UCS_PTR_STATUS(sp) : UCS_INPROGRESS;
}

// Flushes everything posted on the endpoint so far; KVS_EV_EP_DRAINED is
// queued when that completed at the target (or failed).
static void kvs_ep_drain_locked(kvs_ctx_t *c, kvs_ep_t *e)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send      = kvs_drain_cb;
    param.user_data    = e;
    sp = ucp_ep_flush_nbx(e->ep, &param);
    if (sp == NULL) {
        kvs_push(c, e->id, KVS_EV_EP_DRAINED, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
        kvs_push(c, e->id, KVS_EV_EP_DRAINED, UCS_PTR_STATUS(sp));
    }
}

ucs_status_t kvs_rkey_unpack(kvs_ep_t *e, const void *buf, uint64_t *rkey)
{
    ucp_rkey_h h;
    ucs_status_t status = ucp_ep_rkey_unpack(e->ep, buf, &h);
    if (status == UCS_OK) {
        *rkey = (uint64_t)(uintptr_t)h;
    }
    return status;
}

void kvs_rkey_destroy(uint64_t rkey)
{
    ucp_rkey_destroy((ucp_rkey_h)(uintptr_t)rkey);
}

// Posts the writes of nb batches, one after the other (counts[i] writes
// for batch i, ws holding them all in order), then one flush whose
// completion completes them all: ucp_ep_flush_nbx completes only when all
// earlier RMA on the endpoint is complete at the target, which is the
// remote visibility that rdma.Endpoint.Post promises, for every batch
// before it. One flush for the batches that were queued together is what
// keeps small writes from paying a flush (a round trip over TCP) each.
//
// A write with rkey 0 is a message write (doc.go, "Writes"): cut into
// messages of at most c->frag bytes, each a KVS_AM_WRITE whose header names
// the region's slot and generation in the receiver's table. Then a
// KVS_AM_FLUSH carrying r's tag asks the receiver to answer (KVS_EV_ACK)
// once it handled every write before it; the flush then completes the
// messages locally. Returns 1 when a FLUSH went out (its answer is
// awaited), else 0.
//
// A write that fails to start stops its batch; errs[i] is that batch's
// first failure (UCS_OK if none), and the flush still runs, so that every
// batch is reported only once nothing of it is still in flight. r is the
// flush's record: its KVS_EV_BATCH event carries the flush's status.
static int kvs_post_locked(kvs_ctx_t *c, kvs_ep_t *e, const kvs_write_t *ws,
                           const uint32_t *counts, int32_t *errs, size_t nb,
                           kvs_req_t *r)
{
    ucp_request_param_t param;
    ucs_status_ptr_t sp;
    size_t b, i, k = 0, nh = 0, h = 0;
    uint64_t off, n;
    int acked = 0, oom = 0;

    r->ctx        = c;
    r->first_err  = UCS_OK;
    r->writes_out = 0;
    r->report_due = 0;
    for (b = 0; b < nb; b++) {
        for (i = 0; i < counts[b]; i++, k++) {
            if (ws[k].rkey == 0 && ws[k].len > 0) {
                nh += (ws[k].len + c->frag - 1) / c->frag;
            }
        }
    }
    if (nh > r->chdrs) {
        kvs_am_write_hdr_t *hd = realloc(r->hdrs, nh * sizeof(*hd));
        if (hd == NULL) {
            oom = 1; // nothing starts; the flush below still reports
        } else {
            r->hdrs  = hd;
            r->chdrs = nh;
        }
    }

    memset(&param, 0, sizeof(param));
    for (b = 0, k = 0; b < nb; b++) {
        errs[b] = oom ? UCS_ERR_NO_MEMORY : UCS_OK;
        for (i = 0; i < counts[b]; i++, k++) {
            if (ws[k].len == 0 || errs[b] != UCS_OK) {
                continue;
            }
            if (ws[k].rkey != 0) {
                // Passing the source's memh spares UCX a registration
                // lookup.
                param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                     UCP_OP_ATTR_FIELD_USER_DATA |
                                     (ws[k].memh ? UCP_OP_ATTR_FIELD_MEMH : 0);
                param.cb.send      = kvs_write_cb;
                param.user_data    = r;
                param.memh         = (ucp_mem_h)(uintptr_t)ws[k].memh;
                sp = ucp_put_nbx(e->ep, (void*)(uintptr_t)ws[k].src,
                                 ws[k].len, ws[k].dst,
                                 (ucp_rkey_h)(uintptr_t)ws[k].rkey, &param);
                if (UCS_PTR_IS_ERR(sp)) {
                    errs[b] = UCS_PTR_STATUS(sp);
                } else if (sp != NULL) {
                    r->writes_out++; // kvs_write_cb releases it
                }
                continue;
            }
            for (off = 0; off < ws[k].len && errs[b] == UCS_OK; off += n) {
                n = ws[k].len - off;
                if (n > c->frag) {
                    n = c->frag;
                }
                r->hdrs[h].slot = ws[k].slot;
                r->hdrs[h].gen  = ws[k].gen;
                r->hdrs[h].dst  = ws[k].dst + off;
                r->hdrs[h].epoch = r->epoch;
                r->hdrs[h].pad   = 0;
                r->hdrs[h].secret = ws[k].secret;
                param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS |
                                     UCP_OP_ATTR_FIELD_CALLBACK |
                                     UCP_OP_ATTR_FIELD_USER_DATA |
                                     (ws[k].memh ? UCP_OP_ATTR_FIELD_MEMH : 0);
                // REPLY: the receiver tells this connection's refused
                // writes from another's (kvs_nack_set).
                param.flags        = c->am_proto | UCP_AM_SEND_FLAG_REPLY;
                param.cb.send      = kvs_write_cb;
                param.user_data    = r;
                param.memh         = (ucp_mem_h)(uintptr_t)ws[k].memh;
                sp = ucp_am_send_nbx(e->ep, KVS_AM_WRITE, &r->hdrs[h],
                                     sizeof(r->hdrs[h]),
                                     (void*)(uintptr_t)(ws[k].src + off), n,
                                     &param);
                h++;
                if (UCS_PTR_IS_ERR(sp)) {
                    errs[b] = UCS_PTR_STATUS(sp);
                } else if (sp != NULL) {
                    r->writes_out++; // kvs_write_cb releases it
                }
            }
        }
    }

    if (h > 0) {
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags        = c->am_proto | UCP_AM_SEND_FLAG_REPLY;
        r->flush_hdr.tag   = r->id;
        r->flush_hdr.epoch = r->epoch;
        r->flush_hdr.pad   = 0;
        sp = ucp_am_send_nbx(e->ep, KVS_AM_FLUSH, &r->flush_hdr,
                             sizeof(r->flush_hdr), NULL, 0, &param);
        if (UCS_PTR_IS_ERR(sp)) {
            // No answer will come: the batch fails with the flush.
            r->first_err = UCS_PTR_STATUS(sp);
        } else {
            if (sp != NULL) {
                ucp_request_free(sp);
            }
            acked = 1;
        }
    }

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send      = kvs_flush_cb;
    param.user_data    = r;
    sp = ucp_ep_flush_nbx(e->ep, &param);
    if (sp == NULL) {
        kvs_report(r, UCS_OK);
    } else if (UCS_PTR_IS_ERR(sp)) {
        kvs_report(r, UCS_PTR_STATUS(sp));
    }
    return acked;
}

// Progresses the worker until it has nothing more to do (or max_iter
// rounds), then moves up to cap queued events into out and returns their
// count, with bit 31 set if an event was lost. The progress count goes to
// c->progressed, so the caller can tell idle from busy without passing a
// pointer (which would make cgo allocate on every call).
static unsigned kvs_poll_locked(kvs_ctx_t *c, kvs_event_t *out, unsigned cap,
                                unsigned max_iter)
{
    unsigned total = 0, n, i;
    size_t k, a;

    for (i = 0; i < max_iter; i++) {
        n = ucp_worker_progress(c->worker);
        total += n;
        if (n == 0 || c->nev >= cap) {
            break;
        }
    }
    // Access points only receive (puts emulated with messages they apply,
    // wire-up, flush replies): one round each.
    for (a = 0; a < c->naw; a++) {
        total += ucp_worker_progress(c->aw[a]);
        kvs_reap(c->awk[a]);
    }
    c->progressed = total;
    if (c->nev == 0 && !c->oom) {
        return 0;
    }

    pthread_mutex_lock(&c->lock);
    k = c->nev < cap ? c->nev : cap;
    memcpy(out, c->ev, k * sizeof(*out));
    memmove(c->ev, c->ev + k, (c->nev - k) * sizeof(*out));
    c->nev -= k;
    if (c->oom) {
        c->oom = 0;
        k |= 0x80000000u;
    }
    pthread_mutex_unlock(&c->lock);
    return (unsigned)k;
}

// Sleeps until the worker has an event, ucp_worker_signal is called, or
// timeout_us passes (ppoll, for sub-millisecond naps). Returns 1 when the
// worker had unprocessed events and must be progressed before it can sleep.
int kvs_wait(kvs_ctx_t *c, long timeout_us)
{
    struct timespec ts;
    ucs_status_t status;
    size_t i;

    ts.tv_sec  = timeout_us / 1000000;
    ts.tv_nsec = (timeout_us % 1000000) * 1000;
    if (c->efd < 0) {
        nanosleep(&ts, NULL);
        return 0;
    }
    // Arming is a UCP call on every worker (see kvs_ucx_rw); the sleep
    // itself holds nothing.
    kvs_enter(0);
    for (i = 0; i <= c->naw; i++) {
        ucp_worker_h w = i == 0 ? c->worker : c->aw[i - 1];
        status = ucp_worker_arm(w);
        if (status != UCS_OK) {
            kvs_leave();
            return status == UCS_ERR_BUSY ? 1 : -1;
        }
        c->pfd[i].fd      = i == 0 ? c->efd : c->aefd[i - 1];
        c->pfd[i].events  = POLLIN;
        c->pfd[i].revents = 0;
    }
    kvs_leave();
    // EINTR (Go's preemption signals) just ends the nap early.
    ppoll(c->pfd, 1 + c->naw, &ts, NULL);
    return 0;
}

ucs_status_t kvs_signal(kvs_ctx_t *c)
{
    return ucp_worker_signal(c->worker);
}

// ---- The calls Go makes, each under kvs_ucx_rw (see the top) ----

ucs_status_t kvs_init(kvs_ctx_t **out, const char **keys, const char **vals,
                      int nkv, int wakeup, int rma, uint64_t frag,
                      const char *name)
{
    ucs_status_t status;

    kvs_enter(1);
    status = kvs_init_locked(out, keys, vals, nkv, wakeup, rma, frag, name);
    kvs_leave();
    return status;
}

// Sets an environment variable the process has not set. Under the
// exclusive lock: UCX reads its variables from the environment when a
// context or a worker reads its configuration, which the shim does only
// under that lock, and setenv must not race a reader.
void kvs_setenv_default(const char *name, const char *val)
{
    kvs_enter(1);
    setenv(name, val, 0);
    kvs_leave();
}

void kvs_destroy(kvs_ctx_t *c)
{
    kvs_enter(0);
    kvs_destroy_locked(c);
    kvs_leave();
}

ucs_status_t kvs_access_listen(kvs_wk_t *wk, const char *ip, int v6,
                               uint16_t *port)
{
    ucs_status_t status;

    kvs_enter(1);
    status = kvs_access_listen_locked(wk, ip, v6, port);
    kvs_leave();
    return status;
}

ucs_status_t kvs_access_open(kvs_ctx_t *c, ucp_worker_h *w, kvs_wk_t **wkp)
{
    ucs_status_t status;

    kvs_enter(1);
    status = kvs_access_open_locked(c, w, wkp);
    kvs_leave();
    return status;
}

void kvs_access_close(kvs_ctx_t *c, ucp_worker_h w)
{
    kvs_enter(0);
    kvs_access_close_locked(c, w);
    kvs_leave();
}

ucs_status_t kvs_ep_create(kvs_ctx_t *c, kvs_ep_t *e, const void *addr)
{
    ucs_status_t status;

    kvs_enter(1);
    status = kvs_ep_create_locked(c, e, addr);
    kvs_leave();
    return status;
}

ucs_status_t kvs_ep_connect(kvs_ctx_t *c, kvs_ep_t *e, const char *ip, int v6,
                            uint16_t port)
{
    ucs_status_t status;

    kvs_enter(1);
    status = kvs_ep_connect_locked(c, e, ip, v6, port);
    kvs_leave();
    return status;
}

ucs_status_t kvs_ep_close(kvs_ctx_t *c, kvs_ep_t *e)
{
    ucs_status_t status;

    kvs_enter(0);
    status = kvs_ep_close_locked(c, e);
    kvs_leave();
    return status;
}

void kvs_ep_drain(kvs_ctx_t *c, kvs_ep_t *e)
{
    kvs_enter(0);
    kvs_ep_drain_locked(c, e);
    kvs_leave();
}

int kvs_post(kvs_ctx_t *c, kvs_ep_t *e, const kvs_write_t *ws,
             const uint32_t *counts, int32_t *errs, size_t nb, kvs_req_t *r)
{
    int acked;

    kvs_enter(0);
    acked = kvs_post_locked(c, e, ws, counts, errs, nb, r);
    kvs_leave();
    return acked;
}

// kvs_accepts says whether an access point of c has a listener: its
// progress may accept a connection, which adds a handler. Only c's progress
// goroutine sets or clears a listener, and it is the caller.
static int kvs_accepts(const kvs_ctx_t *c)
{
    size_t a;

    for (a = 0; a < c->naw; a++) {
        if (c->awk[a]->listener != NULL) {
            return 1;
        }
    }
    return 0;
}

unsigned kvs_poll(kvs_ctx_t *c, kvs_event_t *out, unsigned cap,
                  unsigned max_iter)
{
    unsigned k;

    kvs_enter(kvs_accepts(c));
    k = kvs_poll_locked(c, out, cap, max_iter);
    kvs_leave();
    return k;
}
