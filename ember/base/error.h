// Typed errors shared by every layer (memory and up), and the EMBER_CHECK macro family that raises them.
// Invariant: library code never exits or aborts on bad input; it throws one of these, with a message that names
// the op, the shapes and the dtypes involved.
#pragma once

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>

namespace ember {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

class ShapeError : public Error { using Error::Error; };
class DTypeError : public Error { using Error::Error; };
class DeviceError : public Error { using Error::Error; };
class FormatError : public Error { using Error::Error; };
class ConfigError : public Error { using Error::Error; };
class IndexError : public Error { using Error::Error; };
class ValueError : public Error { using Error::Error; };
// A CUDA / cuBLAS / cuDNN / NCCL call returned an error status.
class BackendError : public Error { using Error::Error; };

// The allocator could not serve a request; carries the numbers that explain why.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, int64_t requested, int64_t capacity, int64_t allocated, int64_t reserved)
      : Error(what), requested_(requested), capacity_(capacity), allocated_(allocated), reserved_(reserved) {}
  int64_t requested() const { return requested_; }
  int64_t capacity() const { return capacity_; }
  int64_t allocated() const { return allocated_; }
  int64_t reserved() const { return reserved_; }

 private:
  int64_t requested_, capacity_, allocated_, reserved_;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace ember

// EMBER_CHECK(cond, ErrorType, message parts...): throws ErrorType with the parts streamed together.
#define EMBER_CHECK(cond, ErrorType, ...)                                   \
  do {                                                                      \
    if (!(cond)) throw ErrorType(::ember::detail::concat(__VA_ARGS__));     \
  } while (0)

#define EMBER_THROW(ErrorType, ...) throw ErrorType(::ember::detail::concat(__VA_ARGS__))
