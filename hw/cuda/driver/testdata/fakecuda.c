// fakecuda.c: a stand-in libcuda.so.1 for testing the purego bindings on
// machines without a GPU (TestCFakeLibcuda builds it with the system C
// compiler). The prototypes are those of cuda.h; "device memory" is host
// memory, copies happen at once, and time is modeled: asynchronous work
// keeps its stream busy for bytes / FAKE_BANDWIDTH seconds, so that events
// recorded behind it report CUDA_ERROR_NOT_READY until then. Like the real
// driver, every context-scoped call fails with CUDA_ERROR_INVALID_CONTEXT
// unless the primary context is current on the calling thread.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef struct stream *CUstream;
typedef struct event *CUevent;

/* Slow enough that the modeled time left after the last of a test's long
 * copies (64 MiB: 33 ms) outlasts a descheduled test thread on a loaded
 * 2-core machine; at 20e9 it was 6.7 ms and the test failed under load. */
#define FAKE_BANDWIDTH 4e9 /* bytes per second */
#define STREAM_MAGIC 0x57AEA11u
#define EVENT_MAGIC 0xE7E27u

struct stream {
	unsigned magic;
	double busy_until;
};
struct event {
	unsigned magic;
	double done_at;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int primary_obj;
static int retains;
static __thread CUcontext current;
static struct stream legacy = {STREAM_MAGIC, 0};
static double all_busy_until; /* blocking streams sync with legacy ops */

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t) {
	for (double n = now(); n < t; n = now()) {
		double d = t - n;
		struct timespec ts = {(time_t)d, (long)((d - (time_t)d) * 1e9)};
		nanosleep(&ts, NULL);
	}
}

/* ctx_ok: the primary context is retained and current on this thread. */
static int ctx_ok(void) { return retains > 0 && current == (CUcontext)&primary_obj; }

static struct stream *stream_of(CUstream s) {
	if (s == NULL)
		return &legacy;
	return s->magic == STREAM_MAGIC ? s : NULL;
}

static void enqueue(struct stream *s, size_t bytes) {
	double t = now();
	if (s->busy_until < t)
		s->busy_until = t;
	s->busy_until += (double)bytes / FAKE_BANDWIDTH;
	if (s->busy_until > all_busy_until)
		all_busy_until = s->busy_until;
}

#define ENTER()                                                                                    \
	pthread_mutex_lock(&mu);                                                                   \
	if (!ctx_ok()) {                                                                           \
		pthread_mutex_unlock(&mu);                                                         \
		return 201;                                                                        \
	}
#define LEAVE(r)                                                                                   \
	do {                                                                                       \
		pthread_mutex_unlock(&mu);                                                         \
		return (r);                                                                        \
	} while (0)

CUresult cuInit(unsigned int flags) { return flags == 0 ? 0 : 1; }

CUresult cuDeviceGetCount(int *count) {
	*count = 1;
	return 0;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
	if (ordinal != 0)
		return 101;
	*dev = 0;
	return 0;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
	if (dev != 0 || len <= 0)
		return 1;
	strncpy(name, "kvstream fakecuda", (size_t)len - 1);
	name[len - 1] = 0;
	return 0;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
	if (dev != 0)
		return 101;
	pthread_mutex_lock(&mu);
	retains++;
	pthread_mutex_unlock(&mu);
	*pctx = (CUcontext)&primary_obj;
	return 0;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
	if (dev != 0)
		return 101;
	pthread_mutex_lock(&mu);
	CUresult r = retains > 0 ? 0 : 709;
	if (retains > 0)
		retains--;
	pthread_mutex_unlock(&mu);
	return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
	if (ctx != NULL && ctx != (CUcontext)&primary_obj)
		return 201;
	current = ctx;
	return 0;
}

CUresult cuCtxGetCurrent(CUcontext *pctx) {
	*pctx = current;
	return 0;
}

CUresult cuStreamCreate(CUstream *ps, unsigned int flags) {
	ENTER();
	struct stream *s = calloc(1, sizeof *s);
	s->magic = STREAM_MAGIC;
	*ps = s;
	(void)flags;
	LEAVE(0);
}

CUresult cuStreamDestroy_v2(CUstream s) {
	ENTER();
	if (s == NULL || s->magic != STREAM_MAGIC)
		LEAVE(400);
	s->magic = 0;
	free(s);
	LEAVE(0);
}

CUresult cuStreamSynchronize(CUstream hs) {
	ENTER();
	struct stream *s = stream_of(hs);
	if (!s)
		LEAVE(400);
	double t = s->busy_until;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	return 0;
}

CUresult cuEventCreate(CUevent *pe, unsigned int flags) {
	ENTER();
	if (flags & ~0xFu)
		LEAVE(1);
	struct event *e = calloc(1, sizeof *e);
	e->magic = EVENT_MAGIC;
	*pe = e;
	LEAVE(0);
}

CUresult cuEventDestroy_v2(CUevent e) {
	ENTER();
	if (e == NULL || e->magic != EVENT_MAGIC)
		LEAVE(400);
	e->magic = 0;
	free(e);
	LEAVE(0);
}

CUresult cuEventRecord(CUevent e, CUstream hs) {
	ENTER();
	struct stream *s = stream_of(hs);
	if (!s || e == NULL || e->magic != EVENT_MAGIC)
		LEAVE(400);
	e->done_at = s->busy_until;
	LEAVE(0);
}

CUresult cuEventQuery(CUevent e) {
	ENTER();
	if (e == NULL || e->magic != EVENT_MAGIC)
		LEAVE(400);
	LEAVE(now() >= e->done_at ? 0 : 600);
}

CUresult cuEventSynchronize(CUevent e) {
	ENTER();
	if (e == NULL || e->magic != EVENT_MAGIC)
		LEAVE(400);
	double t = e->done_at;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	return 0;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
	ENTER();
	void *m = n ? malloc(n) : NULL;
	if (!m)
		LEAVE(n ? 2 : 1);
	*p = (CUdeviceptr)(size_t)m;
	LEAVE(0);
}

CUresult cuMemFree_v2(CUdeviceptr p) {
	ENTER();
	double t = all_busy_until;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	free((void *)(size_t)p);
	return 0;
}

/* Synchronous copies: wait for all (blocking) streams, like the legacy
 * default stream does. */
static CUresult sync_copy(void *dst, const void *src, size_t n) {
	ENTER();
	double t = all_busy_until;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	memmove(dst, src, n);
	return 0;
}

CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n) {
	return sync_copy((void *)(size_t)dst, src, n);
}

CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) {
	return sync_copy(dst, (const void *)(size_t)src, n);
}

CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream hs) {
	ENTER();
	struct stream *s = stream_of(hs);
	if (!s)
		LEAVE(400);
	memmove((void *)(size_t)dst, (const void *)(size_t)src, n);
	enqueue(s, 2 * n); /* read + write */
	LEAVE(0);
}

CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char v, size_t n) {
	ENTER();
	double t = all_busy_until;
	pthread_mutex_unlock(&mu);
	sleep_until(t);
	memset((void *)(size_t)dst, v, n);
	return 0;
}

CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char v, size_t n, CUstream hs) {
	ENTER();
	struct stream *s = stream_of(hs);
	if (!s)
		LEAVE(400);
	memset((void *)(size_t)dst, v, n);
	enqueue(s, n);
	LEAVE(0);
}

static const char *names[][2] = {
	{"CUDA_SUCCESS", "no error"},
	{"CUDA_ERROR_INVALID_VALUE", "invalid argument"},
	{"CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
};

CUresult cuGetErrorName(CUresult r, const char **p) {
	if (r < 0 || r > 2) {
		*p = NULL;
		return 1;
	}
	*p = names[r][0];
	return 0;
}

CUresult cuGetErrorString(CUresult r, const char **p) {
	if (r < 0 || r > 2) {
		*p = NULL;
		return 1;
	}
	*p = names[r][1];
	return 0;
}
