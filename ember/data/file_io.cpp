// stat-based file checks and positioned reads (pread) for the data readers. Invariant: read_at retries partial reads
// and interruptions, so a count below the request always means the end of the file.
#include "ember/data/file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "ember/base/error.h"

namespace ember::data::io {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool is_directory(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::optional<int64_t> file_size(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<int64_t>(st.st_size);
}

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  EMBER_CHECK(fd_ >= 0, ValueError, "cannot open '", path, "': ", std::strerror(errno));
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t ReadOnlyFile::read_at(int64_t offset, void* dst, int64_t n) const {
  EMBER_CHECK(offset >= 0 && n >= 0, ValueError, "read_at '", path_, "': negative offset ", offset, " or size ", n);
  auto* p = static_cast<unsigned char*>(dst);
  int64_t total = 0;
  while (total < n) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(n - total, int64_t{1} << 30));
    const ssize_t got = ::pread(fd_, p + total, want, static_cast<off_t>(offset + total));
    if (got < 0) {
      if (errno == EINTR) continue;
      EMBER_THROW(ValueError, "cannot read '", path_, "' at byte ", offset + total, ": ", std::strerror(errno));
    }
    if (got == 0) break;  // end of file
    total += got;
  }
  return total;
}

}  // namespace ember::data::io
