// write_file_atomically: temporary file (mkstemp beside the target), write, fsync, rename, fsync of the directory.
// Invariant: on every failure but a simulated crash the temporary file is unlinked and `path` is untouched
// (Note [Atomic replace] in atomic_file.h).
#include "ember/base/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "ember/base/error.h"

namespace ember {

namespace {

std::atomic<AtomicWriteFault> g_fault{AtomicWriteFault::none};

std::string errno_text(int err) { return std::strerror(err); }

std::string parent_dir(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The process's umask without changing it (umask(2) can only be read by setting it, which races with other threads):
// Linux reports it in /proc/self/status (4.7+); 022 where it cannot be read.
mode_t current_umask() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Umask:", 0) != 0) continue;
    char* end = nullptr;
    const unsigned long m = std::strtoul(line.c_str() + 6, &end, 8);
    if (end != line.c_str() + 6 && m <= 0777) return static_cast<mode_t>(m);
  }
  return 022;
}

// Closes a descriptor on scope exit unless released.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

}  // namespace

std::string atomic_temp_prefix(const std::string& path) {
  return parent_dir(path) + "/." + base_name(path) + ".tmp.";
}

void set_atomic_write_fault(AtomicWriteFault fault) { g_fault.store(fault); }

void write_file_atomically(const std::string& path, const std::function<void(const AtomicFileWrite& write)>& fill) {
  const char* op = "write_file_atomically";
  const std::string base = base_name(path);
  EMBER_CHECK(!path.empty() && !base.empty() && base != "." && base != "..", ValueError, op, ": '", path,
              "' names a directory, not a file");
  struct stat target{};
  const bool exists = ::stat(path.c_str(), &target) == 0;
  if (exists) EMBER_CHECK(!S_ISDIR(target.st_mode), ValueError, op, ": '", path, "' is a directory");
  // The permissions an ordinary create would give (0666 less the umask), or the replaced file's own.
  const mode_t mode = exists ? (target.st_mode & 0777) : (0666 & ~current_umask());
  const std::string dir = parent_dir(path);
  std::string tmp = atomic_temp_prefix(path) + "XXXXXX";
  // O_CLOEXEC: a process another thread forks and execs meanwhile must not inherit the temporary file.
  const int raw_fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  EMBER_CHECK(raw_fd >= 0, Error, op, ": cannot create a temporary file for '", path, "' in '", dir,
              "': ", errno_text(errno));
  Fd f(raw_fd);
  bool keep_temp = false;
  try {
    // mkostemp makes the file 0600; the result gets the mode an ordinary write would leave (`mode` above).
    EMBER_CHECK(::fchmod(f.fd, mode) == 0, Error, op, ": chmod '", tmp, "': ", errno_text(errno));
    const AtomicFileWrite write = [&](const void* data, int64_t n) {
      EMBER_CHECK(n >= 0, ValueError, op, ": negative write of ", n, " bytes");
      const char* p = static_cast<const char*>(data);
      while (n > 0) {
        const ssize_t put = ::write(f.fd, p, static_cast<size_t>(std::min<int64_t>(n, int64_t{1} << 30)));
        if (put < 0 && errno == EINTR) continue;
        EMBER_CHECK(put > 0, Error, op, ": cannot write '", tmp, "' (for '", path, "'): ",
                    put < 0 ? errno_text(errno) : std::string("no progress"));
        p += put;
        n -= static_cast<int64_t>(put);
      }
    };
    fill(write);
    EMBER_CHECK(::fsync(f.fd) == 0, Error, op, ": fsync '", tmp, "' (for '", path, "'): ", errno_text(errno));
    const int fd = f.fd;
    f.fd = -1;
    EMBER_CHECK(::close(fd) == 0, Error, op, ": close '", tmp, "' (for '", path, "'): ", errno_text(errno));
    if (g_fault.exchange(AtomicWriteFault::none) == AtomicWriteFault::before_rename) {
      keep_temp = true;  // as a crash would: the complete temporary file stays, `path` is untouched
      EMBER_THROW(Error, op, ": simulated crash between writing '", tmp, "' and renaming it to '", path, "'");
    }
    EMBER_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, Error, op, ": cannot rename '", tmp, "' to '", path,
                "': ", errno_text(errno));
  } catch (...) {
    if (!keep_temp) ::unlink(tmp.c_str());
    throw;
  }
  // The rename is durable once the directory is; the new contents are complete either way, so a directory that
  // cannot be opened (some file systems) is not an error, but a failing fsync of an open directory is.
  Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd >= 0) {
    const int rc = ::fsync(d.fd);
    EMBER_CHECK(rc == 0 || errno == EINVAL || errno == EROFS, Error, op, ": fsync of directory '", dir,
                "' after renaming '", path, "': ", errno_text(errno));
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, [&](const AtomicFileWrite& write) {
    write(bytes.data(), static_cast<int64_t>(bytes.size()));
  });
}

}  // namespace ember
