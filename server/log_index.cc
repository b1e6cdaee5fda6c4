#include "server/log_index.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace tessera {
namespace {

constexpr size_t kMask = LogIndex::kPageEntries - 1;
constexpr uint32_t kMaxDepth = 32 - LogIndex::kPageBits;  // a page's keys keep 13 bits of their own

}  // namespace

LogIndex::LogIndex(std::function<Key(uint32_t)> key_of) : key_of_(std::move(key_of)) {
  directory_.push_back(NewPage(0));
}

LogIndex::Page* LogIndex::NewPage(uint32_t depth) {
  auto page = std::make_unique<Page>();
  page->depth = depth;
  page->entries = std::make_unique<Entry[]>(kPageEntries);
  for (size_t i = 0; i < kPageEntries; ++i) page->entries[i] = Entry{0, kNoSlot};
  pages_.push_back(std::move(page));
  return pages_.back().get();
}

LogIndex::Page& LogIndex::PageOf(uint32_t bits) const {
  return *directory_[global_depth_ == 0 ? 0 : bits >> (32 - global_depth_)];
}

size_t LogIndex::Position(const Page& page, Key key, uint32_t bits) const {
  for (size_t i = Home(bits);; i = (i + 1) & kMask) {
    const Entry& e = page.entries[i];
    if (e.slot == kNoSlot) return kPageEntries;
    if (e.bits == bits && key_of_(e.slot) == key) return i;
  }
}

uint32_t LogIndex::Find(Key key, uint64_t hash) const {
  const uint32_t bits = Bits(hash);
  const Page& page = PageOf(bits);
  const size_t i = Position(page, key, bits);
  return i == kPageEntries ? kNoSlot : page.entries[i].slot;
}

void LogIndex::Put(Page& page, uint32_t bits, uint32_t slot) {
  size_t i = Home(bits);
  while (page.entries[i].slot != kNoSlot) i = (i + 1) & kMask;
  page.entries[i] = Entry{bits, slot};
  ++page.count;
}

void LogIndex::Insert(Key key, uint64_t hash, uint32_t slot) {
  TESSERA_DCHECK(slot != kNoSlot && Find(key, hash) == kNoSlot);
  const uint32_t bits = Bits(hash);
  Page* page = &PageOf(bits);
  while ((page->count + 1) * 4 > kPageEntries * 3) {
    Split(*page);
    page = &PageOf(bits);
  }
  Put(*page, bits, slot);
  ++size_;
}

void LogIndex::Replace(Key key, uint64_t hash, uint32_t slot) {
  const uint32_t bits = Bits(hash);
  Page& page = PageOf(bits);
  const size_t i = Position(page, key, bits);
  TESSERA_CHECK(i != kPageEntries);
  page.entries[i].slot = slot;
}

bool LogIndex::Erase(Key key, uint64_t hash) {
  const uint32_t bits = Bits(hash);
  Page& page = PageOf(bits);
  size_t hole = Position(page, key, bits);
  if (hole == kPageEntries) return false;
  // Backward shift: entries after the hole that may sit in it move up, so
  // that no probe meets an empty entry before its key.
  for (size_t j = (hole + 1) & kMask;; j = (j + 1) & kMask) {
    const Entry e = page.entries[j];
    if (e.slot == kNoSlot) break;
    const size_t home = Home(e.bits);
    // e may move to the hole when its home is not in (hole, j] (cyclically).
    const bool home_between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!home_between) {
      page.entries[hole] = e;
      hole = j;
    }
  }
  page.entries[hole] = Entry{0, kNoSlot};
  --page.count;
  --size_;
  return true;
}

void LogIndex::Split(Page& page) {
  TESSERA_CHECK_MSG(page.depth < kMaxDepth,
                    absl::StrCat("disk tier index: more than ", size_, " rows on disk in one store"));
  if (page.depth == global_depth_) {  // the directory doubles: each pointer twice
    std::vector<Page*> doubled(directory_.size() * 2);
    for (size_t i = 0; i < doubled.size(); ++i) doubled[i] = directory_[i >> 1];
    directory_ = std::move(doubled);
    ++global_depth_;
  }
  const uint32_t depth = page.depth + 1;
  Page* upper = NewPage(depth);
  page.depth = depth;
  // The keys whose next bit is 1 go to the new page; the rest are put back.
  std::vector<Entry> held;
  held.reserve(page.count);
  for (size_t i = 0; i < kPageEntries; ++i) {
    if (page.entries[i].slot != kNoSlot) held.push_back(page.entries[i]);
    page.entries[i] = Entry{0, kNoSlot};
  }
  page.count = 0;
  const uint32_t bit = uint32_t{1} << (32 - depth);
  for (const Entry& e : held) Put((e.bits & bit) ? *upper : page, e.bits, e.slot);
  // Directory entries of this page whose bit is 1 now point to the new one.
  const size_t shift = global_depth_ - depth;  // directory bits below the page's
  for (size_t i = 0; i < directory_.size(); ++i)
    if (directory_[i] == &page && ((i >> shift) & 1)) directory_[i] = upper;
}

void LogIndex::ForEach(absl::FunctionRef<void(uint32_t)> fn) const {
  for (const auto& page : pages_)
    for (size_t i = 0; i < kPageEntries; ++i)
      if (page->entries[i].slot != kNoSlot) fn(page->entries[i].slot);
}

}  // namespace tessera
