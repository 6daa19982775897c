// CudaKernelTrace: the CUDA backend's KernelTraceFacet (sdk/backend_kernel_trace.h), through
// CUPTI's activity API: the records torch.profiler's kernel view reads too, so the two tables
// compare kernel for kernel. Built where CMake found CUPTI's headers (MIXTRAIN_HAVE_CUPTI).
//
// Why CUPTI is opened at the first start, not linked: the runtime images that run CUDA programs
// often lack it (it ships with the toolkit, not the driver or cuBLAS), and a backend that failed
// to load for want of a profiler would be worse than a profile without kernels. The library is
// the one CMake found (MIXTRAIN_CUPTI_LIBRARY), else libcupti.so.<major> on the loader's path, and
// its API major must be the headers': the kernel records are read as this toolkit's
// CUpti_ActivityKernel10.
//
// CUPTI's activity state is the process's: one trace at a time, whichever backend started it;
// its buffers arrive on CUPTI's thread, so the tally is guarded by a mutex.
#include <dlfcn.h>

#include <cupti_activity.h>
#include <cupti_version.h>

#include <cstdlib>
#include <mutex>
#include <string>

#include "cuda_access.h"
#include "cuda_context.h"
#include "cuda_kernel_tally.h"
#include "mixtrain/sdk/backend_kernel_trace.h"
#include "mixtrain/sdk/support/facet_registry.h"

namespace mixtrain::backend_cuda {

namespace {

constexpr const char* kOp = "kernel_trace";
constexpr std::size_t kBufferBytes = 8u << 20;  // CUPTI fills a buffer, then hands it back

// The process's CUPTI: the functions we call, the tally its callbacks fill.
struct Cupti {
  void* library = nullptr;
  std::string load_error;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc,
                                    CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*dropped_records)(CUcontext, uint32_t, size_t*) = nullptr;
  CUptiResult (*get_version)(uint32_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
  bool registered = false;
  bool tracing = false;
  std::mutex mutex;  // guards tally and dropped (CUPTI's thread adds)
  KernelTally tally;
  std::int64_t dropped = 0;

  std::string text(CUptiResult r) const {
    const char* s = nullptr;
    if (result_string != nullptr && result_string(r, &s) == CUPTI_SUCCESS && s != nullptr) return s;
    return "CUPTI error " + std::to_string(static_cast<int>(r));
  }
  void check(CUptiResult r, const char* what) const {
    if (r != CUPTI_SUCCESS)
      fail(kOp, std::string(what) + " failed: " + text(r),
           "profile without the kernel table, or run where CUPTI may trace (a sandbox or a "
           "second profiler can refuse it)");
  }
};

Cupti& cupti() {
  // Never destroyed: CUPTI's thread may still hand back a buffer while the process exits, after
  // the statics would have gone.
  static Cupti& c = *new Cupti;
  return c;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t* buffer, size_t,
                               size_t valid) {
  Cupti& c = cupti();
  {
    const std::lock_guard lock(c.mutex);
    CUpti_Activity* record = nullptr;
    while (c.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          record->kind != CUPTI_ACTIVITY_KIND_KERNEL)
        continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      c.tally.add(k->name != nullptr ? k->name : "(unnamed kernel)",
                  k->end > k->start ? k->end - k->start : 0);
    }
    size_t lost = 0;
    if (c.dropped_records(context, stream, &lost) == CUPTI_SUCCESS)
      c.dropped += static_cast<std::int64_t>(lost);
  }
  std::free(buffer);
}

template <class F>
bool bind(void* library, const char* name, F& f) {
  f = reinterpret_cast<F>(dlsym(library, name));
  return f != nullptr;
}

// Opens CUPTI once; throws BackendError when it cannot.
Cupti& loaded() {
  Cupti& c = cupti();
  if (c.library != nullptr) return c;
  if (c.load_error.empty()) {
    const std::string major = std::to_string(CUPTI_API_VERSION / 10000);
    std::string tried;
    for (const std::string& path : {std::string(MIXTRAIN_CUPTI_LIBRARY), "libcupti.so." + major,
                                    std::string("libcupti.so")}) {
      if (path.empty()) continue;
      c.library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (c.library != nullptr) break;
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + path + ": " + (why != nullptr ? why : "not found");
    }
    if (c.library == nullptr) {
      c.load_error = "CUPTI not found (" + tried + ")";
    } else if (!bind(c.library, "cuptiActivityRegisterCallbacks", c.register_callbacks) ||
               !bind(c.library, "cuptiActivityEnable", c.enable) ||
               !bind(c.library, "cuptiActivityDisable", c.disable) ||
               !bind(c.library, "cuptiActivityFlushAll", c.flush_all) ||
               !bind(c.library, "cuptiActivityGetNextRecord", c.next_record) ||
               !bind(c.library, "cuptiActivityGetNumDroppedRecords", c.dropped_records) ||
               !bind(c.library, "cuptiGetVersion", c.get_version) ||
               !bind(c.library, "cuptiGetResultString", c.result_string)) {
      c.load_error = "the CUPTI found lacks a function of its activity API";
    } else {
      std::uint32_t version = 0;
      if (c.get_version(&version) != CUPTI_SUCCESS || version / 10000 != CUPTI_API_VERSION / 10000)
        c.load_error = "CUPTI API " + std::to_string(version) + " found, " +
                       std::to_string(CUPTI_API_VERSION) + " built against (another major)";
    }
    if (!c.load_error.empty() && c.library != nullptr) {
      dlclose(c.library);
      c.library = nullptr;
    }
  }
  if (c.library == nullptr)
    fail(kOp, c.load_error,
         "put the CUDA toolkit's libcupti.so." + std::to_string(CUPTI_API_VERSION / 10000) +
             " (extras/CUPTI/lib64) on LD_LIBRARY_PATH; the profile's op table needs no CUPTI");
  return c;
}

class CudaKernelTrace final : public sdk::KernelTraceFacet {
 public:
  explicit CudaKernelTrace(CudaContext& context) : context_(context) {}
  // A backend that goes while its trace runs (a profiled run that failed) turns CUPTI off: the
  // trace is the process's, and nothing else could stop it.
  ~CudaKernelTrace() override {
    if (!mine_) return;
    Cupti& c = cupti();
    context_.activate_quietly();
    cudaDeviceSynchronize();
    c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    c.tracing = false;
  }
  CudaKernelTrace(const CudaKernelTrace&) = delete;
  CudaKernelTrace& operator=(const CudaKernelTrace&) = delete;

  void start_kernel_trace() override {
    Cupti& c = loaded();
    if (c.tracing) fail(kOp, "a kernel trace is already running in this process", "stop it first");
    context_.activate();
    if (!c.registered) {
      c.check(c.register_callbacks(buffer_requested, buffer_completed),
              "cuptiActivityRegisterCallbacks");
      c.registered = true;
    }
    {
      const std::lock_guard lock(c.mutex);
      c.tally.clear();  // anything a previous trace's late buffers left
      c.dropped = 0;
    }
    c.check(c.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable");
    c.tracing = true;
    mine_ = true;
  }

  sdk::KernelTrace stop_kernel_trace() override {
    Cupti& c = cupti();
    if (!mine_ || !c.tracing) return {};
    mine_ = false;
    c.tracing = false;
    context_.activate();
    // Every stream's kernels (the image input's copy stream's, a communicator's, not only the
    // backend's stream) have run, so their records are complete: CUPTI stops reading a buffer at
    // its first incomplete record. CUPTI is turned off whatever the wait says; a device error is
    // raised after that.
    const cudaError_t synced = cudaDeviceSynchronize();
    const CUptiResult flushed = c.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    const CUptiResult disabled = c.disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    check_cuda(synced, kOp, "cudaDeviceSynchronize");
    c.check(flushed, "cuptiActivityFlushAll");
    c.check(disabled, "cuptiActivityDisable");
    const std::lock_guard lock(c.mutex);
    return c.tally.take(c.dropped);
  }

 private:
  CudaContext& context_;
  bool mine_ = false;  // this backend started the running trace
};

const sdk::FacetRegistration<CudaContext, sdk::KernelTraceFacet, CudaKernelTrace> kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cuda
