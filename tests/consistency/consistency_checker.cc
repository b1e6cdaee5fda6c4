#include "tests/consistency/consistency_checker.h"

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/clock.h"

namespace tessera::consistency {

int64_t NowNs() { return MonotonicNow(); }

void Recorder::Add(PushEvent e) { std::lock_guard l(mu_); pushes_.push_back(std::move(e)); }
void Recorder::Add(PullEvent e) { std::lock_guard l(mu_); pulls_.push_back(std::move(e)); }
void Recorder::Add(ClockEvent e) { std::lock_guard l(mu_); clocks_.push_back(e); }
void Recorder::Add(FinishEvent e) { std::lock_guard l(mu_); finishes_.push_back(e); }
void Recorder::Add(JoinEvent e) { std::lock_guard l(mu_); joins_.push_back(e); }
std::vector<PushEvent> Recorder::pushes() const { std::lock_guard l(mu_); return pushes_; }
std::vector<PullEvent> Recorder::pulls() const { std::lock_guard l(mu_); return pulls_; }
std::vector<ClockEvent> Recorder::clocks() const { std::lock_guard l(mu_); return clocks_; }
std::vector<FinishEvent> Recorder::finishes() const { std::lock_guard l(mu_); return finishes_; }
std::vector<JoinEvent> Recorder::joins() const { std::lock_guard l(mu_); return joins_; }

namespace {
template <typename T>
void WriteList(std::ostream& o, const std::vector<T>& v) {
  o << v.size();
  for (const T& x : v) o << ' ' << x;
}
template <typename T>
void ReadList(std::istream& i, std::vector<T>& v) {
  size_t n = 0;
  i >> n;
  v.resize(n);
  for (T& x : v) i >> x;
}
}  // namespace

// Format, one event per line:
//   push W CLOCK ISSUED KEYS...      pull W CLOCK ISSUED COMPLETED KEYS... VALUES...
//   clock W NEW CALLED RETURNED      finish W FINISHED
absl::Status Recorder::WriteTo(const std::string& path) const {
  std::ofstream o(path);
  if (!o) return absl::InternalError("cannot write " + path);
  std::lock_guard l(mu_);
  o.precision(9);
  for (const auto& e : pushes_) {
    o << "push " << e.worker << ' ' << e.clock << ' ' << e.issued_ns << ' ';
    WriteList(o, e.keys);
    o << '\n';
  }
  for (const auto& e : pulls_) {
    o << "pull " << e.worker << ' ' << e.clock << ' ' << e.issued_ns << ' ' << e.completed_ns << ' ';
    WriteList(o, e.keys);
    o << ' ';
    WriteList(o, e.values);
    o << '\n';
  }
  for (const auto& e : clocks_)
    o << "clock " << e.worker << ' ' << e.new_clock << ' ' << e.called_ns << ' ' << e.returned_ns << '\n';
  for (const auto& e : finishes_) o << "finish " << e.worker << ' ' << e.finished_ns << '\n';
  return o.good() ? absl::OkStatus() : absl::InternalError("error writing " + path);
}

absl::Status Recorder::ReadFrom(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError("cannot read " + path);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    std::istringstream i(line);
    std::string kind;
    i >> kind;
    if (kind == "push") {
      PushEvent e;
      i >> e.worker >> e.clock >> e.issued_ns;
      ReadList(i, e.keys);
      if (i.fail()) return absl::DataLossError(absl::StrCat(path, ":", n, ": bad push line"));
      Add(std::move(e));
    } else if (kind == "pull") {
      PullEvent e;
      i >> e.worker >> e.clock >> e.issued_ns >> e.completed_ns;
      ReadList(i, e.keys);
      ReadList(i, e.values);
      if (i.fail()) return absl::DataLossError(absl::StrCat(path, ":", n, ": bad pull line"));
      Add(std::move(e));
    } else if (kind == "clock") {
      ClockEvent e;
      i >> e.worker >> e.new_clock >> e.called_ns >> e.returned_ns;
      if (i.fail()) return absl::DataLossError(absl::StrCat(path, ":", n, ": bad clock line"));
      Add(e);
    } else if (kind == "finish") {
      FinishEvent e;
      i >> e.worker >> e.finished_ns;
      if (i.fail()) return absl::DataLossError(absl::StrCat(path, ":", n, ": bad finish line"));
      Add(e);
    } else if (!kind.empty()) {
      return absl::DataLossError(absl::StrCat(path, ":", n, ": unknown event '", kind, "'"));
    }
  }
  return absl::OkStatus();
}

absl::Status RunWorkload(Worker& w, const WorkloadOptions& o, Recorder& rec) {
  const uint32_t W = w.num_workers(), me = w.rank();
  TableOptions t{.id = o.table_id, .name = "consistency", .width = W, .kind = proto::SPARSE,
                 .optimizer = proto::ACCUMULATE, .consistency = o.consistency, .staleness = o.staleness};
  if (auto s = w.CreateTable(t); !s.ok()) return s;
  if (auto s = w.Barrier("consistency-start"); !s.ok()) return s;
  std::mt19937_64 rng(o.seed * 1000003 + me);
  auto subset = [&] {
    std::vector<uint32_t> keys;
    for (uint32_t k = 0; k < o.num_keys; ++k)
      if (rng() % 3 == 0) keys.push_back(k);
    if (keys.empty()) keys.push_back(static_cast<uint32_t>(rng() % o.num_keys));
    return keys;
  };
  for (uint32_t c = 0; c < o.clocks; ++c) {
    const uint64_t clock = w.clock();
    // Pushes: each stays alive until its future is ready (zero-copy sends).
    int pushes = 1 + static_cast<int>(rng() % 3);
    for (int p = 0; p < pushes; ++p) {
      std::vector<uint32_t> keys32 = subset();
      std::vector<Key> keys(keys32.begin(), keys32.end());
      std::vector<float> values(keys.size() * W, 0.0f);
      for (size_t i = 0; i < keys.size(); ++i) values[i * W + me] = 1.0f;
      rec.Add(PushEvent{me, clock, keys32, NowNs()});
      if (auto s = w.Push(o.table_id, keys, values).Wait(); !s.ok()) return s;
    }
    // A pull at this clock.
    std::vector<uint32_t> keys32 = subset();
    std::vector<Key> keys(keys32.begin(), keys32.end());
    std::vector<float> out(keys.size() * W);
    int64_t issued = NowNs();
    if (auto s = w.Pull(o.table_id, keys, out).Wait(); !s.ok()) return s;
    rec.Add(PullEvent{me, clock, keys32, out, issued, NowNs()});
    uint32_t sleep = o.max_sleep_us ? static_cast<uint32_t>(rng() % o.max_sleep_us) : 0;
    if (me == 0) sleep *= 3;
    std::this_thread::sleep_for(std::chrono::microseconds(sleep));
    int64_t called = NowNs();
    if (auto s = w.Clock(); !s.ok()) return s;
    rec.Add(ClockEvent{me, w.clock(), called, NowNs()});
    if (o.on_clock) o.on_clock(w.clock());
  }
  rec.Add(FinishEvent{me, NowNs()});
  return absl::OkStatus();
}

CheckResult Check(const Recorder& rec, uint32_t W, uint64_t s, uint32_t initial_workers) {
  CheckResult r;
  auto pushes = rec.pushes();
  auto clocks = rec.clocks();
  auto finishes = rec.finishes();
  auto joins = rec.joins();
  auto violation = [&](uint64_t& counter, std::string text) {
    ++counter;
    if (r.violations.size() < 10) r.violations.push_back(std::move(text));
  };
  // Per (worker, key): push timestamps, clocks and whether each may be
  // missing, sorted by time.
  std::vector<std::vector<std::vector<std::tuple<int64_t, uint64_t, bool>>>> by(W);
  uint32_t max_key = 0;
  for (const auto& p : pushes)
    for (uint32_t k : p.keys) max_key = std::max(max_key, k + 1);
  for (auto& v : by) v.resize(max_key);
  for (const auto& p : pushes)
    for (uint32_t k : p.keys) by[p.worker][k].push_back({p.issued_ns, p.clock, p.may_be_missing});
  for (auto& v : by)
    for (auto& list : v) std::sort(list.begin(), list.end());

  for (const auto& pull : rec.pulls()) {
    ++r.pulls_checked;
    for (size_t i = 0; i < pull.keys.size(); ++i) {
      const uint32_t k = pull.keys[i];
      for (uint32_t v = 0; v < W; ++v) {
        const float got = pull.values[i * W + v];
        uint64_t stamped_old = 0, issued_before_done = 0, own_before = 0;
        if (k < max_key) {
          for (const auto& [t, c, may_be_missing] : by[v][k]) {
            if (t < pull.completed_ns) ++issued_before_done;
            if (may_be_missing) continue;
            if (s != kUnbounded && c + s + 1 <= pull.clock) ++stamped_old;  // c <= pull.clock - s - 1
            if (v == pull.worker && t < pull.issued_ns) ++own_before;
          }
        }
        std::string where = absl::StrCat("pull by worker ", pull.worker, " at clock ", pull.clock, ", key ", k,
                                         ", column of worker ", v, ": ", got);
        if (got < static_cast<float>(stamped_old))
          violation(r.i2, absl::StrCat("I2 ", where, " < ", stamped_old, " pushes stamped <= clock - s - 1"));
        if (v == pull.worker && got < static_cast<float>(own_before))
          violation(r.i3, absl::StrCat("I3 ", where, " < ", own_before, " of its own earlier pushes"));
        if (got > static_cast<float>(issued_before_done))
          violation(r.i4, absl::StrCat("I4 ", where, " > ", issued_before_done, " pushes issued"));
      }
    }
  }
  if (s != kUnbounded) {
    for (const auto& ce : clocks) {
      if (ce.returned_ns == kNotReturned) continue;
      ++r.clocks_checked;
      if (ce.new_clock <= s) continue;
      const uint64_t need = ce.new_clock - s;
      for (uint32_t v = 0; v < W; ++v) {
        if (v == ce.worker) continue;
        bool finished = false;
        for (const auto& f : finishes) finished |= f.worker == v && f.finished_ns < ce.returned_ns;
        uint64_t reached = 0;
        if (v >= initial_workers) {  // joined the running job: waited for from its join on
          bool joined = false;
          for (const auto& j : joins) {
            if (j.worker == v && j.joined_ns < ce.returned_ns) {
              joined = true;
              reached = std::max(reached, j.clock);
            }
          }
          if (!joined) continue;
        }
        for (const auto& other : clocks)
          if (other.worker == v && other.called_ns < ce.returned_ns) reached = std::max(reached, other.new_clock);
        if (!finished && reached < need) {
          violation(r.i1, absl::StrCat("I1 worker ", ce.worker, " returned from Clock() to ", ce.new_clock,
                                       " while worker ", v, " had announced only clock ", reached, " (needs ", need,
                                       ")"));
        }
      }
    }
  }
  return r;
}

}  // namespace tessera::consistency
