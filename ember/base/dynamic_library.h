// A shared library opened at run time (dlopen) rather than linked: ember opens cuBLAS(Lt), cuSPARSE and NCCL on the
// first call that needs one (Note [Libraries opened on first use]). Invariant: a DynamicLibrary holds an open handle
// for the life of the process (never dlclose'd), and every symbol it returns is non-null.
#pragma once

#include <string>
#include <vector>

namespace ember {

// Note [Libraries opened on first use]
// Linking libcublasLt, libcusparse (which needs libnvJitLink) and libnccl made every process that loads ember pay
// for them at start-up: the dynamic loader applies about half a million relative relocations to those libraries
// before main, ~0.16 s per process on the CI machine, although a process without a GPU (or one that never multiplies
// on it) calls none of their functions. ember links only the CUDA runtime and cuDNN (which itself opens its
// sub-libraries on demand); the cuBLASLt, cuSPARSE and NCCL functions ember calls are defined in ember by
// forwarders (kernels/cuda/cublas_loader.cpp, kernels/cuda/cusparse_loader.cpp, dist/cuda_nccl_loader.cpp) with the
// libraries' own declarations, so the call sites and the headers stay those of the libraries. The first call to a
// forwarder opens its library by the soname of the major version the headers name (libcublasLt.so.13): a copy
// already loaded (cuDNN opens cuBLASLt itself) is reused; else the file of that name in the directory found at
// configure time; else the loader's search (LD_LIBRARY_PATH, libember's RUNPATH, the loader cache). The symbol is
// looked up once. cuDNN's handle creation opens cuBLASLt first, so cuDNN finds ember's copy rather than searching
// for one of its own. The forwarders are hidden symbols of libember (-fvisibility=hidden), so they never interpose on
// a program that links the real library itself. A library that cannot be opened, or lacks a symbol, is a
// BackendError naming every path tried and the loader's reason, raised from the call that needed it, as a failing
// status would be. The DynamicLibrary objects are never destroyed (they are leaked on purpose), so a forwarder
// called during static destruction (a process group finalised at exit) still finds its library.
class DynamicLibrary {
 public:
  // Opens `soname` (libfoo.so.N): the copy already loaded, else directory/soname for each of `directories` (empty
  // ones skipped), else the loader's search for `soname`; RTLD_NOW | RTLD_LOCAL. `what` names the library in errors
  // ("cuBLASLt"). BackendError naming each path tried with dlerror()'s text when none opens.
  DynamicLibrary(std::string what, const std::string& soname, const std::vector<std::string>& directories);
  DynamicLibrary(const DynamicLibrary&) = delete;
  DynamicLibrary& operator=(const DynamicLibrary&) = delete;

  // The address of `name`; BackendError when the library lacks it.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }  // what opened: the soname (loaded or searched) or a full path

 private:
  std::string what_;
  std::string path_;
  void* handle_ = nullptr;
};

}  // namespace ember

// Defines the function `ret name params` (declared by the library's header) as a forwarder to `name` in the
// DynamicLibrary that `lib()` returns: `args` is the parenthesised argument list. The symbol is looked up on the first
// call (a function-local static, so concurrently safe); a failed lookup throws and is retried by the next call.
#define EMBER_FORWARD(lib, ret, name, params, args)                                               \
  ret name params {                                                                               \
    static const auto ember_forward_fn_ = reinterpret_cast<decltype(&name)>(lib().symbol(#name)); \
    return ember_forward_fn_ args;                                                                \
  }
