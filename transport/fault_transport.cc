#include "transport/fault_transport.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/keys.h"
#include "common/logging.h"

namespace tessera {
namespace {

constexpr absl::string_view kAcceptedFields =
    "accepted fields: seed=N, drop=P, dup=P, reorder=P, reorder_ms=LO-HI, delay_ms=LO-HI, "
    "cut=A|B (repeatable), only=SUBSTRING, side=send|recv|both "
    "(P is a probability in [0,1]; LO-HI are whole milliseconds, at most 60000)";
constexpr uint32_t kMaxMillis = 60'000;
constexpr std::array<std::string_view, 9> kFieldNames = {"seed",     "drop", "dup",  "reorder", "reorder_ms",
                                                         "delay_ms", "cut",  "only", "side"};
bool IsFieldName(std::string_view name) {
  return std::find(kFieldNames.begin(), kFieldNames.end(), name) != kFieldNames.end();
}

absl::string_view AbslView(std::string_view s) { return absl::string_view(s.data(), s.size()); }
bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

absl::Status FieldError(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bad fault spec field '", field, "': ", why, "; ", kAcceptedFields));
}

// A probability: a number in [0,1] (NaN fails the range check).
bool ParseProbability(absl::string_view text, double* out) {
  double p = 0;
  if (!absl::SimpleAtod(text, &p) || !(p >= 0.0 && p <= 1.0)) return false;
  *out = p;
  return true;
}

// "LO-HI" or "N" in whole milliseconds, LO <= HI <= kMaxMillis.
bool ParseMillisRange(absl::string_view text, uint32_t* lo, uint32_t* hi) {
  const size_t dash = text.find('-');
  absl::string_view first = text.substr(0, dash);
  absl::string_view second = dash == absl::string_view::npos ? first : text.substr(dash + 1);
  uint32_t a = 0, b = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(first), &a) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(second), &b) || a > b || b > kMaxMillis) {
    return false;
  }
  *lo = a;
  *hi = b;
  return true;
}

// The shortest text that parses back to exactly `p`.
std::string DoubleText(double p) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), p);
  return ec == std::errc() ? std::string(buf, end) : absl::StrCat(p);
}

std::string RangeText(uint32_t lo, uint32_t hi) { return absl::StrCat(lo, "-", hi); }

// FNV-1a: a string hash that is the same in every process and every run
// (absl::Hash and std::hash are not promised to be).
uint64_t StableHash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ULL;
  }
  return Mix64(h);
}

// A uniform double in [0, 1) from 64 random bits.
double Unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A uniform time in [lo_ms, hi_ms] milliseconds.
Nanos UniformMillis(uint64_t bits, uint32_t lo_ms, uint32_t hi_ms) {
  const double span = static_cast<double>(hi_ms - lo_ms) * static_cast<double>(kMillis);
  return static_cast<Nanos>(lo_ms) * kMillis + static_cast<Nanos>(Unit(bits) * span);
}

// One independent draw per kind of fault.
enum Draw : uint64_t { kDrawDrop = 1, kDrawDup, kDrawDelay, kDrawReorder, kDrawHold };

bool AppliesAt(FaultSpec::Side side, FaultStage stage) {
  if (side == FaultSpec::Side::kBoth) return true;
  return (side == FaultSpec::Side::kSend) == (stage == FaultStage::kSend);
}

}  // namespace

// ---- FaultSpec ----

absl::StatusOr<FaultSpec> FaultSpec::Parse(std::string_view text) {
  FaultSpec spec;
  absl::flat_hash_set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(AbslView(text), ',')) {
    const absl::string_view item = absl::StripAsciiWhitespace(raw);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) return FieldError(item, "expected NAME=VALUE");
    const std::string name(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const absl::string_view value = absl::StripAsciiWhitespace(item.substr(eq + 1));
    if (!IsFieldName(name)) return FieldError(item, absl::StrCat("unknown field '", name, "'"));
    if (name != "cut" && !seen.insert(name).second) {
      return FieldError(item, absl::StrCat(name, " is given twice (only cut may repeat)"));
    }
    if (name == "seed") {
      if (!absl::SimpleAtoi(value, &spec.seed)) return FieldError(item, "seed must be an unsigned 64-bit integer");
    } else if (name == "drop" || name == "dup" || name == "reorder") {
      double* target = name == "drop" ? &spec.drop : name == "dup" ? &spec.dup : &spec.reorder;
      if (!ParseProbability(value, target)) {
        return FieldError(item, absl::StrCat(name, " must be a probability in [0,1]"));
      }
    } else if (name == "delay_ms" || name == "reorder_ms") {
      const bool delay = name == "delay_ms";
      if (!ParseMillisRange(value, delay ? &spec.delay_min_ms : &spec.reorder_min_ms,
                            delay ? &spec.delay_max_ms : &spec.reorder_max_ms)) {
        return FieldError(item, absl::StrCat(name, " must be LO-HI or N in whole milliseconds, LO <= HI <= ",
                                             kMaxMillis));
      }
      if (!delay && spec.reorder_max_ms == 0) {
        return FieldError(item, "reorder_ms must allow a hold above 0 (HI >= 1)");
      }
    } else if (name == "cut") {
      const std::vector<absl::string_view> ends = absl::StrSplit(value, '|');
      if (ends.size() != 2) return FieldError(item, "cut must name two endpoints as A|B");
      Cut cut{std::string(absl::StripAsciiWhitespace(ends[0])), std::string(absl::StripAsciiWhitespace(ends[1]))};
      if (cut.a.empty() || cut.b.empty()) return FieldError(item, "cut endpoints must not be empty");
      if (cut.a == cut.b) return FieldError(item, "cut endpoints must differ");
      spec.cuts.push_back(std::move(cut));
    } else if (name == "only") {
      if (value.empty()) return FieldError(item, "only must name an address substring");
      spec.only = std::string(value);
    } else if (name == "side") {
      if (value == "send") {
        spec.side = Side::kSend;
      } else if (value == "recv") {
        spec.side = Side::kReceive;
      } else if (value == "both") {
        spec.side = Side::kBoth;
      } else {
        return FieldError(item, "side must be send, recv or both");
      }
    }
  }
  return spec;
}

std::string FaultSpec::ToString() const {
  const FaultSpec defaults;
  std::string out = absl::StrCat("seed=", seed);
  if (drop != 0) absl::StrAppend(&out, ",drop=", DoubleText(drop));
  if (dup != 0) absl::StrAppend(&out, ",dup=", DoubleText(dup));
  if (reorder != 0) absl::StrAppend(&out, ",reorder=", DoubleText(reorder));
  if (reorder_min_ms != defaults.reorder_min_ms || reorder_max_ms != defaults.reorder_max_ms) {
    absl::StrAppend(&out, ",reorder_ms=", RangeText(reorder_min_ms, reorder_max_ms));
  }
  if (delay_min_ms != defaults.delay_min_ms || delay_max_ms != defaults.delay_max_ms) {
    absl::StrAppend(&out, ",delay_ms=", RangeText(delay_min_ms, delay_max_ms));
  }
  for (const Cut& cut : cuts) absl::StrAppend(&out, ",cut=", cut.a, "|", cut.b);
  if (!only.empty()) absl::StrAppend(&out, ",only=", only);
  if (side == Side::kSend) absl::StrAppend(&out, ",side=send");
  if (side == Side::kReceive) absl::StrAppend(&out, ",side=recv");
  return out;
}

// ---- FaultDecider ----

FaultDecider::FaultDecider(FaultSpec spec, std::string own_address)
    : spec_(std::move(spec)), own_address_(std::move(own_address)) {
  for (const FaultSpec::Cut& cut : spec_.cuts) {
    if (Contains(own_address_, cut.a)) cut_peers_.push_back(cut.b);
    if (Contains(own_address_, cut.b)) cut_peers_.push_back(cut.a);
  }
  const uint64_t own = StableHash(own_address_);
  stage_keys_[0] = Mix64(Mix64(spec_.seed ^ 0x5eedc0de5e4d0001ULL) ^ own);
  stage_keys_[1] = Mix64(Mix64(spec_.seed ^ 0x5eedc0de4ecf0002ULL) ^ own);
}

bool FaultDecider::IsCut(std::string_view peer) const {
  for (const std::string& p : cut_peers_) {
    if (Contains(peer, p)) return true;
  }
  return false;
}

FaultDecision FaultDecider::Decide(FaultStage stage, std::string_view peer, uint64_t counter) const {
  FaultDecision d;
  if (!AppliesAt(spec_.side, stage)) return d;
  if (IsCut(peer)) {
    d.cut = true;
    return d;
  }
  if (!spec_.only.empty() && !Contains(peer, spec_.only)) return d;

  const uint64_t link = Mix64(stage_keys_[stage == FaultStage::kSend ? 0 : 1] ^ StableHash(peer));
  const uint64_t message = Mix64(link + counter * 0x9e3779b97f4a7c15ULL);
  auto draw = [message](Draw which) { return Mix64(message ^ (which * 0xd1b54a32d192ed03ULL)); };

  if (Unit(draw(kDrawDrop)) < spec_.drop) {
    d.drop = true;
    return d;
  }
  d.duplicate = Unit(draw(kDrawDup)) < spec_.dup;
  if (spec_.delay_max_ms > 0) d.delay = UniformMillis(draw(kDrawDelay), spec_.delay_min_ms, spec_.delay_max_ms);
  if (Unit(draw(kDrawReorder)) < spec_.reorder) {
    d.hold = std::max<Nanos>(1, UniformMillis(draw(kDrawHold), spec_.reorder_min_ms, spec_.reorder_max_ms));
  }
  return d;
}

// ---- FaultTransport ----

class FaultTransport::Impl : public std::enable_shared_from_this<Impl> {
 public:
  Impl(std::unique_ptr<Transport> inner, FaultSpec spec) : inner_(std::move(inner)), spec_(std::move(spec)) {}

  absl::Status Start(Handler handler);
  const std::string& address() const { return inner_->address(); }
  absl::Status Send(const std::string& to, Message message);
  void Stop();
  TransportStats stats() const { return inner_->stats(); }
  void SetLinkHandler(Transport::LinkHandler handler) { inner_->SetLinkHandler(std::move(handler)); }
  bool LendsTo(const std::string& to, size_t bytes) const { return inner_->LendsTo(to, bytes); }
  bool SameHostPath(const std::string& peer) const { return inner_->SameHostPath(peer); }
  void Flush() { inner_->Flush(); }
  PeerBacklog Backlog(const std::string& to) const { return inner_->Backlog(to); }
  ForgetResult Forget(const std::string& to, std::chrono::milliseconds max_wait);
  Transport& inner() const { return *inner_; }
  FaultStats fault_stats() const {
    std::lock_guard lock(mu_);
    return fault_stats_;
  }
  const FaultSpec& spec() const { return spec_; }

 private:
  using Clock = std::chrono::steady_clock;

  // A message waiting on the delivery thread: to be sent to `peer` (send
  // stage) or handed to the handler (receive stage, from `peer`).
  struct Held {
    FaultStage stage;
    std::string peer;  // with `stage`, names the link: the key into links_[stage]
    Message message;
    bool in_order;  // counted in the link's held_in_order (not held back by reorder)
  };
  // Per direction and peer.
  struct Link {
    uint64_t counter = 0;        // messages this stage has seen on the link
    Clock::time_point last_due;  // latest due time of an order-keeping held message
    uint64_t held_in_order = 0;  // order-keeping messages still held
  };

  // Applies `d` to `message` at `stage`; for the send stage, returns the
  // messages to pass to the inner transport now (nothing else is returned:
  // everything later goes through the delivery thread).
  std::vector<Message> Admit(FaultStage stage, const std::string& peer, Link& link, const FaultDecision& d,
                             Message message) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Hold(Clock::time_point due, Held held) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnReceive(Message message);
  void DeliveryLoop();
  void Run(Held& held);

  const std::unique_ptr<Transport> inner_;
  const FaultSpec spec_;
  Handler handler_;  // written by Start before the delivery thread exists

  mutable std::mutex mu_;
  std::condition_variable cv_;
  // Set once by Start, before running_; read after checking running_.
  std::optional<FaultDecider> decider_ ABSL_GUARDED_BY(mu_);
  bool starting_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool inner_stop_claimed_ ABSL_GUARDED_BY(mu_) = false;
  bool inner_stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool loop_exited_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mu_);
  std::thread::id delivery_id_ ABSL_GUARDED_BY(mu_);
  // Invariants: held_ is ordered by (due time, arrival), so messages with
  // equal due times leave in arrival order. For every link,
  // held_in_order counts its held messages with Held::in_order (also the one
  // the delivery thread is sending or delivering right now), and
  // their due times never decrease in arrival order (a new one is due no
  // earlier than last_due); hence a link's order-keeping messages leave in
  // the order they came.
  std::map<std::pair<Clock::time_point, uint64_t>, Held> held_ ABSL_GUARDED_BY(mu_);
  uint64_t next_arrival_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, Link> links_[2] ABSL_GUARDED_BY(mu_);  // [kSend], [kReceive]
  FaultStats fault_stats_ ABSL_GUARDED_BY(mu_);
  uint64_t late_send_failures_ = 0;  // delivery thread only
};

absl::Status FaultTransport::Impl::Start(Handler handler) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return absl::FailedPreconditionError("fault transport was stopped; it cannot start again");
    if (running_ || starting_) return absl::FailedPreconditionError("fault transport already started");
    starting_ = true;
  }
  handler_ = std::move(handler);
  absl::Status status = inner_->Start([this](Message m) { OnReceive(std::move(m)); });
  std::lock_guard lock(mu_);
  starting_ = false;
  if (!status.ok()) return status;
  if (stopping_) return absl::FailedPreconditionError("fault transport was stopped while starting");
  decider_.emplace(spec_, inner_->address());
  running_ = true;
  thread_ = std::thread([self = shared_from_this()] { self->DeliveryLoop(); });
  delivery_id_ = thread_.get_id();
  cv_.notify_all();  // OnReceive may be waiting for running_
  return absl::OkStatus();
}

// A held message carries its bytes as they were when it was handed over, as
// a wire would: frames borrowed from the sender (a worker's push from the
// caller's memory, which it may reuse once the push is acknowledged, maybe
// through a copy that was not held) and transient frames (a ring its
// transport wants back soon) are copied. Owned and remote frames are kept.
static void KeepBytes(Message& message) {
  for (Buffer& f : message.frames) {
    if (!f.empty() && !f.remote() && (f.owner() == nullptr || f.transient())) f = Buffer::CopyOf(f.data(), f.size());
  }
}

void FaultTransport::Impl::Hold(Clock::time_point due, Held held) {
  KeepBytes(held.message);
  held_.emplace(std::make_pair(due, next_arrival_++), std::move(held));
  cv_.notify_all();
}

std::vector<Message> FaultTransport::Impl::Admit(FaultStage stage, const std::string& peer, Link& link,
                                                 const FaultDecision& d, Message message) {
  std::vector<Message> now_out;
  if (d.cut) {
    fault_stats_.cut++;
    return now_out;
  }
  if (d.drop) {
    fault_stats_.dropped++;
    return now_out;
  }
  std::vector<Message> copies;
  if (d.duplicate) {
    fault_stats_.duplicated++;
    copies.push_back(message);  // shares the frames
  }
  copies.push_back(std::move(message));
  if (d.delay > 0) fault_stats_.delayed++;
  if (d.hold > 0) fault_stats_.reordered++;

  const Clock::time_point now = Clock::now();
  // Order-keeping due time: after the delay, and not before the link's last
  // held message.
  Clock::time_point due = now + std::chrono::nanoseconds(d.delay);
  if (link.held_in_order > 0) due = std::max(due, link.last_due);

  if (d.hold > 0) {
    // Held back outside the link's order, so later messages overtake it.
    for (Message& m : copies) {
      Hold(due + std::chrono::nanoseconds(d.hold), Held{stage, peer, std::move(m), /*in_order=*/false});
    }
    return now_out;
  }
  if (stage == FaultStage::kSend && d.delay == 0 && link.held_in_order == 0) return copies;  // straight through
  // Everything received goes through the delivery thread, so that the
  // handler runs on one thread only.
  link.last_due = due;
  for (Message& m : copies) {
    link.held_in_order++;
    Hold(due, Held{stage, peer, std::move(m), /*in_order=*/true});
  }
  return now_out;
}

absl::Status FaultTransport::Impl::Send(const std::string& to, Message message) {
  std::vector<Message> now_out;
  {
    std::lock_guard lock(mu_);
    if (!running_ || stopping_) return absl::FailedPreconditionError("fault transport is not running");
    Link& link = links_[static_cast<int>(FaultStage::kSend)][to];
    const FaultDecision d = decider_->Decide(FaultStage::kSend, to, link.counter++);
    now_out = Admit(FaultStage::kSend, to, link, d, std::move(message));
  }
  absl::Status first_error;
  for (Message& m : now_out) {
    absl::Status s = inner_->Send(to, std::move(m));
    if (first_error.ok()) first_error = s;
  }
  return first_error;
}

void FaultTransport::Impl::OnReceive(Message message) {
  // Runs on the inner transport's delivery thread.
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return running_ || stopping_; });  // a message may beat the end of Start
  if (stopping_) return;
  const std::string peer = message.header.sender_address();
  Link& link = links_[static_cast<int>(FaultStage::kReceive)][peer];
  const FaultDecision d = decider_->Decide(FaultStage::kReceive, peer, link.counter++);
  Admit(FaultStage::kReceive, peer, link, d, std::move(message));
}

void FaultTransport::Impl::Run(Held& held) {
  if (held.stage == FaultStage::kReceive) {
    try {
      handler_(std::move(held.message));
    } catch (const std::exception& e) {
      TLOG_ERROR("{}: message handler threw: {}", inner_->address(), e.what());
    } catch (...) {
      TLOG_ERROR("{}: message handler threw a non-standard exception", inner_->address());
    }
    return;
  }
  absl::Status s = inner_->Send(held.peer, std::move(held.message));
  if (!s.ok() && std::has_single_bit(++late_send_failures_)) {
    TLOG_WARN("{}: delayed send to {} failed: {} ({} such failures so far)", inner_->address(), held.peer,
              s.message(), late_send_failures_);
  }
}

void FaultTransport::Impl::DeliveryLoop() {
  std::unique_lock lock(mu_);
  for (;;) {
    if (stopping_) break;
    if (held_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const Clock::time_point due = held_.begin()->first.first;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    Held held = std::move(held_.extract(held_.begin()).mapped());
    lock.unlock();
    Run(held);
    lock.lock();
    if (held.in_order) {
      auto& links = links_[static_cast<int>(held.stage)];
      if (auto it = links.find(held.peer); it != links.end() && it->second.held_in_order > 0) {
        it->second.held_in_order--;
      }
    }
  }
  loop_exited_ = true;
  cv_.notify_all();
}

ForgetResult FaultTransport::Impl::Forget(const std::string& to, std::chrono::milliseconds max_wait) {
  std::vector<Held> dropped;  // let go outside the lock
  {
    std::lock_guard lock(mu_);
    auto& links = links_[static_cast<int>(FaultStage::kSend)];
    auto link = links.find(to);
    for (auto it = held_.begin(); it != held_.end();) {
      Held& held = it->second;
      if (held.stage != FaultStage::kSend || held.peer != to) {
        ++it;
        continue;
      }
      if (held.in_order && link != links.end() && link->second.held_in_order > 0) link->second.held_in_order--;
      dropped.push_back(std::move(held));
      it = held_.erase(it);
    }
  }
  uint64_t frames = 0;
  for (const Held& held : dropped) {
    for (const Buffer& f : held.message.frames) frames += f.empty() ? 0 : 1;
  }
  const uint64_t messages = dropped.size();
  dropped.clear();
  ForgetResult result = inner_->Forget(to, max_wait);
  result.messages_dropped += messages;
  result.frames_pending += frames;
  return result;
}

void FaultTransport::Impl::Stop() {
  std::thread to_join;
  bool stop_inner = false;
  bool on_delivery_thread = false;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    held_.clear();  // dropped, never delivered
    on_delivery_thread = running_ && delivery_id_ == std::this_thread::get_id();
    if (thread_.joinable()) {
      if (on_delivery_thread) {
        thread_.detach();  // inside the handler: the loop ends when it returns
      } else {
        to_join = std::move(thread_);
      }
    }
    if (!inner_stop_claimed_) {
      inner_stop_claimed_ = true;
      stop_inner = true;
    }
  }
  cv_.notify_all();
  if (stop_inner) {
    // Afterwards OnReceive is not running and will not run again.
    inner_->Stop();
    std::lock_guard lock(mu_);
    inner_stopped_ = true;
    cv_.notify_all();
  }
  if (on_delivery_thread) return;
  if (to_join.joinable()) to_join.join();
  std::unique_lock lock(mu_);
  // Another Stop may own the join or the inner Stop; wait for both to finish.
  cv_.wait(lock, [&] { return inner_stopped_ && (loop_exited_ || !running_); });
}

FaultTransport::FaultTransport(std::unique_ptr<Transport> inner, FaultSpec spec)
    : impl_(std::make_shared<Impl>(std::move(inner), std::move(spec))) {}

FaultTransport::~FaultTransport() { impl_->Stop(); }

absl::Status FaultTransport::Start(Handler handler) { return impl_->Start(std::move(handler)); }

const std::string& FaultTransport::address() const { return impl_->address(); }

absl::Status FaultTransport::Send(const std::string& to, Message message) {
  return impl_->Send(to, std::move(message));
}

void FaultTransport::Stop() { impl_->Stop(); }

TransportStats FaultTransport::stats() const { return impl_->stats(); }
void FaultTransport::Flush() { impl_->Flush(); }
bool FaultTransport::LendsTo(const std::string& to, size_t bytes) const { return impl_->LendsTo(to, bytes); }
bool FaultTransport::SameHostPath(const std::string& peer) const { return impl_->SameHostPath(peer); }
PeerBacklog FaultTransport::Backlog(const std::string& to) const { return impl_->Backlog(to); }
ForgetResult FaultTransport::Forget(const std::string& peer, std::chrono::milliseconds max_wait) {
  return impl_->Forget(peer, max_wait);
}
void FaultTransport::SetLinkHandler(LinkHandler handler) { impl_->SetLinkHandler(std::move(handler)); }
bool FaultTransport::PlacesInto(const std::string& from) const { return impl_->inner().PlacesInto(from); }
absl::Status FaultTransport::PostDestination(const std::string& from, uint64_t request_id, uint32_t frame_index,
                                             Buffer destination) {
  return impl_->inner().PostDestination(from, request_id, frame_index, std::move(destination));
}
bool FaultTransport::CancelDestination(const std::string& from, uint64_t request_id, uint32_t frame_index) {
  return impl_->inner().CancelDestination(from, request_id, frame_index);
}

FaultStats FaultTransport::fault_stats() const { return impl_->fault_stats(); }

const FaultSpec& FaultTransport::spec() const { return impl_->spec(); }

}  // namespace tessera
