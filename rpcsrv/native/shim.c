/* rpcsrv's stand-in for the few TVM runtime entry points that compiled host code calls.
 *
 * Built by rpcsrv.native.shim with the board's C compiler at first use (cached) and loaded with
 * RTLD_GLOBAL before any user library, so that:
 *  - libraries from TVM's "c" target and tvm-ffi era libraries find the functions they call as
 *    undefined symbols (TVMBackend*, TVMAPISetLastError, TVMFuncCall, TVMFFI*);
 *  - rpcsrv can write these functions' addresses into the function-pointer globals that TVM's
 *    library loaders fill (__TVMBackendAllocWorkspace, __TVMFFIFunctionCall, ...).
 * The signatures are TVM's C ABI (c_backend_api.h, c_runtime_api.h of TVM <= 0.20; tvm-ffi's
 * c_api.h and extra/c_env_api.h); the code is ours.  Lookups of functions by name call back into
 * Python (rpcsrv_set_lookup); everything on the hot path (workspace, parallel tasks, errors) is C.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Prebuilt shims (shimbuild.py, -DRPCSRV_PORTABLE_GLIBC) bind the pthread functions to their first
 * symbol versions: glibc 2.34 moved them into libc under a new version, and a shim built there would
 * not load on an older board.  The old versions are still in a new libc; on an old board they come from
 * libpthread.so.0, which the prebuilt shim names as a dependency. */
#if defined(RPCSRV_PORTABLE_GLIBC) && defined(__GLIBC__)
#if defined(__x86_64__)
#define RPCSRV_GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define RPCSRV_GLIBC_BASE "GLIBC_2.17"
#elif defined(__arm__)
#define RPCSRV_GLIBC_BASE "GLIBC_2.4"
#endif
#ifdef RPCSRV_GLIBC_BASE
__asm__(".symver pthread_create,pthread_create@" RPCSRV_GLIBC_BASE);
__asm__(".symver pthread_join,pthread_join@" RPCSRV_GLIBC_BASE);
__asm__(".symver pthread_barrier_init,pthread_barrier_init@" RPCSRV_GLIBC_BASE);
__asm__(".symver pthread_barrier_wait,pthread_barrier_wait@" RPCSRV_GLIBC_BASE);
__asm__(".symver pthread_barrier_destroy,pthread_barrier_destroy@" RPCSRV_GLIBC_BASE);
#endif
#endif

#define RPCSRV_API __attribute__((visibility("default")))

/* ---------------------------------------------------------------- errors */
#define ERR_SIZE 4096
static __thread char last_error[ERR_SIZE];

RPCSRV_API const char* rpcsrv_last_error(void) { return last_error; }
RPCSRV_API void rpcsrv_clear_error(void) { last_error[0] = 0; }

static void set_error(const char* kind, const char** parts, int n) {
  size_t used = 0;
  last_error[0] = 0;
  if (kind && *kind && strcmp(kind, "RuntimeError") != 0) {
    used += (size_t)snprintf(last_error, ERR_SIZE, "%s: ", kind);
  }
  for (int i = 0; i < n && used < ERR_SIZE - 1; ++i) {
    if (parts[i] == NULL) continue;
    used += (size_t)snprintf(last_error + used, ERR_SIZE - used, "%s", parts[i]);
  }
}

RPCSRV_API void TVMAPISetLastError(const char* msg) { set_error(NULL, &msg, 1); }
RPCSRV_API void TVMFFIErrorSetRaisedFromCStr(const char* kind, const char* msg) { set_error(kind, &msg, 1); }
RPCSRV_API void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n) {
  set_error(kind, parts, n);
}
RPCSRV_API const char* TVMGetLastError(void) { return last_error; }

/* ---------------------------------------------------------------- workspace */
static long outstanding = 0; /* workspace blocks not yet freed (for leak checks) */

RPCSRV_API void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int code_hint,
                                          int bits_hint) {
  void* ptr = NULL;
  (void)device_type; (void)device_id; (void)code_hint; (void)bits_hint;
  if (posix_memalign(&ptr, 64, nbytes ? (size_t)nbytes : 1) != 0) {
    TVMAPISetLastError("TVMBackendAllocWorkspace: out of memory");
    return NULL;
  }
  __atomic_add_fetch(&outstanding, 1, __ATOMIC_RELAXED);
  return ptr;
}

RPCSRV_API int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type; (void)device_id;
  if (ptr) __atomic_sub_fetch(&outstanding, 1, __ATOMIC_RELAXED);
  free(ptr);
  return 0;
}

RPCSRV_API long rpcsrv_workspace_outstanding(void) { return __atomic_load_n(&outstanding, __ATOMIC_RELAXED); }

/* ---------------------------------------------------------------- parallel tasks */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

static int num_threads = 0; /* 0: the number of online CPUs */

RPCSRV_API void rpcsrv_set_num_threads(int n) { num_threads = n; }
RPCSRV_API int rpcsrv_get_num_threads(void) {
  if (num_threads > 0) return num_threads;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

typedef struct {
  FTVMParallelLambda flambda;
  void* cdata;
  TVMParallelGroupEnv env;
  pthread_barrier_t barrier;
  pthread_mutex_t lock;
  int status;
  char error[ERR_SIZE];
} Launch;

typedef struct {
  Launch* launch;
  int task_id;
} Task;

static void run_task(Launch* l, int task_id) {
  int rc = l->flambda(task_id, &l->env, l->cdata);
  if (rc != 0) {
    pthread_mutex_lock(&l->lock);
    if (l->status == 0) {
      l->status = rc;
      snprintf(l->error, ERR_SIZE, "%s", last_error);
    }
    pthread_mutex_unlock(&l->lock);
  }
}

static void* task_main(void* arg) {
  Task* t = (Task*)arg;
  run_task(t->launch, t->task_id);
  return NULL;
}

RPCSRV_API int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  Launch l;
  if (num_task <= 0) num_task = rpcsrv_get_num_threads();
  l.flambda = flambda;
  l.cdata = cdata;
  l.env.num_task = num_task;
  l.env.sync_handle = &l.barrier;
  l.status = 0;
  l.error[0] = 0;
  pthread_barrier_init(&l.barrier, NULL, (unsigned)num_task);
  pthread_mutex_init(&l.lock, NULL);
  pthread_t* threads = (pthread_t*)calloc((size_t)num_task, sizeof(pthread_t));
  Task* tasks = (Task*)calloc((size_t)num_task, sizeof(Task));
  int started = 1;
  if (threads == NULL || tasks == NULL) {
    num_task = 1; /* run on the caller alone; a barrier of 1 never waits */
  }
  for (int i = 1; i < num_task; ++i) {
    tasks[i].launch = &l;
    tasks[i].task_id = i;
    if (pthread_create(&threads[i], NULL, task_main, &tasks[i]) != 0) break;
    started = i + 1;
  }
  if (started < num_task) { /* could not start every thread: the barrier would never open */
    l.status = -1;
    snprintf(l.error, ERR_SIZE, "TVMBackendParallelLaunch: could not start %d threads", num_task);
    /* the started tasks may wait on the barrier; let them through */
    for (int i = started; i < num_task; ++i) pthread_barrier_wait(&l.barrier);
  } else {
    run_task(&l, 0);
  }
  for (int i = 1; i < started; ++i) pthread_join(threads[i], NULL);
  free(threads);
  free(tasks);
  pthread_barrier_destroy(&l.barrier);
  pthread_mutex_destroy(&l.lock);
  if (l.status != 0) {
    const char* msg = l.error;
    set_error(NULL, &msg, 1);
  }
  return l.status;
}

RPCSRV_API int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  pthread_barrier_wait((pthread_barrier_t*)penv->sync_handle);
  return 0;
}

RPCSRV_API int TVMBackendRunOnce(void** handle, int (*f)(void*), void* cdata, int nbytes) {
  (void)nbytes;
  if (*handle == NULL) {
    *handle = (void*)1;
    return f(cdata);
  }
  return 0;
}

static pthread_mutex_t once_lock = PTHREAD_MUTEX_INITIALIZER;

RPCSRV_API int TVMFFIHandleInitOnce(void** handle, int (*init)(void** result)) {
  int rc = 0;
  pthread_mutex_lock(&once_lock);
  if (*handle == NULL) rc = init(handle);
  pthread_mutex_unlock(&once_lock);
  return rc;
}

/* ---------------------------------------------------------------- functions found by name */
/* A function handle given to compiled code: a native function of a library, in either ABI. */
typedef struct {
  int abi; /* 1: classic packed C function, 2: tvm-ffi safe call */
  void* fptr;
} Function;

typedef int (*ClassicFunc)(void* args, int* codes, int n, void* ret, int* ret_code, void* resource);
typedef int (*SafeCall)(void* self, const void* args, int32_t n, void* result);
/* rpcsrv's lookup: fill *out with a Function* (owned by rpcsrv) or NULL; non-zero on error */
typedef int (*Lookup)(void* ctx, const char* name, void** out);

static Lookup lookup = NULL;
RPCSRV_API void rpcsrv_set_lookup(Lookup f) { lookup = f; }

static int find(void* ctx, const char* name, void** out) {
  *out = NULL;
  if (lookup == NULL || lookup(ctx, name, out) != 0) return -1;
  if (*out == NULL) {
    const char* parts[3] = {"function ", name, " not found in the library's module tree"};
    set_error(NULL, parts, 3);
    return -1;
  }
  return 0;
}

RPCSRV_API int TVMBackendGetFuncFromEnv(void* mod_node, const char* name, void** out) {
  return find(mod_node, name, out);
}
RPCSRV_API int TVMFFIEnvModLookupFromImports(void* ctx, const char* name, void** out) {
  return find(ctx, name, out);
}

RPCSRV_API int TVMFuncCall(void* handle, void* args, int* codes, int n, void* ret, int* ret_code) {
  Function* f = (Function*)handle;
  if (f == NULL || f->abi != 1) {
    TVMAPISetLastError("TVMFuncCall: the handle is not a classic packed function");
    return -1;
  }
  return ((ClassicFunc)f->fptr)(args, codes, n, ret, ret_code, NULL);
}

RPCSRV_API int TVMFFIFunctionCall(void* handle, void* args, int32_t n, void* result) {
  Function* f = (Function*)handle;
  if (f == NULL || f->abi != 2) {
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "TVMFFIFunctionCall: the handle is not a tvm-ffi function");
    return -1;
  }
  return ((SafeCall)f->fptr)(NULL, args, n, result);
}

/* ---------------------------------------------------------------- environment, no-ops on a CPU board */
RPCSRV_API void* TVMFFIEnvGetStream(int32_t device_type, int32_t device_id) {
  (void)device_type; (void)device_id;
  return NULL;
}
RPCSRV_API int TVMFFIEnvSetStream(int32_t device_type, int32_t device_id, void* stream, void** original) {
  (void)device_type; (void)device_id; (void)stream;
  if (original) *original = NULL;
  return 0;
}
RPCSRV_API int TVMFFIEnvCheckSignals(void) { return 0; }
RPCSRV_API int TVMFFIEnvRegisterCAPI(const char* name, void* symbol) { (void)name; (void)symbol; return 0; }
RPCSRV_API int TVMFFIEnvModRegisterContextSymbol(const char* name, void* symbol) { (void)name; (void)symbol; return 0; }
RPCSRV_API int TVMFFIEnvModRegisterSystemLibSymbol(const char* name, void* symbol) { (void)name; (void)symbol; return 0; }
RPCSRV_API int TVMBackendRegisterSystemLibSymbol(const char* name, void* ptr) { (void)name; (void)ptr; return 0; }
RPCSRV_API int TVMBackendRegisterEnvCAPI(const char* name, void* ptr) { (void)name; (void)ptr; return 0; }
RPCSRV_API int TVMFFIEnvTensorAlloc(void* prototype, void** out) {
  (void)prototype; (void)out;
  TVMFFIErrorSetRaisedFromCStr("RuntimeError", "TVMFFIEnvTensorAlloc: allocating tensors from compiled code "
                               "is not supported by rpcsrv");
  return -1;
}

/* ---------------------------------------------------------------- cache flush (time_evaluator f_preproc) */
RPCSRV_API void rpcsrv_cache_flush(const void* addr, size_t nbytes) {
#if defined(__x86_64__) || defined(__i386__)
  const char* p = (const char*)addr;
  for (size_t i = 0; i < nbytes; i += 64) __asm__ volatile("clflush (%0)" ::"r"(p + i) : "memory");
  __asm__ volatile("mfence" ::: "memory");
#elif defined(__aarch64__)
  const char* p = (const char*)addr;
  for (size_t i = 0; i < nbytes; i += 64) __asm__ volatile("dc civac, %0" ::"r"(p + i) : "memory");
  __asm__ volatile("dsb sy" ::: "memory");
#else
  (void)addr; (void)nbytes; /* rpcsrv evicts by streaming over a large buffer instead */
#endif
}

/* ---------------------------------------------------------------- a loaned connection (replay.py) */
/* The worker answers its client's repeated requests itself (rpcsrv/native/replay.py says what and why);
 * this is that loop in C, so a loaned call costs what it costs in TVM's own server: one recv, the
 * native call, one send.  The socket is blocking with a receive time-out (the loan's idle return). */
typedef struct {
  const unsigned char* packet; /* the whole request, length prefix included */
  int64_t packet_len;
  const unsigned char* answer;
  int64_t answer_len;
  int32_t kind;  /* 0: a call, 1: the lookup of its function (count up), 2: its free (count down) */
  int32_t slot;  /* counts[slot]: how many times the session holds the function's handle */
  int32_t abi;   /* a call: 1 classic packed function, 2 tvm-ffi safe call */
  int32_t nargs;
  void* fptr;
  void* args;
  void* codes;   /* classic only */
  void* ret;     /* the result cell (TVMValue or TVMFFIAny) */
  int32_t* ret_code; /* classic only */
  int64_t served;
  double seconds;
} LoanEntry;

enum { LOAN_CLOSED = 0, LOAN_IDLE = 1, LOAN_OTHER = 2, LOAN_ERROR = 3, LOAN_VALUE = 4 };
enum { PAGE_IDLE = 0, PAGE_CALLING = 1, PAGE_ANSWERING = 2, PAGE_READING = 3 };

/* whether buf[0:k] is the start of a packet no longer than longest (more of it may come) */
static int loan_partial(const unsigned char* b, int64_t k, int64_t longest) {
  if (k < 8) return 1;
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i]; /* little-endian on the wire */
  return n + 8 <= (uint64_t)longest && (uint64_t)k < n + 8;
}

static double loan_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* After an answer the client's next request usually comes within tens of microseconds: poll for it
 * (poll takes no lock, where a read would take the socket's lock that the client's packet then waits
 * for) for up to `spin` seconds (the server's --poll-us) before the blocking recv, so that the worker is
 * not put to sleep and woken again on every call (a wake-up on another CPU costs more than the call).
 * The server's own transport does the same (rpcsrv/board/transport.py). */
static void loan_spin(int fd, double spin) {
  if (!(spin > 0)) return;
  struct pollfd p = {fd, POLLIN, 0};
  double end = loan_now() + spin;
  while (poll(&p, 1, 0) == 0 && loan_now() < end) {
  }
}

/* Serve until a request is not one of the n entries (LOAN_OTHER: buf[0:*got] read), the client is idle
 * (LOAN_IDLE) or gone (LOAN_CLOSED), or a call answered otherwise than recorded (LOAN_ERROR: it failed,
 * the error is this thread's last error; LOAN_VALUE: its result cell holds a value); page[1] then names
 * the entry.  io[0], io[1]: bytes received and sent.  spin: seconds to poll before each blocking read. */
RPCSRV_API int rpcsrv_loan(int fd, LoanEntry* e, int32_t n, int64_t* counts, int64_t longest, unsigned char* buf,
                           int64_t* got, volatile uint32_t* page, int64_t* io, double spin) {
  for (;;) {
    loan_spin(fd, spin);
    ssize_t k = recv(fd, buf, (size_t)longest + 1, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) return (errno == EAGAIN || errno == EWOULDBLOCK) ? LOAN_IDLE : LOAN_CLOSED;
    if (k == 0) return LOAN_CLOSED;
    page[0] = PAGE_READING;
    while (loan_partial(buf, k, longest)) {
      ssize_t r = recv(fd, buf + k, (size_t)(longest + 1 - k), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      k += r;
    }
    *got = k;
    int32_t i = 0;
    while (i < n && !(e[i].packet_len == k && memcmp(e[i].packet, buf, (size_t)k) == 0)) ++i;
    if (i == n || (e[i].kind != 1 && counts[e[i].slot] <= 0)) return LOAN_OTHER;
    LoanEntry* x = &e[i];
    double t0 = loan_now();
    io[0] += k;
    if (x->kind == 1) {
      counts[x->slot]++;
    } else if (x->kind == 2) {
      counts[x->slot]--;
    } else {
      page[1] = (uint32_t)i;
      page[0] = PAGE_CALLING;
      int rc;
      if (x->abi == 2) {
        int32_t* type_index = (int32_t*)x->ret;
        *type_index = 0; /* None */
        rc = ((SafeCall)x->fptr)(NULL, x->args, x->nargs, x->ret);
        if (rc == 0 && *type_index != 0) rc = 1;
      } else {
        *x->ret_code = 4; /* kTVMNullptr */
        rc = ((ClassicFunc)x->fptr)(x->args, (int*)x->codes, x->nargs, x->ret, x->ret_code, NULL);
        if (rc == 0 && *x->ret_code != 4) rc = 1;
      }
      if (rc != 0) {
        page[0] = PAGE_READING; /* the request is the server's to answer */
        return rc == 1 ? LOAN_VALUE : LOAN_ERROR;
      }
    }
    page[0] = PAGE_ANSWERING;
    int64_t sent = 0;
    while (sent < x->answer_len) {
      ssize_t s = send(fd, x->answer + sent, (size_t)(x->answer_len - sent), MSG_NOSIGNAL);
      if (s < 0 && errno == EINTR) continue;
      if (s <= 0) return LOAN_CLOSED;
      sent += s;
    }
    page[0] = PAGE_IDLE;
    io[1] += sent;
    x->served++;
    x->seconds += loan_now() - t0;
  }
}

RPCSRV_API int rpcsrv_shim_version(void) { return 2; }
