// The cuDNN path of the CUDA convolution (conv_impl.h, EMBER_WITH_CUDNN): legacy-API forward / backward data / backward
// filter, algorithms from the _v7 heuristics cached per convolution. Invariant: descriptors are RAII-owned, every call
// is checked, the workspace is a caching-allocator tensor, and f32 never runs on TF32.
#if defined(EMBER_WITH_CUDNN)

#include <cudnn.h>

#include <array>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "ember/core/grad_mode.h"
#include "ember/kernels/cuda/conv_impl.h"
#include "ember/kernels/cuda/library_check.h"

namespace ember::kernels::cuda {
namespace {

// Note [cuDNN algorithm choice]
// Per (pass, dtype, device, shapes, params) the first algorithm of cudnnGet*Algorithm_v7's heuristic order is taken
// that (1) reports success, (2) needs at most kWorkspaceLimit bytes of workspace, and (3) keeps the precision ember
// promises: for f32 no tensor-op math (TF32: the descriptor always runs with CUDNN_FMA_MATH, since from cuDNN 8 on
// CUDNN_DEFAULT_MATH permits TF32 on Ampere and later), and for f32/f64 no FFT or Winograd algorithm (their transforms
// cost accuracy beyond the 1e-5 an f32 convolution is held to). f16/bf16 take any algorithm, with tensor-op math and
// f32 accumulation. The choice (or the absence of one, after which the convolution runs on the im2col path) is cached
// for the process.
constexpr size_t kWorkspaceLimit = size_t{256} << 20;

// ---- RAII descriptors -----------------------------------------------------------------------------------------------

template <class H, cudnnStatus_t (*Create)(H*), cudnnStatus_t (*Destroy)(H)>
class Descriptor {
 public:
  Descriptor() { EMBER_CUDNN_CHECK(Create(&handle_)); }
  ~Descriptor() {
    if (handle_ != nullptr) Destroy(handle_);  // cannot fail for a descriptor we created; never throws
  }
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  H get() const { return handle_; }

 private:
  H handle_ = nullptr;
};

using TensorDescriptor = Descriptor<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;
using FilterDescriptor = Descriptor<cudnnFilterDescriptor_t, cudnnCreateFilterDescriptor, cudnnDestroyFilterDescriptor>;
using ConvolutionDescriptor =
    Descriptor<cudnnConvolutionDescriptor_t, cudnnCreateConvolutionDescriptor, cudnnDestroyConvolutionDescriptor>;

cudnnDataType_t data_type(DType dt) {
  switch (dt) {
    case DType::f32:
      return CUDNN_DATA_FLOAT;
    case DType::f64:
      return CUDNN_DATA_DOUBLE;
    case DType::f16:
      return CUDNN_DATA_HALF;
    case DType::bf16:
      return CUDNN_DATA_BFLOAT16;
    default:
      throw_unsupported_dtype("conv2d (cuDNN)", dt);
  }
}

// The math type a descriptor starts with (Note [cuDNN algorithm choice]).
cudnnMathType_t base_math(DType dt) {
  switch (dt) {
    case DType::f32:
      return CUDNN_FMA_MATH;
    case DType::f64:
      return CUDNN_DEFAULT_MATH;
    default:
      return CUDNN_TENSOR_OP_MATH;
  }
}

// Whether a heuristic entry's math type keeps dt's precision: f32 only FMA (CUDNN_DEFAULT_MATH is accepted as an
// entry but run as FMA: math_for), f64 never a conversion to a narrower type, f16/bf16 anything.
bool math_allowed(DType dt, cudnnMathType_t m) {
  if (dt == DType::f32) return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
  if (dt == DType::f64) return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  return true;
}

// The math type an accepted entry runs with: always FMA for f32 (never TF32), the entry's own otherwise.
cudnnMathType_t math_for(DType dt, cudnnMathType_t m) { return dt == DType::f32 ? CUDNN_FMA_MATH : m; }

// x [n, c, h, w], weight [o, cg, kh, kw], y [n, o, oh, ow], all packed NCHW, and the convolution (cross-correlation,
// f32 compute for f16/bf16/f32, f64 for f64; groups).
struct ConvDescriptors {
  TensorDescriptor x, y;
  FilterDescriptor w;
  ConvolutionDescriptor conv;
  ConvDescriptors(const ConvShape& s, DType dt) {
    const cudnnDataType_t data = data_type(dt);
    const cudnnDataType_t compute = dt == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    auto i = [](int64_t v) { return static_cast<int>(v); };  // in range: cudnn_fits
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x.get(), CUDNN_TENSOR_NCHW, data, i(s.n), i(s.c), i(s.h), i(s.w)));
    EMBER_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y.get(), CUDNN_TENSOR_NCHW, data, i(s.n), i(s.o), i(s.oh), i(s.ow)));
    EMBER_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w.get(), data, CUDNN_TENSOR_NCHW, i(s.o), i(s.cg), i(s.kh), i(s.kw)));
    EMBER_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv.get(), i(s.ph), i(s.pw), i(s.sh), i(s.sw), i(s.dh), i(s.dw),
                                                      CUDNN_CROSS_CORRELATION, compute));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv.get(), i(s.groups)));
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv.get(), base_math(dt)));
  }
};

// Whether every size and element count fits the legacy API's int descriptors (and nothing is empty).
bool cudnn_fits(const ConvShape& s) {
  for (int64_t v : {s.n,
                    s.c,
                    s.h,
                    s.w,
                    s.o,
                    s.cg,
                    s.kh,
                    s.kw,
                    s.oh,
                    s.ow,
                    s.sh,
                    s.sw,
                    s.ph,
                    s.pw,
                    s.dh,
                    s.dw,
                    s.groups,
                    s.n * s.c * s.h * s.w,
                    s.n * s.o * s.plane,
                    s.o * s.kg})
    if (v > INT_MAX) return false;
  return s.n > 0 && s.c > 0 && s.h > 0 && s.w > 0 && s.o > 0 && s.kg > 0;
}

// ---- handles --------------------------------------------------------------------------------------------------

// Note [cuDNN handles]
// One handle per device, created on first use with that device current and kept for the life of the process (never
// destroyed: at exit the CUDA context may already be gone). A handle carries the stream it launches on, so a call
// holds its slot's mutex from cudnnSetStream to the last cuDNN call that uses it; two host threads never interleave
// on one handle. The slot mutex is taken before the allocator's (workspace) and never the other way round.
struct HandleSlot {
  std::mutex mutex;
  cudnnHandle_t handle = nullptr;
};

HandleSlot& handle_slot(int device) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<HandleSlot>>* slots = new std::map<int, std::unique_ptr<HandleSlot>>();
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<HandleSlot>& slot = (*slots)[device];
  if (!slot) {
    auto fresh = std::make_unique<HandleSlot>();
    // cuDNN's engines need cuBLASLt, which they look up by soname: ember's copy, opened here first, is the one they
    // find (Note [Libraries opened on first use] in base/dynamic_library.h).
    (void)cublasLtGetVersion();
    EMBER_CUDNN_CHECK(cudnnCreate(&fresh->handle));  // `device` is current (the entry point's DeviceGuard)
    slot = std::move(fresh);
  }
  return *slot;
}

// ---- algorithm cache (Note [cuDNN algorithm choice]) ------------------------------------------------------------

enum class Pass : int64_t { Forward, BackwardData, BackwardFilter };

struct Choice {
  bool found = false;
  int algo = 0;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  size_t workspace = 0;
};

using Key = std::array<int64_t, 20>;

Key make_key(Pass pass, DType dt, int device, const ConvShape& s) {
  return {static_cast<int64_t>(pass),
          static_cast<int64_t>(dt),
          device,
          s.n,
          s.c,
          s.h,
          s.w,
          s.o,
          s.cg,
          s.kh,
          s.kw,
          s.oh,
          s.ow,
          s.groups,
          s.sh,
          s.sw,
          s.ph,
          s.pw,
          s.dh,
          s.dw};
}

std::mutex& cache_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}
std::map<Key, Choice>& cache() {
  static auto* c = new std::map<Key, Choice>();
  return *c;
}

// The cached choice for `key`, else choose() (run under the handle's lock, outside the cache's) and remember it.
template <class F>
Choice cached_choice(const Key& key, F&& choose) {
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    const auto it = cache().find(key);
    if (it != cache().end()) return it->second;
  }
  const Choice c = choose();
  std::lock_guard<std::mutex> lock(cache_mutex());
  cache().emplace(key, c);
  return c;
}

// FFT and Winograd algorithms of each pass, excluded for f32/f64.
bool transform_algo(Pass pass, int algo) {
  switch (pass) {
    case Pass::Forward:
      return algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT || algo == CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD || algo == CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
    case Pass::BackwardData:
      return algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
    case Pass::BackwardFilter:
      return algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT || algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD ||
             algo == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
  }
  return true;
}

// The first acceptable entry of a heuristic list. The descriptor's math type is set to the one the entry would run
// with before `workspace(algo)` asks cuDNN for the bytes the algorithm needs (SIZE_MAX when it cannot say).
template <class Perf, class Workspace>
Choice first_acceptable(Pass pass, DType dt, const std::vector<Perf>& perf, int returned,
                        cudnnConvolutionDescriptor_t conv, Workspace&& workspace) {
  const bool precise = dt == DType::f32 || dt == DType::f64;
  for (int k = 0; k < returned; ++k) {
    const Perf& p = perf[static_cast<size_t>(k)];
    const int algo = static_cast<int>(p.algo);
    if (p.status != CUDNN_STATUS_SUCCESS || !math_allowed(dt, p.mathType)) continue;
    if (precise && transform_algo(pass, algo)) continue;
    const cudnnMathType_t math = math_for(dt, p.mathType);
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, math));
    const size_t bytes = workspace(p.algo);
    if (bytes > kWorkspaceLimit) continue;
    return Choice{true, algo, math, bytes};
  }
  return Choice{};
}

Choice choose_forward(cudnnHandle_t h, const ConvDescriptors& d, DType dt) {
  int max_count = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionFwdAlgoPerf_t> perf(static_cast<size_t>(max_count > 0 ? max_count : 1));
  int returned = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(),
                                                           static_cast<int>(perf.size()), &returned, perf.data()));
  return first_acceptable(Pass::Forward, dt, perf, returned, d.conv.get(), [&](cudnnConvolutionFwdAlgo_t algo) {
    size_t bytes = 0;
    const cudnnStatus_t st =
        cudnnGetConvolutionForwardWorkspaceSize(h, d.x.get(), d.w.get(), d.conv.get(), d.y.get(), algo, &bytes);
    return st == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
  });
}

Choice choose_backward_data(cudnnHandle_t h, const ConvDescriptors& d, DType dt) {
  int max_count = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdDataAlgoPerf_t> perf(static_cast<size_t>(max_count > 0 ? max_count : 1));
  int returned = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(),
                                                                static_cast<int>(perf.size()), &returned, perf.data()));
  return first_acceptable(Pass::BackwardData, dt, perf, returned, d.conv.get(),
                          [&](cudnnConvolutionBwdDataAlgo_t algo) {
                            size_t bytes = 0;
                            const cudnnStatus_t st = cudnnGetConvolutionBackwardDataWorkspaceSize(
                                h, d.w.get(), d.y.get(), d.conv.get(), d.x.get(), algo, &bytes);
                            return st == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
                          });
}

Choice choose_backward_filter(cudnnHandle_t h, const ConvDescriptors& d, DType dt) {
  int max_count = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, &max_count));
  std::vector<cudnnConvolutionBwdFilterAlgoPerf_t> perf(static_cast<size_t>(max_count > 0 ? max_count : 1));
  int returned = 0;
  EMBER_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
      h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), static_cast<int>(perf.size()), &returned, perf.data()));
  return first_acceptable(Pass::BackwardFilter, dt, perf, returned, d.conv.get(),
                          [&](cudnnConvolutionBwdFilterAlgo_t algo) {
                            size_t bytes = 0;
                            const cudnnStatus_t st = cudnnGetConvolutionBackwardFilterWorkspaceSize(
                                h, d.x.get(), d.y.get(), d.conv.get(), d.w.get(), algo, &bytes);
                            return st == CUDNN_STATUS_SUCCESS ? bytes : SIZE_MAX;
                          });
}

// ---- one call -------------------------------------------------------------------------------------------------

// Inputs as packed NCHW tensors: cuDNN's filter descriptor takes packed layouts only, and packed tensors keep every
// algorithm available. A copy is made only for a non-contiguous input, or for a contiguous view that starts off a
// 16-byte boundary (an f16 view one element into its storage: cuDNN 9 may refuse such an operand with
// CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, and a fresh block is aligned); outside autograd (it is scratch).
Tensor packed(const Tensor& t) {
  NoGradGuard no_grad;
  Tensor c = t.contiguous();
  if (reinterpret_cast<uintptr_t>(c.raw_data()) % 16 != 0) c = c.clone();
  return c;
}

// alpha/beta in host memory: double for f64 data, float otherwise.
struct Scale {
  float f;
  double d;
  explicit Scale(double v) : f(static_cast<float>(v)), d(v) {}
  const void* ptr(DType dt) const { return dt == DType::f64 ? static_cast<const void*>(&d) : &f; }
};

// What one cuDNN pass needs besides its operands, in order: the descriptors, the device's handle locked and set to
// `stream` (Note [cuDNN handles]), the cached algorithm with its math type set, and its workspace. The lock is held
// until the Call is destroyed, after the pass has been queued.
struct Call {
  Key key;
  ConvDescriptors d;
  std::unique_lock<std::mutex> lock;
  cudnnHandle_t handle = nullptr;
  Choice choice;
  Tensor workspace;

  Call(Pass pass, const ConvShape& s, DType dt, int device, Device dev, cudaStream_t stream)
      : key(make_key(pass, dt, device, s)), d(s, dt) {
    HandleSlot& slot = handle_slot(device);
    lock = std::unique_lock<std::mutex>(slot.mutex);
    handle = slot.handle;
    EMBER_CUDNN_CHECK(cudnnSetStream(handle, stream));
    choice = cached_choice(key, [&] {
      switch (pass) {
        case Pass::Forward:
          return choose_forward(handle, d, dt);
        case Pass::BackwardData:
          return choose_backward_data(handle, d, dt);
        case Pass::BackwardFilter:
          return choose_backward_filter(handle, d, dt);
      }
      return Choice{};
    });
    if (!choice.found) return;
    EMBER_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv.get(), choice.math));
    // Freed when the call returns, while the pass may still run: the caching allocator hands the block out again
    // only in stream order on this stream, behind it.
    if (choice.workspace > 0)
      workspace = empty({static_cast<int64_t>(choice.workspace)}, TensorOptions(DType::u8, dev));
  }
  void* workspace_ptr() const { return workspace.defined() ? workspace.raw_data() : nullptr; }
};

// Whether a pass was queued. A chosen algorithm that cuDNN turns down when it is run (a NOT_SUPPORTED status; nothing
// was launched) makes the convolution's choice "none", so this and later calls run on the im2col path; any other
// failure is a BackendError naming `what`.
bool queued(cudnnStatus_t status, const Call& call, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) return true;
  if (static_cast<int>(status) / 1000 * 1000 == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED)) {
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache()[call.key] = Choice{};
    return false;
  }
  ::ember::detail::throw_backend_error("cuDNN", what, cudnnGetErrorString(status), __FILE__, __LINE__);
}

}  // namespace

bool conv2d_cudnn(const Tensor& x, const Tensor& weight, const Tensor& bias, const ConvShape& s, const Tensor& out,
                  int device, cudaStream_t stream) {
  if (!cudnn_fits(s)) return false;
  const DType dt = out.dtype();
  const Tensor xc = packed(x), wc = packed(weight);
  Call call(Pass::Forward, s, dt, device, out.device(), stream);
  if (!call.choice.found) return false;
  if (bias.defined()) fill_conv_bias(bias, out, device, stream);  // Note [Bias first] in conv_im2col.cu
  const Scale one(1.0), beta(bias.defined() ? 1.0 : 0.0);
  return queued(cudnnConvolutionForward(call.handle, one.ptr(dt), call.d.x.get(), xc.raw_data(), call.d.w.get(),
                                        wc.raw_data(), call.d.conv.get(),
                                        static_cast<cudnnConvolutionFwdAlgo_t>(call.choice.algo), call.workspace_ptr(),
                                        call.choice.workspace, beta.ptr(dt), call.d.y.get(), out.raw_data()),
                call, "cudnnConvolutionForward");
}

bool conv2d_input_grad_cudnn(const Tensor& grad_out, const Tensor& weight, const ConvShape& s, const Tensor& grad_x,
                             int device, cudaStream_t stream) {
  if (!cudnn_fits(s)) return false;
  const DType dt = grad_x.dtype();
  const Tensor gc = packed(grad_out), wc = packed(weight);
  Call call(Pass::BackwardData, s, dt, device, grad_x.device(), stream);
  if (!call.choice.found) return false;
  const Scale one(1.0), zero(0.0);
  return queued(cudnnConvolutionBackwardData(
                    call.handle, one.ptr(dt), call.d.w.get(), wc.raw_data(), call.d.y.get(), gc.raw_data(),
                    call.d.conv.get(), static_cast<cudnnConvolutionBwdDataAlgo_t>(call.choice.algo),
                    call.workspace_ptr(), call.choice.workspace, zero.ptr(dt), call.d.x.get(), grad_x.raw_data()),
                call, "cudnnConvolutionBackwardData");
}

bool conv2d_weight_grad_cudnn(const Tensor& grad_out, const Tensor& x, const ConvShape& s, const Tensor& grad_w,
                              int device, cudaStream_t stream) {
  if (!cudnn_fits(s)) return false;
  const DType dt = grad_w.dtype();
  const Tensor gc = packed(grad_out), xc = packed(x);
  Call call(Pass::BackwardFilter, s, dt, device, grad_w.device(), stream);
  if (!call.choice.found) return false;
  const Scale one(1.0), zero(0.0);
  return queued(cudnnConvolutionBackwardFilter(
                    call.handle, one.ptr(dt), call.d.x.get(), xc.raw_data(), call.d.y.get(), gc.raw_data(),
                    call.d.conv.get(), static_cast<cudnnConvolutionBwdFilterAlgo_t>(call.choice.algo),
                    call.workspace_ptr(), call.choice.workspace, zero.ptr(dt), call.d.w.get(), grad_w.raw_data()),
                call, "cudnnConvolutionBackwardFilter");
}

}  // namespace ember::kernels::cuda

#endif  // EMBER_WITH_CUDNN
