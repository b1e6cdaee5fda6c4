#pragma once
// Cross-memory reads between processes on one host: how the same-host path
// (transport/shm_transport.h) moves a lent frame with one copy, the reader
// copying straight out of the sender's memory (process_vm_readv).
//
// Safety rules this module gives the transport:
// - A process is named by a pidfd, not a pid number: ProcessHandle::Exited
//   tells for certain whether the process it was opened on has ended, so a
//   pid number reused by a new process is never mistaken for the old one.
// - Identity is proven before anything is read: Verify reads the 8-byte
//   token the peer advertises at the address it advertises, and succeeds
//   only when the bytes match and the process is still the one the handle
//   names. That fails (and the ring is used instead) where the two processes
//   see each other's pids differently (another pid namespace), where the
//   reader lacks ptrace rights over the peer (another user, Yama, a
//   seccomp profile), or where pidfd_open is missing.
// - Read checks after copying that the process has not exited: bytes read
//   from a process that ended meanwhile are reported Unavailable, never
//   returned as data (its memory may have been torn down under the copy).
//
// LendBook is the lender's pure accounting: which frames each peer holds
// lent, bounded in bytes; released by the peer's message or all at once
// when the peer's process has ended. It never frees on a timeout: a reader
// that is merely slow may still be copying.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/buffer.h"

namespace tessera::xmem {

// This process as peers see it: advertised in every header of the
// same-host path.
struct SelfIdentity {
  uint32_t pid = 0;
  uint64_t pid_namespace = 0;  // inode of /proc/self/ns/pid (0 = unknown)
  uint64_t probe_address = 0;  // where `token` lies in this process
  uint64_t token = 0;          // random per process, never 0
};
SelfIdentity Self();

// An open pidfd on one process.
class ProcessHandle {
 public:
  // InvalidArgument for pid 0; Unavailable when the process does not exist;
  // Unimplemented/PermissionDenied when pidfds cannot be had here.
  static absl::StatusOr<std::shared_ptr<ProcessHandle>> Open(uint32_t pid);
  ~ProcessHandle();
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;

  uint32_t pid() const { return pid_; }
  // True once the process has ended (it cannot come back).
  bool Exited() const;
  // Reads 8 bytes at probe_address and compares them with token; see the
  // file comment. The error says why (errno text) when it cannot.
  absl::Status Verify(uint64_t probe_address, uint64_t token) const;
  // Copies ranges (offsets from `address` in the process) into their
  // destinations: Unavailable if the process has ended (before or during
  // the copy), Internal on any other failure or short read.
  absl::Status Read(uint64_t address, std::span<const CopyRange> ranges) const;

 private:
  ProcessHandle(uint32_t pid, int fd) : pid_(pid), fd_(fd) {}
  uint32_t pid_;
  int fd_;
};

// What a lender holds for its peers. Not thread-safe (the transport guards
// it with the peer's lock).
class LendBook {
 public:
  // Whether `bytes` more may be lent with at most `limit` bytes outstanding.
  bool Fits(uint64_t bytes, uint64_t limit) const { return lent_bytes_ + bytes <= limit; }
  // Keeps `frames` until Release(id). `id` is chosen by the caller, unique
  // across every book of the process (a release meant for another book must
  // never match), and not 0.
  void Lend(uint64_t id, std::vector<Buffer> frames);
  // Drops the frames of `id` and returns their bytes; 0 if unknown
  // (released already, or never lent: a peer's message is not trusted).
  uint64_t Release(uint64_t id);
  // Drops every lend (the peer's process ended); returns how many.
  size_t ReleaseAll();

  size_t lends() const { return lends_.size(); }
  uint64_t lent_bytes() const { return lent_bytes_; }

 private:
  struct Lent {
    std::vector<Buffer> frames;
    uint64_t bytes = 0;
  };
  uint64_t lent_bytes_ = 0;
  std::unordered_map<uint64_t, Lent> lends_;
};

}  // namespace tessera::xmem
