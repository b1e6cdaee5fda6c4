#pragma once
// LogColdRows: a table's disk tier (server/cold_rows.h) as a log of
// records in one file, with the index in memory.
//
// Layout: the file is a sequence of segments of kSegmentBytes (rounded
// down to whole records); a record is a key and its row (8 + 4 * row_floats
// bytes), and its slot number says where it lies (slot * record bytes). New
// records go to the open segment through a write buffer of kBufferBytes,
// written to the file with one pwrite when it fills (and when the segment
// does), and its write-back started at once (sync_file_range, without
// waiting), so that the store never leaves gigabytes of dirty pages for the
// kernel to write in one go. An index in memory (server/log_index.h: key -> slot) finds a
// key's record; a row whose slot is still in the buffer is read from there,
// any other through a read-only mapping of the whole file.
//
// Why: the bucket store (server/bucket_file_cold_rows.h) changes a row in
// place, so every row moved to or from disk dirties a 4 KiB page of the
// page cache that the kernel must write back, and once the files outgrow
// what the kernel lets stay dirty, each such write costs a write-protect
// fault and a 4 KiB write-back: at 10^7 rows a server (bench/
// run_large_table.sh) that was most of the servers' CPU. Here a row moved to
// disk costs its own bytes of a sequential write, and a row taken back costs
// no write at all (its slot is only forgotten). The price is the index: 11
// to 22 bytes of memory per row on disk (8-byte entries in pages 3/8 to 3/4
// full), counted in memory_bytes() and so in the table's budget.
//
// Space: a slot whose row was taken back, erased or replaced is dead. When
// the dead records pass the live ones (the file holds more than twice the
// rows), the sealed segment with the fewest live records is compacted: its
// live records are written again at the log's end, and its space is given
// back to the file system (a hole punched) and reused for a later segment.
// So the file stays within about twice the live rows plus two segments,
// and each row is written about twice in all.
//
// Failure: a write or a mapping that fails stops the process naming the file
// (TESSERA_CHECK_MSG; the ColdRows contract). A full disk is an error at
// the pwrite that needs room, not a SIGBUS later: reads go only to slots
// already written.
//
// Scratch, like the other stores: Open removes what an earlier store left
// in the directory (other files are refused); the destructor removes the
// file. Not thread-safe (the ColdRows contract).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/cold_rows.h"
#include "server/log_index.h"

namespace tessera {

class LogColdRows final : public ColdRows {
 public:
  static constexpr size_t kSegmentBytes = size_t{16} << 20;
  static constexpr size_t kBufferBytes = size_t{1} << 20;
  // This object, its lists and slack, the write buffer and compaction's read buffer.
  static constexpr uint64_t kFixedMemoryBytes = (size_t{2} << 20) + 2 * kBufferBytes;

  // `directory` is made if missing; what an earlier store left in it is
  // removed, other files are refused (FailedPrecondition, nothing removed).
  // `segment_bytes` (tests) overrides kSegmentBytes; at least one record.
  static absl::StatusOr<std::unique_ptr<LogColdRows>> Open(const std::string& directory, uint32_t row_floats,
                                                           size_t segment_bytes = kSegmentBytes);
  ~LogColdRows() override;
  LogColdRows(const LogColdRows&) = delete;
  LogColdRows& operator=(const LogColdRows&) = delete;

  uint32_t row_floats() const override { return row_floats_; }
  void Put(Key key, std::span<const float> row) override;
  void Add(Key key, std::span<const float> row) override;
  size_t Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override {
    return Read(keys, out, found, /*take=*/false);
  }
  size_t Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) override {
    return Read(keys, out, found, /*take=*/true);
  }
  bool Contains(Key key) override { return index_.Contains(key); }
  // The key of the record in `slot`.
  Key KeyAt(uint32_t slot) const;
  void Erase(Key key) override;
  void ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) override;
  void ForEachKey(absl::FunctionRef<void(Key)> fn) override;
  // The index's memory (server/log_index.h: what it holds, a page for its
  // next split, and MemoryFor the rows beyond those it holds), plus
  // kFixedMemoryBytes.
  uint64_t memory_bytes(uint64_t rows) const override;
  ColdRowStats stats() const override;
  void KeepAlive(std::shared_ptr<const void> owner) { owner_ = std::move(owner); }

  // For tests.
  uint64_t size() const { return index_.size(); }
  size_t records_per_segment() const { return per_segment_; }
  uint64_t segments_in_use() const { return segments_ - free_segments_.size(); }
  uint64_t segments_compacted() const { return compacted_; }
  uint64_t dead_records() const { return dead_; }

 private:
  LogColdRows(std::string directory, uint32_t row_floats, size_t segment_bytes);
  absl::Status OpenFile();
  // Where `slot`'s record lies in the file.
  size_t Offset(uint32_t slot) const;
  void WriteAll(const char* data, size_t bytes, size_t offset);
  size_t Read(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found, bool take);
  // The record of `slot`: in the write buffer or the mapping.
  const char* Record(uint32_t slot) const;
  // Writes a record at the log's end; returns its slot.
  uint32_t Append(Key key, const char* row);
  // Writes the buffer to the file.
  void Flush();
  // Starts a new open segment (a freed one if any, else a new one at the end).
  void OpenSegment();
  // Marks `slot`'s record dead.
  void Kill(uint32_t slot);
  // Compacts sealed segments while the dead records outnumber the live.
  void CompactIfNeeded();
  void CompactSegment(uint64_t segment);

  const std::string directory_;
  const uint32_t row_floats_;
  const size_t row_bytes_;
  const size_t record_bytes_;
  const size_t per_segment_;   // records a segment holds
  const size_t segment_stride_;  // bytes from one segment's start to the next's (whole pages)
  const size_t buffer_records_;
  std::string path_;
  int fd_ = -1;
  char* map_ = nullptr;        // read-only mapping of kReserveBytes over the file
  LogIndex index_;             // key -> slot
  std::vector<uint32_t> live_; // per segment: live records
  std::vector<uint8_t> state_; // per segment: in use or free
  std::vector<uint64_t> free_segments_;
  uint64_t segments_ = 0;      // segments ever made (the file's length in segments)
  uint64_t open_segment_ = 0;
  bool has_open_ = false;
  uint32_t next_slot_ = 0;     // the open segment's next free slot
  uint32_t buffer_slot_ = 0;   // the slot of the buffer's first record
  std::vector<char> buffer_;
  uint64_t dead_ = 0;          // dead records in the file (and buffer)
  uint64_t compacted_ = 0;
  bool compacting_ = false;
  ColdRowStats stats_;
  std::shared_ptr<const void> owner_;
};

}  // namespace tessera
