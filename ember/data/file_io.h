// File utilities shared by the data readers (IDX, CIFAR, byte streams): existence and size checks by stat, and a
// read-only file with positioned reads. Invariant: a size is read before any buffer for the file is allocated, and
// a ReadOnlyFile reports a short read (end of file) as a byte count, never as success.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ember::data::io {

bool ends_with(std::string_view s, std::string_view suffix);
bool is_file(const std::string& path);       // a regular file (following links)
bool is_directory(const std::string& path);  // a directory (following links)
// The size in bytes of the regular file at `path`; nullopt when there is none or stat fails.
std::optional<int64_t> file_size(const std::string& path);

// A file opened read-only (POSIX descriptor, closed on destruction); ValueError naming the path when it cannot be
// opened. read_at does not move a shared position, so one object may serve several readers at once.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  // Reads up to n bytes starting at byte `offset` into dst and returns how many it got: fewer than n only when the
  // file ends first. ValueError naming the path on a read error.
  int64_t read_at(int64_t offset, void* dst, int64_t n) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace ember::data::io
