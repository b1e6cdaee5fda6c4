#pragma once
// Files on the local disk: the one place where the project writes a small
// file so that a reader never sees part of it.
//
// WriteFileAtomically(path, bytes) writes `bytes` to a temporary file beside
// `path` (the same directory, named `path.tmp.PID.N`), fsyncs it, renames it
// over `path` and fsyncs the directory.
// - After OK: `path` holds exactly `bytes`, and both the contents and the
//   name survive a crash of the process or of the machine (as far as the
//   file system honours fsync). Readers that open `path` see either the old
//   file or the new one in full, never a mix or a part.
// - After an error: the message names `path`, the step that failed and the
//   system's errno text. The temporary has been removed. `path` is either
//   untouched (it holds what it held before, or does not exist) or, when
//   only the final directory fsync failed, holds the new bytes in full but
//   its new name may not yet be on disk. Never a partial file under `path`.
// - The directory must exist: it is not created. Files are created with mode
//   0666 less the umask; a file replaced keeps neither its mode nor its owner.
// - Two writers of the same `path` at once (threads or processes) each
//   write their own temporary; the last rename wins, whole.
// - For small files (state, summaries, dumps): the bytes are one string in
//   memory. Files too large for that (checkpoints) stream through their own
//   writer and use SyncDirectory after their rename.
//
// SyncDirectory(dir) fsyncs the directory `dir`, so that names created,
// renamed or removed in it survive a crash. OK, or an error naming `dir`
// and the errno text (a missing directory, one that cannot be opened, a
// failed fsync). A file system that cannot fsync a directory at all
// (EINVAL) counts as OK: the rename is as durable as it can be there.
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tessera {

absl::Status WriteFileAtomically(const std::string& path, std::string_view bytes);

absl::Status SyncDirectory(const std::string& dir);

// The text of errno value `e` ("No such file or directory").
std::string ErrnoText(int e);

}  // namespace tessera
