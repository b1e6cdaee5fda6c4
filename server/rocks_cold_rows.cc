#include "server/rocks_cold_rows.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/check.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/memtablerep.h"
#include "rocksdb/options.h"
#include "rocksdb/slice_transform.h"
#include "rocksdb/table.h"
#include "server/store_directory.h"

namespace tessera {
namespace {

// Keys are stored as 8 bytes, big-endian (any fixed encoding would do; this
// one keeps the files ordered by key, which ForEach does not promise).
struct KeyBytes {
  explicit KeyBytes(Key key) {
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(key >> (56 - 8 * i));
  }
  rocksdb::Slice slice() const { return rocksdb::Slice(bytes, sizeof(bytes)); }
  char bytes[8];
};

Key KeyOf(const rocksdb::Slice& s) {
  Key key = 0;
  for (int i = 0; i < 8; ++i) key = (key << 8) | static_cast<unsigned char>(s.data()[i]);
  return key;
}

rocksdb::WriteOptions Unlogged() {
  rocksdb::WriteOptions w;
  w.disableWAL = true;  // scratch: the replicas hold what a crash would lose
  return w;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RocksColdRows>> RocksColdRows::Open(const RocksColdRowsOptions& options,
                                                                   uint32_t row_floats) {
  if (absl::Status s = PrepareStoreDirectory(options.directory, row_floats, "CURRENT"); !s.ok()) return s;
  rocksdb::Options o;
  o.create_if_missing = true;
  o.error_if_exists = true;
  o.compression = rocksdb::kNoCompression;  // float rows barely compress; CPU is better spent elsewhere
  o.write_buffer_size = options.write_buffer_bytes;
  o.max_write_buffer_number = 2;
  o.max_background_jobs = 2;
  o.compaction_style = rocksdb::kCompactionStyleUniversal;
  o.max_open_files = -1;
  o.info_log_level = rocksdb::WARN_LEVEL;
  o.keep_log_file_num = 2;
  o.avoid_unnecessary_blocking_io = true;
  // Point lookups and writes only, never a range: a hash memtable keyed by
  // the whole 8-byte key (the default skip list costs a dozen key compares
  // an insert and a lookup).
  o.prefix_extractor.reset(rocksdb::NewFixedPrefixTransform(8));
  o.memtable_factory.reset(rocksdb::NewHashLinkListRepFactory(std::max<size_t>(1024, options.write_buffer_bytes / 128)));
  o.allow_concurrent_memtable_write = false;
  o.allow_mmap_reads = true;  // a copy instead of a pread per block read
  std::shared_ptr<rocksdb::Cache> cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  rocksdb::BlockBasedTableOptions t;
  t.block_cache = cache;
  t.block_size = 4 * 1024;
  t.cache_index_and_filter_blocks = false;
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));  // most lookups of new keys skip the disk
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(o, options.directory, &db);
  if (!s.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("disk tier: cannot open a store in ", options.directory, ": ", s.ToString()));
  }
  return std::unique_ptr<RocksColdRows>(new RocksColdRows(options, row_floats, std::move(cache), db));
}

RocksColdRows::RocksColdRows(const RocksColdRowsOptions& options, uint32_t row_floats,
                             std::shared_ptr<rocksdb::Cache> cache, rocksdb::DB* db)
    : options_(options), row_floats_(row_floats), cache_(std::move(cache)), db_(db) {}

RocksColdRows::~RocksColdRows() {
  if (db_ != nullptr) {
    db_->Close().PermitUncheckedError();
    db_.reset();
  }
  std::error_code ec;
  std::filesystem::remove_all(options_.directory, ec);  // scratch; a failure here harms nobody
}

void RocksColdRows::Put(Key key, std::span<const float> row) {
  TESSERA_CHECK(row.size() == row_floats_);
  const KeyBytes k(key);
  const rocksdb::Status s = db_->Put(Unlogged(), k.slice(),
                                     rocksdb::Slice(reinterpret_cast<const char*>(row.data()), row.size_bytes()));
  TESSERA_CHECK_MSG(s.ok(), absl::StrCat("disk tier ", options_.directory, ": write failed: ", s.ToString()));
  ++stats_.rows_written;
}

size_t RocksColdRows::Get(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) {
  TESSERA_CHECK(out.size() == keys.size() * row_floats_ && found.size() == keys.size());
  if (keys.empty()) return 0;
  std::vector<KeyBytes> kb;
  kb.reserve(keys.size());
  std::vector<rocksdb::Slice> slices;
  slices.reserve(keys.size());
  for (Key key : keys) {
    kb.emplace_back(key);
    slices.push_back(kb.back().slice());
  }
  std::vector<rocksdb::PinnableSlice> values(keys.size());
  std::vector<rocksdb::Status> statuses(keys.size());
  db_->MultiGet(rocksdb::ReadOptions(), db_->DefaultColumnFamily(), keys.size(), slices.data(), values.data(),
                statuses.data());
  const size_t row_bytes = size_t{row_floats_} * sizeof(float);
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].IsNotFound()) {
      found[i] = 0;
      ++stats_.lookups_absent;
      continue;
    }
    TESSERA_CHECK_MSG(statuses[i].ok(),
                      absl::StrCat("disk tier ", options_.directory, ": read failed: ", statuses[i].ToString()));
    TESSERA_CHECK_MSG(values[i].size() == row_bytes,
                      absl::StrCat("disk tier ", options_.directory, ": a row of ", values[i].size(),
                                   " bytes where ", row_bytes, " were written"));
    std::memcpy(out.data() + i * row_floats_, values[i].data(), row_bytes);
    found[i] = 1;
    ++stats_.rows_read;
    ++n;
  }
  return n;
}

size_t RocksColdRows::Take(std::span<const Key> keys, std::span<float> out, std::span<uint8_t> found) {
  Get(keys, out, found);
  absl::flat_hash_set<Key> taken;
  size_t n = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!found[i]) continue;
    if (!taken.insert(keys[i]).second) {  // listed before: already taken
      found[i] = 0;
      continue;
    }
    Erase(keys[i]);
    ++n;
  }
  return n;
}

bool RocksColdRows::Contains(Key key) {
  const KeyBytes k(key);
  const rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), k.slice(), &scratch_);
  if (s.IsNotFound()) return false;
  TESSERA_CHECK_MSG(s.ok(), absl::StrCat("disk tier ", options_.directory, ": read failed: ", s.ToString()));
  return true;
}

void RocksColdRows::Erase(Key key) {
  const KeyBytes k(key);
  const rocksdb::Status s = db_->Delete(Unlogged(), k.slice());
  TESSERA_CHECK_MSG(s.ok(), absl::StrCat("disk tier ", options_.directory, ": delete failed: ", s.ToString()));
  ++stats_.rows_erased;
}

void RocksColdRows::ForEach(absl::FunctionRef<void(Key, std::span<const float>)> fn) {
  rocksdb::ReadOptions r;
  r.fill_cache = false;       // one pass over everything would only push the hot blocks out
  r.total_order_seek = true;  // every key, not one prefix (the hash memtable's default)
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(r));
  std::vector<float> row(row_floats_);
  const size_t row_bytes = row.size() * sizeof(float);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    TESSERA_CHECK_MSG(it->key().size() == 8 && it->value().size() == row_bytes,
                      absl::StrCat("disk tier ", options_.directory, ": a record of the wrong size"));
    std::memcpy(row.data(), it->value().data(), row_bytes);  // aligned for the caller
    fn(KeyOf(it->key()), row);
  }
  TESSERA_CHECK_MSG(it->status().ok(),
                    absl::StrCat("disk tier ", options_.directory, ": scan failed: ", it->status().ToString()));
}

uint64_t RocksColdRows::memory_bytes(uint64_t rows) const {
  return 2 * options_.write_buffer_bytes + options_.block_cache_bytes + kFixedOverheadBytes + kBytesPerRow * rows;
}

ColdRowStats RocksColdRows::stats() const {
  ColdRowStats s = stats_;
  uint64_t sst = 0;
  if (db_->GetIntProperty("rocksdb.total-sst-files-size", &sst)) s.bytes_on_disk = sst;
  return s;
}

}  // namespace tessera
