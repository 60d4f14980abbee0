/* `rpcsrv check`'s native smoke kernel: one tvm-ffi function built like the kernels apache-tvm >= 0.21
 * exports, shipped prebuilt per machine beside the shim (rpcsrv/native/shimbuild.py), so that a board
 * without a compiler can still prove that native code runs: dlopen, the shim's runtime symbols (it
 * calls them as *undefined* symbols, as tvm-ffi era libraries do), the DLTensor and TVMFFIAny layouts
 * of this machine (32-bit pointers on armv7), parallel tasks and errors.
 *
 * __tvm_ffi_rpcsrv_check(A: float32[n] DLTensor*, B: float32[n] DLTensor*, num_task: int):
 *   B[i] = 2 * A[i] + sum(A), the sum taken over a workspace slot per task and a barrier.
 * A num_task of 0 or less is refused with an error set through TVMFFIErrorSetRaisedFromCStrParts.
 * The layouts are tvm-ffi's c_api.h and dlpack.h (read, not copied); the code is ours. */
#include <stddef.h>
#include <stdint.h>

#define API __attribute__((visibility("default")))

typedef struct { int32_t device_type, device_id; } DLDevice;
typedef struct { uint8_t code, bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;
typedef struct {
  int32_t type_index;
  uint32_t zero_padding;
  union { int64_t v_int64; double v_float64; void* v_ptr; } v;
} TVMFFIAny;
typedef struct { void* sync_handle; int32_t num_task; } TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

enum { kNone = 0, kInt = 1, kDLTensorPtr = 7 };

/* provided by the runtime (rpcsrv's shim) */
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes, int code_hint, int bits_hint);
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr);
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task);
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv);
void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t n);

static int fail(const char* what) {
  const char* parts[2] = {"rpcsrv_check: ", what};
  TVMFFIErrorSetRaisedFromCStrParts("ValueError", parts, 2);
  return -1;
}

typedef struct {
  const float* a;
  float* b;
  double* partial;
  int64_t n;
} Job;

static int task(int task_id, TVMParallelGroupEnv* penv, void* cdata) {
  Job* job = (Job*)cdata;
  int64_t chunk = (job->n + penv->num_task - 1) / penv->num_task;
  int64_t begin = task_id * chunk, end = begin + chunk < job->n ? begin + chunk : job->n;
  double s = 0;
  for (int64_t i = begin; i < end; ++i) s += job->a[i];
  job->partial[task_id] = s;
  TVMBackendParallelBarrier(task_id, penv);
  double total = 0;
  for (int t = 0; t < penv->num_task; ++t) total += job->partial[t];
  for (int64_t i = begin; i < end; ++i) job->b[i] = job->a[i] * 2.0f + (float)total;
  return 0;
}

static int is_f32_vector(const TVMFFIAny* arg) {
  if (arg->type_index != kDLTensorPtr) return 0;
  const DLTensor* t = (const DLTensor*)arg->v.v_ptr;
  return t->ndim == 1 && t->dtype.code == 2 && t->dtype.bits == 32 && t->dtype.lanes == 1;
}

API int __tvm_ffi_rpcsrv_check(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {
  (void)self;
  if (num_args != 3 || !is_f32_vector(&args[0]) || !is_f32_vector(&args[1]) || args[2].type_index != kInt)
    return fail("expects (A: float32[n], B: float32[n], num_task: int)");
  const DLTensor* a = (const DLTensor*)args[0].v.v_ptr;
  const DLTensor* b = (const DLTensor*)args[1].v.v_ptr;
  int64_t num_task = args[2].v.v_int64;
  if (num_task <= 0 || num_task > 64) return fail("num_task must be 1..64");
  if (a->shape[0] != b->shape[0]) return fail("A and B differ in length");
  Job job = {(const float*)((const char*)a->data + a->byte_offset), (float*)((char*)b->data + b->byte_offset),
             NULL, a->shape[0]};
  job.partial = (double*)TVMBackendAllocWorkspace(1, 0, sizeof(double) * 64, 2, 64);
  if (job.partial == NULL) return -1;
  int rc = TVMBackendParallelLaunch(task, &job, (int)num_task);
  TVMBackendFreeWorkspace(1, 0, job.partial);
  result->type_index = kInt;
  result->zero_padding = 0;
  result->v.v_int64 = (int64_t)sizeof(void*); /* the pointer size the kernel was built with */
  return rc;
}
