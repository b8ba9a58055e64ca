// Atomic file replacement: the new contents go to a temporary file beside the target, are flushed and fsync'ed, and
// the temporary file is renamed over the target (then the directory is fsync'ed). Invariant: a reader of `path` sees
// either the complete previous file or the complete new one, never a mixture or a prefix (Note [Atomic replace]).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace ember {

// Note [Atomic replace]
// POSIX rename() replaces a directory entry atomically: whoever opens `path` gets the old inode or the new one. The
// data reaches the disk before the rename because the temporary file is fsync'ed first (otherwise a power cut could
// leave a renamed but empty file), and the directory is fsync'ed after it so the rename itself survives a crash. The
// temporary file lives in the target's directory (rename cannot cross file systems) under a unique name
// ".<name>.tmp.XXXXXX", so concurrent or crashed writers never share one; a crash leaves at worst such a stale file,
// which no reader of `path` ever opens and no later write reuses. The new file gets the replaced file's permission
// bits, or 0666 less the umask when `path` is new, as an ordinary write would; the temporary descriptor is
// close-on-exec. The rename replaces the directory entry `path` itself: when it is a symbolic link, the link becomes
// the new regular file and the file it pointed to is left as it was.

// Streams the new contents: write(data, n) appends n bytes. Passed to the fill callback below.
using AtomicFileWrite = std::function<void(const void* data, int64_t n)>;

// Replaces `path` with what `fill` writes. Error (naming the path and the errno text) when the temporary file
// cannot be created, written, flushed or renamed; ValueError when `path` names a directory. The temporary file is
// removed on every failure (an exception from `fill` included), except a simulated crash (below).
void write_file_atomically(const std::string& path, const std::function<void(const AtomicFileWrite& write)>& fill);
void write_file_atomically(const std::string& path, std::string_view bytes);

// Test hook: the next write_file_atomically in this process fails at the chosen point as a crash would there —
// before_rename: the temporary file is complete and fsync'ed, then Error("... simulated crash ...") is thrown and the
// temporary file is left behind, `path` untouched. The fault fires once and disarms itself.
enum class AtomicWriteFault { none, before_rename };
void set_atomic_write_fault(AtomicWriteFault fault);

// The temporary files a crashed write to `path` can leave (".<name>.tmp.*" in its directory), for tests and cleanup
// tools; the writer never deletes them itself (another process may be writing one).
std::string atomic_temp_prefix(const std::string& path);

}  // namespace ember
