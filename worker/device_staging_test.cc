// DeviceStaging's pipeline, two ways:
// - with a fake copier and a fake transfer port that record every operation
//   and complete only when waited for (or on their own threads after a
//   delay), replayed by a checker of the pipeline's rules (a buffer is
//   reused only once its push or copy completed, at most `buffers` parts in
//   flight, copies overlap transfers, errors drain everything);
// - with the host copier and a real worker against an in-process cluster,
//   comparing pulled values exactly (ACCUMULATE tables).
#include "worker/device_staging.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/cluster/inproc_cluster.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// ---------------------------------------------------------------------------
// The record of operations

enum class Op { kCopyStart, kCopyDone, kIssue, kDone };

const char* OpName(Op op) {
  switch (op) {
    case Op::kCopyStart: return "copy-start";
    case Op::kCopyDone: return "copy-done";
    case Op::kIssue: return "issue";
    case Op::kDone: return "done";
  }
  return "?";
}

// part: copies and transfers are counted from 0 in the order they were
// started (the pipeline starts both in part order); slot: the buffer used.
struct Event {
  Op op;
  size_t part;
  size_t slot;
};

class EventLog {
 public:
  void Add(Op op, size_t part, size_t slot) {
    std::lock_guard lock(mu_);
    events_.push_back({op, part, slot});
  }
  std::vector<Event> events() const {
    std::lock_guard lock(mu_);
    return events_;
  }
  void Clear() {
    std::lock_guard lock(mu_);
    events_.clear();
  }

 private:
  mutable std::mutex mu_;
  std::vector<Event> events_;
};

constexpr size_t kNoSlot = ~size_t{0};
constexpr Nanos kFakeCopyNanos = 1000;
constexpr float kPoison = -12345.0f;

// Copies move their data only when waited for, so a pipeline that used a
// buffer (or device memory) before waiting would see stale values.
class FakeCopier final : public Copier {
 public:
  explicit FakeCopier(EventLog& log) : log_(log) {}

  std::optional<size_t> fail_start;  // the copy (in start order) whose Start fails
  std::optional<size_t> fail_wait;   // the copy whose Wait reports an error

  absl::Status Allocate(size_t count, size_t bytes) override {
    buffers_.assign(count, std::vector<float>(bytes / sizeof(float), kPoison));
    pending_.assign(count, std::nullopt);
    return absl::OkStatus();
  }
  std::span<float> buffer(size_t slot) override { return buffers_.at(slot); }
  absl::Status StartToHost(size_t slot, const float* src, size_t floats) override {
    return Start(slot, buffers_.at(slot).data(), src, floats);
  }
  absl::Status StartToDevice(size_t slot, float* dst, size_t floats) override {
    return Start(slot, dst, buffers_.at(slot).data(), floats);
  }
  absl::StatusOr<Nanos> Wait(size_t slot) override {
    if (!pending_.at(slot)) return Nanos{0};
    const Pending p = *std::exchange(pending_[slot], std::nullopt);
    std::memcpy(p.dst, p.src, p.floats * sizeof(float));
    --outstanding_;
    log_.Add(Op::kCopyDone, p.index, slot);
    if (fail_wait == p.index) return absl::DataLossError("injected copy failure");
    return kFakeCopyNanos;
  }
  bool Done(size_t slot) override { return !pending_.at(slot).has_value(); }
  std::string name() const override { return "fake"; }

  int outstanding() const { return outstanding_; }
  void ResetCount() { started_ = 0; }
  size_t SlotOf(const float* p) const {
    for (size_t s = 0; s < buffers_.size(); ++s) {
      if (buffers_[s].data() == p) return s;
    }
    return kNoSlot;
  }

 private:
  struct Pending {
    size_t index;
    float* dst;
    const float* src;
    size_t floats;
  };

  absl::Status Start(size_t slot, float* dst, const float* src, size_t floats) {
    const size_t index = started_++;
    if (fail_start == index) return absl::InternalError("injected start failure");
    if (pending_.at(slot)) ADD_FAILURE() << "copy " << index << " started on slot " << slot << " with one outstanding";
    if (floats > buffers_[slot].size()) ADD_FAILURE() << "copy " << index << " of " << floats << " floats overflows";
    pending_[slot] = Pending{index, dst, src, floats};
    ++outstanding_;
    log_.Add(Op::kCopyStart, index, slot);
    return absl::OkStatus();
  }

  EventLog& log_;
  std::vector<std::vector<float>> buffers_;
  std::vector<std::optional<Pending>> pending_;
  size_t started_ = 0;
  int outstanding_ = 0;
};

class FakePort;

// Completes when waited for (lazy), or on its own thread after a delay.
class FakeTransfer final : public PendingTransfer {
 public:
  FakeTransfer(FakePort& port, std::function<absl::Status()> complete, Nanos delay);
  ~FakeTransfer() override;
  absl::Status Wait() override;
  bool ready() const override;

 private:
  FakePort& port_;
  std::function<absl::Status()> complete_;  // lazy only
  std::optional<absl::Status> result_;      // lazy only
  std::shared_future<absl::Status> async_;  // delayed only
  bool waited_ = false;
};

// A server side in memory: ACCUMULATE tables. A push reads its values, and
// a pull writes its rows, when the transfer completes (as a transport that
// references the caller's memory until then).
class FakePort final : public TransferPort {
 public:
  // max_delay 0: transfers complete only when waited for; else each completes
  // on its own thread after a pseudo-random delay of up to max_delay.
  FakePort(EventLog& log, FakeCopier& copier, Nanos max_delay = 0)
      : log_(log), copier_(copier), max_delay_(max_delay) {}

  std::map<size_t, absl::Status> fail;  // transfer (in issue order) -> its error; set before use

  void AddTable(uint32_t id, size_t width) { tables_[id].width = width; }

  std::unique_ptr<PendingTransfer> Push(uint32_t table, std::span<const Key> keys,
                                        std::span<const float> values) override {
    return Issue(values.data(), [this, table, keys, values] {
      std::lock_guard lock(mu_);
      auto t = tables_.find(table);
      if (t == tables_.end()) return absl::FailedPreconditionError(absl::StrCat("no table ", table));
      if (values.size() != keys.size() * t->second.width) return absl::InvalidArgumentError("values size");
      for (size_t i = 0; i < keys.size(); ++i) {
        std::vector<float>& row = t->second.rows[keys[i]];
        row.resize(t->second.width, 0.0f);
        for (size_t j = 0; j < row.size(); ++j) row[j] += values[i * row.size() + j];
      }
      return absl::OkStatus();
    });
  }

  std::unique_ptr<PendingTransfer> Pull(uint32_t table, std::span<const Key> keys, std::span<float> out) override {
    return Issue(out.data(), [this, table, keys, out] {
      std::lock_guard lock(mu_);
      auto t = tables_.find(table);
      if (t == tables_.end()) return absl::FailedPreconditionError(absl::StrCat("no table ", table));
      const size_t w = t->second.width;
      if (out.size() != keys.size() * w) return absl::InvalidArgumentError("out size");
      for (size_t i = 0; i < keys.size(); ++i) {
        auto r = t->second.rows.find(keys[i]);
        for (size_t j = 0; j < w; ++j) out[i * w + j] = r == t->second.rows.end() ? 0.0f : r->second[j];
      }
      return absl::OkStatus();
    });
  }

  size_t issued() const {
    std::lock_guard lock(mu_);
    return issued_;
  }
  size_t max_unfinished() const {
    std::lock_guard lock(mu_);
    return max_unfinished_;
  }
  // Issued but never waited for by the pipeline (still in flight, or dropped).
  size_t unwaited() const {
    std::lock_guard lock(mu_);
    return issued_ - waited_;
  }
  size_t dropped() const {
    std::lock_guard lock(mu_);
    return dropped_;
  }
  // Counts (and `fail` indices) start again from 0.
  void ResetCounts() {
    std::lock_guard lock(mu_);
    issued_ = waited_ = dropped_ = 0;
    max_unfinished_ = unfinished_;
  }

 private:
  friend class FakeTransfer;
  struct Table {
    size_t width = 1;
    std::unordered_map<Key, std::vector<float>> rows;
  };

  std::unique_ptr<PendingTransfer> Issue(const float* memory, std::function<absl::Status()> work) {
    size_t index;
    Nanos delay = 0;
    {
      std::lock_guard lock(mu_);
      index = issued_++;
      ++unfinished_;
      max_unfinished_ = std::max(max_unfinished_, unfinished_);
      if (max_delay_ > 0) {
        rng_ = rng_ * 6364136223846793005ull + 1442695040888963407ull;
        delay = static_cast<Nanos>((rng_ >> 33) % static_cast<uint64_t>(max_delay_));
      }
    }
    const size_t slot = copier_.SlotOf(memory);
    log_.Add(Op::kIssue, index, slot);
    auto fail_it = fail.find(index);
    std::optional<absl::Status> injected;
    if (fail_it != fail.end()) injected = fail_it->second;
    auto complete = [this, index, slot, injected, work = std::move(work)]() -> absl::Status {
      absl::Status s = injected ? *injected : work();
      {
        std::lock_guard lock(mu_);
        --unfinished_;
      }
      log_.Add(Op::kDone, index, slot);
      return s;
    };
    return std::make_unique<FakeTransfer>(*this, std::move(complete), delay);
  }

  void NoteWaited() {
    std::lock_guard lock(mu_);
    ++waited_;
  }
  void NoteDropped() {
    std::lock_guard lock(mu_);
    ++dropped_;
  }

  EventLog& log_;
  FakeCopier& copier_;
  const Nanos max_delay_;
  mutable std::mutex mu_;
  std::map<uint32_t, Table> tables_;  // rows guarded by mu_ (completions may run on other threads)
  size_t issued_ = 0, waited_ = 0, dropped_ = 0, unfinished_ = 0, max_unfinished_ = 0;
  uint64_t rng_ = 42;
};

FakeTransfer::FakeTransfer(FakePort& port, std::function<absl::Status()> complete, Nanos delay) : port_(port) {
  if (delay > 0) {
    async_ = std::async(std::launch::async, [complete = std::move(complete), delay] {
               std::this_thread::sleep_for(std::chrono::nanoseconds(delay));
               return complete();
             }).share();
  } else {
    complete_ = std::move(complete);
  }
}

FakeTransfer::~FakeTransfer() {
  if (!waited_) {
    port_.NoteDropped();
    if (async_.valid()) async_.wait();
  }
}

absl::Status FakeTransfer::Wait() {
  if (!waited_) {
    waited_ = true;
    port_.NoteWaited();
  }
  if (async_.valid()) return async_.get();
  if (!result_) result_ = complete_();
  return *result_;
}

bool FakeTransfer::ready() const {
  if (async_.valid()) return async_.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  return result_.has_value();
}

// ---------------------------------------------------------------------------
// The checker of the pipeline's rules

std::string Describe(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const Event& e : events) out.push_back(absl::StrCat(OpName(e.op), "(", e.part, "@", e.slot, ")"));
  return absl::StrJoin(out, " ");
}

// Replays a push (copy -> issue -> done) or a pull (issue -> done -> copy)
// schedule over `buffers` slots: a slot is held from the part's first
// operation until its last one completed (push: until its push is done;
// pull: until its copy is done), and nobody else may take it meanwhile.
// Returns the violations.
std::vector<std::string> CheckSchedule(const std::vector<Event>& events, bool push, size_t buffers) {
  std::vector<std::string> bad;
  std::vector<long> holder(buffers, -1);
  std::set<size_t> copied, transferred;
  auto take = [&](size_t slot, size_t part) {
    if (holder[slot] != -1) {
      bad.push_back(absl::StrCat("slot ", slot, " taken by part ", part, " while part ", holder[slot], " holds it"));
    }
    holder[slot] = static_cast<long>(part);
  };
  auto release = [&](size_t slot, size_t part) {
    if (holder[slot] != static_cast<long>(part)) {
      bad.push_back(absl::StrCat("part ", part, " released slot ", slot, " held by ", holder[slot]));
    }
    holder[slot] = -1;
  };
  auto held = [&](size_t slot, size_t part, const char* what) {
    if (holder[slot] != static_cast<long>(part)) {
      bad.push_back(absl::StrCat(what, " of part ", part, " on slot ", slot, " held by ", holder[slot]));
    }
  };
  for (const Event& e : events) {
    if (e.slot >= buffers || e.slot != e.part % buffers) {
      bad.push_back(absl::StrCat(OpName(e.op), " of part ", e.part, " on slot ", e.slot, ", expected slot ",
                                 e.part % buffers));
      continue;
    }
    switch (e.op) {
      case Op::kCopyStart:
        if (push) {
          take(e.slot, e.part);
        } else {
          if (!transferred.count(e.part)) bad.push_back(absl::StrCat("copy of part ", e.part, " before its pull"));
          held(e.slot, e.part, "copy");
        }
        break;
      case Op::kCopyDone:
        copied.insert(e.part);
        if (!push) release(e.slot, e.part);
        break;
      case Op::kIssue:
        if (push) {
          if (!copied.count(e.part)) bad.push_back(absl::StrCat("push of part ", e.part, " before its copy"));
          held(e.slot, e.part, "push");
        } else {
          take(e.slot, e.part);
        }
        break;
      case Op::kDone:
        transferred.insert(e.part);
        if (push) release(e.slot, e.part);
        break;
    }
  }
  return bad;
}

// Where the event stands in the log (events.size() if absent).
size_t Position(const std::vector<Event>& events, Op op, size_t part) {
  for (size_t i = 0; i < events.size(); ++i) {
    if (events[i].op == op && events[i].part == part) return i;
  }
  return events.size();
}

size_t Count(const std::vector<Event>& events, Op op) {
  return std::count_if(events.begin(), events.end(), [op](const Event& e) { return e.op == op; });
}

TEST(DeviceStagingCheckerTest, CatchesBrokenSchedules) {
  using E = Event;
  // Push over 2 slots: part 2 takes slot 0 before part 0's push is done.
  std::vector<Event> push = {E{Op::kCopyStart, 0, 0}, E{Op::kCopyDone, 0, 0}, E{Op::kIssue, 0, 0},
                             E{Op::kCopyStart, 1, 1}, E{Op::kCopyDone, 1, 1}, E{Op::kIssue, 1, 1},
                             E{Op::kCopyStart, 2, 0}};
  EXPECT_FALSE(CheckSchedule(push, true, 2).empty());
  push.insert(push.begin() + 6, E{Op::kDone, 0, 0});
  EXPECT_TRUE(CheckSchedule(push, true, 2).empty()) << absl::StrJoin(CheckSchedule(push, true, 2), "; ");
  // A push issued before its copy finished.
  EXPECT_FALSE(CheckSchedule({E{Op::kCopyStart, 0, 0}, E{Op::kIssue, 0, 0}}, true, 2).empty());
  // Pull over 2 slots: part 2 pulled into slot 0 before part 0's copy finished.
  std::vector<Event> pull = {E{Op::kIssue, 0, 0}, E{Op::kIssue, 1, 1}, E{Op::kDone, 0, 0},
                             E{Op::kCopyStart, 0, 0}, E{Op::kIssue, 2, 0}};
  EXPECT_FALSE(CheckSchedule(pull, false, 2).empty());
  // A copy out of a buffer whose pull has not completed.
  EXPECT_FALSE(CheckSchedule({E{Op::kIssue, 0, 0}, E{Op::kCopyStart, 0, 0}}, false, 2).empty());
  // The wrong slot.
  EXPECT_FALSE(CheckSchedule({E{Op::kCopyStart, 1, 0}}, true, 2).empty());
}

// ---------------------------------------------------------------------------
// The pipeline against the fakes

constexpr uint32_t kTable = 7;

std::vector<Key> MakeKeys(size_t n) {
  std::vector<Key> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = 1000 + 7 * i;
  return keys;
}

// Integers: sums of a few pushes are exact in float.
std::vector<float> MakeRows(size_t n, size_t width, int salt = 0) {
  std::vector<float> v(n * width);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(static_cast<int>(i % 1009) - 500 + salt);
  return v;
}

size_t PartsOf(size_t rows, size_t rows_per_part) { return (rows + rows_per_part - 1) / rows_per_part; }

struct FakeRig {
  explicit FakeRig(size_t staging_bytes, size_t buffers, Nanos max_delay = 0) {
    auto c = std::make_unique<FakeCopier>(log);
    copier = c.get();
    port = std::make_unique<FakePort>(log, *copier, max_delay);
    port->AddTable(kTable, 3);
    auto s = DeviceStaging::Create(*port, std::move(c), {.staging_bytes = staging_bytes, .buffers = buffers});
    EXPECT_TRUE(s.ok()) << s.status();
    if (s.ok()) staging = std::move(*s);
  }
  // Numbers copies and transfers from 0 again, with an empty log.
  void StartCall() {
    log.Clear();
    copier->ResetCount();
    port->ResetCounts();
  }
  // Nothing left in flight: every transfer waited for, every copy waited for.
  void ExpectIdle() const {
    EXPECT_EQ(port->unwaited(), 0u);
    EXPECT_EQ(port->dropped(), 0u);
    EXPECT_EQ(copier->outstanding(), 0);
  }

  EventLog log;
  FakeCopier* copier = nullptr;  // owned by staging
  std::unique_ptr<FakePort> port;
  std::unique_ptr<DeviceStaging> staging;
};

TEST(DeviceStagingFakeTest, PushOverlapsCopiesWithPushesAndReusesABufferOnlyAfterItsPush) {
  constexpr size_t kWidth = 3, kRows = 23;  // 64-byte buffers: 5 rows a part, 5 parts (the last of 3 rows)
  for (size_t buffers : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("buffers ", buffers));
    FakeRig rig(64, buffers);
    ASSERT_TRUE(rig.staging);
    ASSERT_EQ(rig.staging->RowsPerPart(kWidth), 5u);
    const std::vector<Key> keys = MakeKeys(kRows);
    const std::vector<float> device = MakeRows(kRows, kWidth);
    ASSERT_TRUE(rig.staging->PushFromDevice(kTable, keys, device.data(), kWidth).ok());
    rig.ExpectIdle();
    const std::vector<Event> ev = rig.log.events();
    const size_t parts = 5;
    EXPECT_EQ(Count(ev, Op::kCopyStart), parts) << Describe(ev);
    EXPECT_EQ(Count(ev, Op::kDone), parts) << Describe(ev);
    const std::vector<std::string> bad = CheckSchedule(ev, true, buffers);
    EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "; ") << "\n" << Describe(ev);
    // Overlap: part k+1's copy starts while part k's push is still in flight.
    for (size_t k = 0; k + 1 < parts; ++k) {
      EXPECT_LT(Position(ev, Op::kCopyStart, k + 1), Position(ev, Op::kDone, k)) << "part " << k << ": "
                                                                                  << Describe(ev);
    }
    // At most `buffers` pushes in flight, and the pipeline does use them all.
    EXPECT_EQ(rig.port->max_unfinished(), std::min(buffers, parts));

    // What the fake server holds is exactly what was pushed.
    std::vector<float> back(device.size(), kPoison);
    ASSERT_TRUE(rig.staging->PullToDevice(kTable, keys, back.data(), kWidth).ok());
    EXPECT_EQ(back, device);
  }
}

TEST(DeviceStagingFakeTest, OneBufferWaitsForEachPushBeforeTheNextCopy) {
  constexpr size_t kWidth = 3, kRows = 12;  // 3 parts of 5, 5, 2 rows
  FakeRig rig(64, 1);
  ASSERT_TRUE(rig.staging);
  const std::vector<Key> keys = MakeKeys(kRows);
  const std::vector<float> device = MakeRows(kRows, kWidth);
  ASSERT_TRUE(rig.staging->PushFromDevice(kTable, keys, device.data(), kWidth).ok());
  rig.ExpectIdle();
  const std::vector<Event> ev = rig.log.events();
  EXPECT_TRUE(CheckSchedule(ev, true, 1).empty()) << Describe(ev);
  for (size_t k = 0; k + 1 < 3; ++k) EXPECT_GT(Position(ev, Op::kCopyStart, k + 1), Position(ev, Op::kDone, k));
  EXPECT_EQ(rig.port->max_unfinished(), 1u);
  std::vector<float> back(device.size(), kPoison);
  ASSERT_TRUE(rig.staging->PullToDevice(kTable, keys, back.data(), kWidth).ok());
  EXPECT_EQ(back, device);
}

TEST(DeviceStagingFakeTest, PullKeepsSeveralPullsInFlightAndRefillsABufferOnlyAfterItsCopy) {
  constexpr size_t kWidth = 3, kRows = 38;  // 8 parts
  for (size_t buffers : {2, 3, 4}) {
    SCOPED_TRACE(absl::StrCat("buffers ", buffers));
    FakeRig rig(64, buffers);
    ASSERT_TRUE(rig.staging);
    const std::vector<Key> keys = MakeKeys(kRows);
    const std::vector<float> device = MakeRows(kRows, kWidth, 3);
    ASSERT_TRUE(rig.staging->PushFromDevice(kTable, keys, device.data(), kWidth).ok());

    rig.StartCall();
    std::vector<float> out(device.size() + 8, kPoison);  // 8 guard floats after the rows
    ASSERT_TRUE(rig.staging->PullToDevice(kTable, keys, out.data(), kWidth).ok());
    rig.ExpectIdle();
    const std::vector<Event> ev = rig.log.events();
    const size_t parts = 8;
    EXPECT_EQ(Count(ev, Op::kIssue), parts) << Describe(ev);
    EXPECT_EQ(Count(ev, Op::kCopyDone), parts) << Describe(ev);
    const std::vector<std::string> bad = CheckSchedule(ev, false, buffers);
    EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "; ") << "\n" << Describe(ev);
    // Several pulls in flight at once: the first `buffers` are issued before any completes.
    EXPECT_EQ(rig.port->max_unfinished(), std::min(buffers, parts));
    for (size_t k = 1; k < std::min(buffers, parts); ++k) {
      EXPECT_LT(Position(ev, Op::kIssue, k), Position(ev, Op::kDone, 0)) << Describe(ev);
    }
    // Overlap: part k's copy starts while part k+1's pull is still in flight.
    for (size_t k = 0; k + 1 < parts; ++k) {
      EXPECT_LT(Position(ev, Op::kCopyStart, k), Position(ev, Op::kDone, k + 1)) << "part " << k;
    }
    EXPECT_TRUE(std::equal(device.begin(), device.end(), out.begin()));
    for (size_t i = device.size(); i < out.size(); ++i) EXPECT_EQ(out[i], kPoison) << "guard " << i;
  }
}

TEST(DeviceStagingFakeTest, TransfersCompletingOnOtherThreadsKeepTheRulesAndTheValues) {
  constexpr size_t kWidth = 3, kRows = 203;  // 41 parts
  for (size_t buffers : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("buffers ", buffers));
    FakeRig rig(64, buffers, /*max_delay=*/2 * kMillis);
    ASSERT_TRUE(rig.staging);
    const std::vector<Key> keys = MakeKeys(kRows);
    const std::vector<float> a = MakeRows(kRows, kWidth, 1), b = MakeRows(kRows, kWidth, 2);
    for (const std::vector<float>* device : {&a, &b}) {
      rig.StartCall();
      ASSERT_TRUE(rig.staging->PushFromDevice(kTable, keys, device->data(), kWidth).ok());
      rig.ExpectIdle();
      EXPECT_LE(rig.port->max_unfinished(), buffers);
      const std::vector<std::string> bad = CheckSchedule(rig.log.events(), true, buffers);
      EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "; ");
    }
    rig.StartCall();
    std::vector<float> out(a.size(), kPoison);
    ASSERT_TRUE(rig.staging->PullToDevice(kTable, keys, out.data(), kWidth).ok());
    rig.ExpectIdle();
    EXPECT_LE(rig.port->max_unfinished(), buffers);
    const std::vector<std::string> bad = CheckSchedule(rig.log.events(), false, buffers);
    EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "; ");
    for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], a[i] + b[i]) << i;
  }
}

TEST(DeviceStagingFakeTest, AFailedPushIsReturnedNamingPartAndTableAndNothingStaysInFlight) {
  for (Nanos delay : {Nanos{0}, 1 * kMillis}) {
    SCOPED_TRACE(absl::StrCat("delay ", delay));
    FakeRig rig(64, 3, delay);
    ASSERT_TRUE(rig.staging);
    rig.port->fail[4] = absl::UnavailableError("server 1 did not answer");
    const std::vector<Key> keys = MakeKeys(50);  // 10 parts
    const std::vector<float> device = MakeRows(50, 3);
    absl::Status s = rig.staging->PushFromDevice(kTable, keys, device.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("push of part 5 of 10 (rows 20..24) to table 7"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("server 1 did not answer"));
    rig.ExpectIdle();
    // No new part after the failure was seen (when reclaiming its buffer, 3 parts later).
    EXPECT_LE(rig.port->issued(), 4u + 3u);
    const std::vector<std::string> bad = CheckSchedule(rig.log.events(), true, 3);
    EXPECT_TRUE(bad.empty()) << absl::StrJoin(bad, "; ");
    EXPECT_EQ(rig.staging->stats().failed_calls, 1u);
  }
}

TEST(DeviceStagingFakeTest, AFailedPullIsReturnedNamingPartAndTableAndNothingStaysInFlight) {
  FakeRig rig(64, 3);
  ASSERT_TRUE(rig.staging);
  rig.port->fail[2] = absl::DeadlineExceededError("server 0 did not answer");
  const std::vector<Key> keys = MakeKeys(50);
  std::vector<float> out(150, kPoison);
  absl::Status s = rig.staging->PullToDevice(kTable, keys, out.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("pull of part 3 of 10 (rows 10..14) from table 7"));
  rig.ExpectIdle();
  EXPECT_LE(rig.port->issued(), 2u + 3u);
  // Parts after the failed one were not copied into device memory.
  for (size_t i = 10 * 3; i < out.size(); ++i) ASSERT_EQ(out[i], kPoison) << i;
  EXPECT_TRUE(CheckSchedule(rig.log.events(), false, 3).empty()) << Describe(rig.log.events());
}

TEST(DeviceStagingFakeTest, TheFirstErrorIsTheOneReturned) {
  FakeRig rig(64, 4);
  ASSERT_TRUE(rig.staging);
  rig.port->fail[1] = absl::UnavailableError("first");
  rig.port->fail[2] = absl::InternalError("second");
  const std::vector<Key> keys = MakeKeys(50);
  const std::vector<float> device = MakeRows(50, 3);
  absl::Status s = rig.staging->PushFromDevice(kTable, keys, device.data(), 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("part 2 of 10"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("first"));
  rig.ExpectIdle();
}

TEST(DeviceStagingFakeTest, CopyFailuresAreReturnedAndStopThePipeline) {
  const std::vector<Key> keys = MakeKeys(50);  // 10 parts
  const std::vector<float> device = MakeRows(50, 3);
  {
    SCOPED_TRACE("push: a copy that fails when waited for");
    FakeRig rig(64, 3);
    ASSERT_TRUE(rig.staging);
    rig.copier->fail_wait = 3;
    absl::Status s = rig.staging->PushFromDevice(kTable, keys, device.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("copy of part 4 of 10 (rows 15..19) from device to staging (fake) for a push to table 7"));
    EXPECT_EQ(rig.port->issued(), 3u);  // part 4 was never pushed
    rig.ExpectIdle();
  }
  {
    SCOPED_TRACE("push: a copy that cannot start");
    FakeRig rig(64, 3);
    ASSERT_TRUE(rig.staging);
    rig.copier->fail_start = 2;
    absl::Status s = rig.staging->PushFromDevice(kTable, keys, device.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("part 3 of 10"));
    EXPECT_EQ(rig.port->issued(), 2u);
    rig.ExpectIdle();
  }
  {
    SCOPED_TRACE("pull: a copy that fails when waited for");
    FakeRig rig(64, 3);
    ASSERT_TRUE(rig.staging);
    rig.copier->fail_wait = 1;
    std::vector<float> out(150, kPoison);
    absl::Status s = rig.staging->PullToDevice(kTable, keys, out.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("copy of part 2 of 10 (rows 5..9) from staging to device (fake) for a pull from table 7"));
    EXPECT_LE(rig.port->issued(), 1u + 3u);
    rig.ExpectIdle();
  }
  {
    SCOPED_TRACE("pull: a copy that cannot start");
    FakeRig rig(64, 2);
    ASSERT_TRUE(rig.staging);
    rig.copier->fail_start = 0;
    std::vector<float> out(150, kPoison);
    absl::Status s = rig.staging->PullToDevice(kTable, keys, out.data(), 3);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("part 1 of 10"));
    EXPECT_EQ(rig.port->issued(), 2u);  // the first two pulls, both waited for
    rig.ExpectIdle();
  }
}

TEST(DeviceStagingFakeTest, StatsCountPartsBytesAndOverlappedCopyTime) {
  FakeRig rig(64, 3);
  ASSERT_TRUE(rig.staging);
  const std::vector<Key> keys = MakeKeys(23);  // 5 parts of width 3
  const std::vector<float> device = MakeRows(23, 3);
  std::vector<float> out(device.size());
  ASSERT_TRUE(rig.staging->PushFromDevice(kTable, keys, device.data(), 3).ok());
  ASSERT_TRUE(rig.staging->PullToDevice(kTable, keys, out.data(), 3).ok());
  ASSERT_TRUE(rig.staging->PullToDevice(kTable, {}, out.data(), 3).ok());
  EXPECT_FALSE(rig.staging->PushFromDevice(kTable, keys, device.data(), 0).ok());
  const DeviceStaging::Stats s = rig.staging->stats();
  EXPECT_EQ(s.pushes, 2u);
  EXPECT_EQ(s.pulls, 2u);
  EXPECT_EQ(s.failed_calls, 1u);
  EXPECT_EQ(s.parts_pushed, 5u);
  EXPECT_EQ(s.parts_pulled, 5u);
  EXPECT_EQ(s.bytes_to_host, 23u * 3 * 4);
  EXPECT_EQ(s.bytes_to_device, 23u * 3 * 4);
  EXPECT_EQ(s.copy_time, 10 * kFakeCopyNanos);
  // Every copy but the first of a push (nothing in flight yet) and the last
  // of a pull (nothing left in flight) ran while a transfer was in flight.
  EXPECT_EQ(s.copy_time_overlapped, 8 * kFakeCopyNanos);
  EXPECT_GT(s.wall, 0);
  EXPECT_GE(s.wall, s.copy_wait + s.transfer_wait);
}

TEST(DeviceStagingFakeTest, RejectsBadRequestsAndOptionsBeforeMovingAnything) {
  FakeRig rig(64, 2);
  ASSERT_TRUE(rig.staging);
  const std::vector<Key> keys = MakeKeys(4);
  std::vector<float> device(4 * 17, 1.0f);
  // A row of 17 floats (68 bytes) does not fit a 64-byte buffer.
  absl::Status s = rig.staging->PushFromDevice(kTable, keys, device.data(), 17);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("68 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("64 bytes"));
  s = rig.staging->PullToDevice(kTable, keys, device.data(), 17);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(rig.staging->PushFromDevice(kTable, keys, device.data(), 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(rig.staging->PushFromDevice(kTable, keys, nullptr, 3).code(), absl::StatusCode::kInvalidArgument);
  // An empty key list moves nothing, even without device memory.
  EXPECT_TRUE(rig.staging->PushFromDevice(kTable, {}, nullptr, 3).ok());
  EXPECT_TRUE(rig.staging->PullToDevice(kTable, {}, nullptr, 3).ok());
  EXPECT_TRUE(rig.log.events().empty()) << Describe(rig.log.events());
  EXPECT_EQ(rig.port->issued(), 0u);

  EventLog log;
  FakeCopier unused(log);
  FakePort port(log, unused);
  auto bad = DeviceStaging::Create(port, std::make_unique<HostCopier>(), {.staging_bytes = 64, .buffers = 0});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  bad = DeviceStaging::Create(port, std::make_unique<HostCopier>(), {.staging_bytes = 3, .buffers = 2});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  bad = DeviceStaging::Create(port, nullptr, {});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
}

TEST(HostCopierTest, CopiesBothWaysAndChecksBounds) {
  HostCopier c;
  ASSERT_TRUE(c.Allocate(2, 16).ok());
  ASSERT_EQ(c.buffer(1).size(), 4u);
  const float src[4] = {1, 2, 3, 4};
  ASSERT_TRUE(c.StartToHost(1, src, 4).ok());
  EXPECT_TRUE(c.Done(1));
  ASSERT_TRUE(c.Wait(1).ok());
  EXPECT_TRUE(std::equal(src, src + 4, c.buffer(1).begin()));
  float dst[4] = {};
  ASSERT_TRUE(c.StartToDevice(1, dst, 3).ok());
  ASSERT_TRUE(c.Wait(1).ok());
  EXPECT_EQ(dst[2], 3.0f);
  EXPECT_EQ(dst[3], 0.0f);
  EXPECT_FALSE(c.StartToHost(1, src, 5).ok());   // larger than the buffer
  EXPECT_FALSE(c.StartToHost(2, src, 1).ok());   // no such slot
  EXPECT_FALSE(c.StartToDevice(0, nullptr, 1).ok());
  EXPECT_FALSE(c.Allocate(1, 16).ok());          // once only
}

// ---------------------------------------------------------------------------
// The host copier and a real worker against an in-process cluster

class DeviceStagingClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = std::make_unique<InProcCluster>(ClusterOptions{.servers = 2, .workers = 1, .started_servers = 2});
    workers_ = Unwrap(cluster_->ConnectWorkers());
    ASSERT_EQ(workers_.size(), 1u);
  }
  void TearDown() override {
    if (workers_.empty()) return;
    absl::Status s = workers_[0]->Finish({});
    EXPECT_TRUE(s.ok()) << s;
  }
  Worker& worker() { return *workers_[0]; }

  std::unique_ptr<DeviceStaging> MakeStaging(DeviceStagingOptions o) {
    auto s = DeviceStaging::Create(worker(), std::make_unique<HostCopier>(), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // Pushes `rows` rows of `width` twice through staging, pulls them back
  // (keys in reverse order) and compares with twice the pushed values.
  void RoundTrip(uint32_t table, size_t width, size_t rows, DeviceStagingOptions o) {
    SCOPED_TRACE(absl::StrCat("table ", table, " width ", width, " rows ", rows, " staging ", o.staging_bytes,
                              " buffers ", o.buffers));
    ASSERT_TRUE(worker()
                    .CreateTable({.id = table, .width = static_cast<uint32_t>(width), .optimizer = proto::ACCUMULATE})
                    .ok());
    std::unique_ptr<DeviceStaging> staging = MakeStaging(o);
    ASSERT_TRUE(staging);
    const std::vector<Key> keys = MakeKeys(rows);
    const std::vector<float> device = MakeRows(rows, width, static_cast<int>(table));
    ASSERT_TRUE(staging->PushFromDevice(table, keys, device.data(), width).ok());
    ASSERT_TRUE(staging->PushFromDevice(table, keys, device.data(), width).ok());

    std::vector<Key> reversed(keys.rbegin(), keys.rend());
    std::vector<float> out(rows * width + 16, kPoison);  // 16 guard floats
    absl::Status s = staging->PullToDevice(table, reversed, out.data(), width);
    ASSERT_TRUE(s.ok()) << s;
    for (size_t i = 0; i < rows; ++i) {
      const size_t src = rows - 1 - i;
      for (size_t j = 0; j < width; ++j) {
        ASSERT_EQ(out[i * width + j], 2 * device[src * width + j]) << "row " << i << " element " << j;
      }
    }
    for (size_t i = rows * width; i < out.size(); ++i) ASSERT_EQ(out[i], kPoison) << "guard " << i;

    const size_t parts = PartsOf(rows, staging->RowsPerPart(width));
    const DeviceStaging::Stats st = staging->stats();
    EXPECT_EQ(st.parts_pushed, 2 * parts);
    EXPECT_EQ(st.parts_pulled, parts);
    EXPECT_EQ(st.bytes_to_host, 2 * rows * width * sizeof(float));
    EXPECT_EQ(st.bytes_to_device, rows * width * sizeof(float));
    EXPECT_EQ(st.failed_calls, 0u);
  }

  std::unique_ptr<InProcCluster> cluster_;
  std::vector<std::unique_ptr<Worker>> workers_;
};

TEST_F(DeviceStagingClusterTest, RowsThatDivideTheStagingBuffer) {
  // 256-byte buffers hold 64 floats: rows of 1, 4 and 16 floats fill them exactly.
  uint32_t table = 1;
  for (size_t width : {1, 4, 16}) RoundTrip(table++, width, 1000, {.staging_bytes = 256, .buffers = 3});
}

TEST_F(DeviceStagingClusterTest, RowsThatDoNotDivideTheStagingBuffer) {
  uint32_t table = 1;
  for (size_t width : {3, 5, 7, 9, 63}) RoundTrip(table++, width, 777, {.staging_bytes = 256, .buffers = 3});
  // A staging size that is not a whole number of floats either.
  RoundTrip(table++, 5, 301, {.staging_bytes = 250, .buffers = 2});
}

TEST_F(DeviceStagingClusterTest, ASinglePart) {
  RoundTrip(1, 4, 10, {});  // default 4 MiB buffers: one part
  RoundTrip(2, 8, 8, {.staging_bytes = 256, .buffers = 2});  // exactly one full buffer
}

TEST_F(DeviceStagingClusterTest, ManyMorePartsThanBuffers) {
  RoundTrip(1, 2, 333, {.staging_bytes = 64, .buffers = 2});  // 42 parts
  RoundTrip(2, 2, 333, {.staging_bytes = 64, .buffers = 4});
  RoundTrip(3, 2, 40, {.staging_bytes = 64, .buffers = 1});
}

TEST_F(DeviceStagingClusterTest, AnEmptyKeyListMovesNothing) {
  ASSERT_TRUE(worker().CreateTable({.id = 1, .width = 4, .optimizer = proto::ACCUMULATE}).ok());
  std::unique_ptr<DeviceStaging> staging = MakeStaging({.staging_bytes = 256});
  ASSERT_TRUE(staging);
  const WorkerStats before = worker().stats();
  std::vector<float> out(4, kPoison);
  EXPECT_TRUE(staging->PushFromDevice(1, {}, out.data(), 4).ok());
  EXPECT_TRUE(staging->PullToDevice(1, {}, out.data(), 4).ok());
  for (float v : out) EXPECT_EQ(v, kPoison);
  EXPECT_EQ(worker().stats().pushes, before.pushes);
  EXPECT_EQ(worker().stats().pulls, before.pulls);
  EXPECT_EQ(staging->stats().parts_pushed + staging->stats().parts_pulled, 0u);
}

TEST_F(DeviceStagingClusterTest, AWorkerErrorNamesThePartAndTheTableAndTheStagingStaysUsable) {
  std::unique_ptr<DeviceStaging> staging = MakeStaging({.staging_bytes = 64, .buffers = 2});
  ASSERT_TRUE(staging);
  const std::vector<Key> keys = MakeKeys(20);
  const std::vector<float> device = MakeRows(20, 4);
  // Table 99 does not exist.
  absl::Status s = staging->PushFromDevice(99, keys, device.data(), 4);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("push of part 1 of 5 (rows 0..3) to table 99"));
  std::vector<float> out(device.size());
  s = staging->PullToDevice(99, keys, out.data(), 4);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("from table 99"));
  // A row size that is not the table's width: the worker's own error.
  ASSERT_TRUE(worker().CreateTable({.id = 1, .width = 4, .optimizer = proto::ACCUMULATE}).ok());
  s = staging->PushFromDevice(1, std::span<const Key>(keys).first(15), device.data(), 5);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("table 1"));
  EXPECT_EQ(staging->stats().failed_calls, 3u);
  // Nothing was left behind: the same staging works afterwards.
  ASSERT_TRUE(staging->PushFromDevice(1, keys, device.data(), 4).ok());
  ASSERT_TRUE(staging->PullToDevice(1, keys, out.data(), 4).ok());
  EXPECT_EQ(out, device);
}

TEST_F(DeviceStagingClusterTest, CallsFromSeveralThreadsShareTheBuffersSafely) {
  constexpr size_t kWidth = 6, kRows = 200, kThreads = 3, kRounds = 4;
  ASSERT_TRUE(worker().CreateTable({.id = 1, .width = kWidth, .optimizer = proto::ACCUMULATE}).ok());
  std::unique_ptr<DeviceStaging> staging = MakeStaging({.staging_bytes = 512, .buffers = 3});
  ASSERT_TRUE(staging);
  const std::vector<Key> keys = MakeKeys(kRows);
  std::vector<std::vector<float>> device;
  for (size_t t = 0; t < kThreads; ++t) device.push_back(MakeRows(kRows, kWidth, static_cast<int>(t)));
  std::vector<std::future<absl::Status>> done;
  for (size_t t = 0; t < kThreads; ++t) {
    done.push_back(std::async(std::launch::async, [&, t]() -> absl::Status {
      for (size_t r = 0; r < kRounds; ++r) {
        if (absl::Status s = staging->PushFromDevice(1, keys, device[t].data(), kWidth); !s.ok()) return s;
      }
      return absl::OkStatus();
    }));
  }
  for (auto& f : done) ASSERT_TRUE(f.get().ok());
  std::vector<float> out(kRows * kWidth);
  ASSERT_TRUE(staging->PullToDevice(1, keys, out.data(), kWidth).ok());
  for (size_t i = 0; i < out.size(); ++i) {
    float expected = 0;
    for (size_t t = 0; t < kThreads; ++t) expected += kRounds * device[t][i];
    ASSERT_EQ(out[i], expected) << i;
  }
  EXPECT_EQ(staging->stats().pushes, kThreads * kRounds);
}

}  // namespace
}  // namespace tessera
