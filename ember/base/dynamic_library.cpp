// DynamicLibrary (dynamic_library.h): dlopen / dlsym with errors that say what was tried.
#include "ember/base/dynamic_library.h"

#include <dlfcn.h>

#include <utility>

#include "ember/base/error.h"

namespace ember {

DynamicLibrary::DynamicLibrary(std::string what, const std::string& soname, const std::vector<std::string>& directories)
    : what_(std::move(what)) {
  handle_ = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);  // a copy already loaded
  if (handle_ != nullptr) {
    path_ = soname;
    return;
  }
  std::vector<std::string> paths;
  for (const std::string& d : directories)
    if (!d.empty()) paths.push_back(d + "/" + soname);
  paths.push_back(soname);
  std::string tried;
  for (const std::string& p : paths) {
    handle_ = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      path_ = p;
      return;
    }
    const char* reason = dlerror();
    tried += detail::concat(tried.empty() ? "" : "; ", p, ": ", reason != nullptr ? reason : "not found");
  }
  throw BackendError(detail::concat(what_, " could not be loaded (", tried, "); put its directory on LD_LIBRARY_PATH"));
}

void* DynamicLibrary::symbol(const char* name) const {
  dlerror();  // clears an earlier error, so the one below is dlsym's
  void* p = dlsym(handle_, name);
  if (p == nullptr) {
    const char* reason = dlerror();
    throw BackendError(detail::concat(what_, " (", path_, ") has no symbol ", name,
                                      reason != nullptr ? detail::concat(": ", reason) : std::string()));
  }
  return p;
}

}  // namespace ember
