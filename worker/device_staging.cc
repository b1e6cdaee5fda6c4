#include "worker/device_staging.h"

#include <functional>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

// ---------------------------------------------------------------------------
// HostCopier

absl::Status HostCopier::Allocate(size_t count, size_t bytes) {
  if (slots_) return absl::FailedPreconditionError("host copier: buffers already allocated");
  if (bytes % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("host copier: buffer size ", bytes, " is not a multiple of 4"));
  }
  slots_ = std::make_unique<Slot[]>(count);
  for (size_t i = 0; i < count; ++i) {
    slots_[i].floats = bytes / sizeof(float);
    slots_[i].data = std::make_unique_for_overwrite<float[]>(std::max<size_t>(1, slots_[i].floats));
  }
  count_ = count;
  return absl::OkStatus();
}

std::span<float> HostCopier::buffer(size_t slot) {
  if (slot >= count_) return {};
  return {slots_[slot].data.get(), slots_[slot].floats};
}

absl::Status HostCopier::CheckCopy(size_t slot, const void* device, size_t floats) const {
  if (slot >= count_) {
    return absl::InvalidArgumentError(absl::StrCat("host copier: slot ", slot, " of ", count_));
  }
  if (floats > slots_[slot].floats) {
    return absl::InvalidArgumentError(absl::StrCat("host copier: ", floats, " floats do not fit a buffer of ",
                                                   slots_[slot].floats));
  }
  if (floats > 0 && device == nullptr) return absl::InvalidArgumentError("host copier: null memory");
  return absl::OkStatus();
}

absl::Status HostCopier::StartToHost(size_t slot, const float* device_src, size_t floats) {
  if (absl::Status s = CheckCopy(slot, device_src, floats); !s.ok()) return s;
  const Nanos start = MonotonicNow();
  if (floats > 0) std::memcpy(slots_[slot].data.get(), device_src, floats * sizeof(float));
  slots_[slot].last_copy = MonotonicNow() - start;
  return absl::OkStatus();
}

absl::Status HostCopier::StartToDevice(size_t slot, float* device_dst, size_t floats) {
  if (absl::Status s = CheckCopy(slot, device_dst, floats); !s.ok()) return s;
  const Nanos start = MonotonicNow();
  if (floats > 0) std::memcpy(device_dst, slots_[slot].data.get(), floats * sizeof(float));
  slots_[slot].last_copy = MonotonicNow() - start;
  return absl::OkStatus();
}

absl::StatusOr<Nanos> HostCopier::Wait(size_t slot) {
  if (slot >= count_) return absl::InvalidArgumentError(absl::StrCat("host copier: slot ", slot, " of ", count_));
  return std::exchange(slots_[slot].last_copy, 0);
}

// ---------------------------------------------------------------------------
// The Worker as a TransferPort

namespace {

class FutureTransfer final : public PendingTransfer {
 public:
  explicit FutureTransfer(Future f) : future_(std::move(f)) {}
  absl::Status Wait() override { return future_.Wait(); }
  bool ready() const override { return future_.ready(); }

 private:
  Future future_;
};

class WorkerTransferPort final : public TransferPort {
 public:
  explicit WorkerTransferPort(Worker& worker) : worker_(worker) {}
  std::unique_ptr<PendingTransfer> Push(uint32_t table, std::span<const Key> keys,
                                        std::span<const float> values) override {
    return std::make_unique<FutureTransfer>(worker_.Push(table, keys, values));
  }
  std::unique_ptr<PendingTransfer> Pull(uint32_t table, std::span<const Key> keys, std::span<float> out) override {
    return std::make_unique<FutureTransfer>(worker_.Pull(table, keys, out));
  }

 private:
  Worker& worker_;
};

absl::Status Annotate(const absl::Status& s, const std::string& what) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

}  // namespace

std::unique_ptr<TransferPort> MakeWorkerTransferPort(Worker& worker) {
  return std::make_unique<WorkerTransferPort>(worker);
}

// ---------------------------------------------------------------------------
// One PushFromDevice or PullToDevice: the pipeline over the staging slots.

class DeviceStaging::Call {
 public:
  Call(Copier& copier, TransferPort& port, size_t buffers, bool push, uint32_t table, std::span<const Key> keys,
       size_t row_floats, size_t rows_per_part)
      : copier_(copier),
        port_(port),
        push_(push),
        table_(table),
        keys_(keys),
        row_floats_(row_floats),
        rows_per_part_(rows_per_part),
        parts_((keys.size() + rows_per_part - 1) / rows_per_part),
        slots_(buffers) {}

  absl::Status RunPush(const float* device_values) {
    const size_t n = parts_;
    if (n > 0 && StartPushCopy(0, device_values)) {
      for (size_t k = 0; k < n; ++k) {
        const size_t s = Slot(k);
        if (absl::Status st = WaitCopy(s); !st.ok()) {
          Fail(st);
          break;
        }
        slots_[s].transfer = port_.Push(table_, PartKeys(k), Staging(k));
        ++stats_.parts_pushed;
        // The copy of the next part runs while this push is in flight.
        if (k + 1 < n && !StartPushCopy(k + 1, device_values)) break;
      }
    }
    Drain();
    return first_error_;
  }

  absl::Status RunPull(float* device_out) {
    const size_t n = parts_;
    for (size_t k = 0; k < std::min(n, slots_.size()); ++k) IssuePull(k);
    for (size_t k = 0; k < n; ++k) {
      const size_t s = Slot(k);
      if (absl::Status st = WaitTransfer(s); !st.ok()) {
        Fail(st);
        break;
      }
      // The pulls of the next parts stay in flight while this copy runs.
      if (!StartCopy(k, device_out + FirstRow(k) * row_floats_, nullptr)) break;
      if (k + slots_.size() < n) {
        // The buffer takes the next pull only once its copy is done.
        if (absl::Status st = WaitCopy(s); !st.ok()) {
          Fail(st);
          break;
        }
        IssuePull(k + slots_.size());
      }
    }
    Drain();
    return first_error_;
  }

  const Stats& stats() const { return stats_; }

 private:
  struct SlotState {
    size_t part = 0;                             // the part using the slot
    bool copying = false;                        // a copy of `part` is outstanding
    bool copy_overlapped = false;                // it started while a transfer was in flight
    std::unique_ptr<PendingTransfer> transfer;   // the push or pull of `part`, until waited for
  };

  size_t Slot(size_t part) const { return part % slots_.size(); }
  size_t FirstRow(size_t part) const { return part * rows_per_part_; }
  size_t Rows(size_t part) const { return std::min(rows_per_part_, keys_.size() - FirstRow(part)); }
  std::span<const Key> PartKeys(size_t part) const { return keys_.subspan(FirstRow(part), Rows(part)); }
  std::span<float> Staging(size_t part) { return copier_.buffer(Slot(part)).first(Rows(part) * row_floats_); }

  std::string PartName(size_t part) const {
    return absl::StrCat("part ", part + 1, " of ", parts_, " (rows ", FirstRow(part), "..",
                        FirstRow(part) + Rows(part) - 1, ")");
  }
  std::string TransferName(size_t part) const {
    return push_ ? absl::StrCat("push of ", PartName(part), " to table ", table_)
                 : absl::StrCat("pull of ", PartName(part), " from table ", table_);
  }
  std::string CopyName(size_t part) const {
    return push_ ? absl::StrCat("copy of ", PartName(part), " from device to staging (", copier_.name(),
                                ") for a push to table ", table_)
                 : absl::StrCat("copy of ", PartName(part), " from staging to device (", copier_.name(),
                                ") for a pull from table ", table_);
  }

  void Fail(absl::Status s) {
    if (first_error_.ok()) first_error_ = std::move(s);
  }

  bool AnyTransferInFlight() const {
    for (const SlotState& s : slots_) {
      if (s.transfer && !s.transfer->ready()) return true;
    }
    return false;
  }

  // Push: takes the part's slot (once the push that last read it completed)
  // and starts copying the part into it.
  bool StartPushCopy(size_t part, const float* device_values) {
    const size_t s = Slot(part);
    if (slots_[s].transfer) {
      if (absl::Status st = WaitTransfer(s); !st.ok()) {
        Fail(st);
        return false;
      }
    }
    return StartCopy(part, nullptr, device_values + FirstRow(part) * row_floats_);
  }

  // Starts the part's copy: into device_dst (pulls) or from device_src (pushes).
  bool StartCopy(size_t part, float* device_dst, const float* device_src) {
    const size_t s = Slot(part);
    const bool overlapped = AnyTransferInFlight();
    const size_t floats = Rows(part) * row_floats_;
    absl::Status st = push_ ? copier_.StartToHost(s, device_src, floats) : copier_.StartToDevice(s, device_dst, floats);
    if (!st.ok()) {
      Fail(Annotate(st, CopyName(part)));
      return false;
    }
    slots_[s].part = part;
    slots_[s].copying = true;
    slots_[s].copy_overlapped = overlapped;
    return true;
  }

  void IssuePull(size_t part) {
    const size_t s = Slot(part);
    slots_[s].part = part;
    slots_[s].transfer = port_.Pull(table_, PartKeys(part), Staging(part));
    ++stats_.parts_pulled;
  }

  absl::Status WaitCopy(size_t s) {
    SlotState& slot = slots_[s];
    if (!slot.copying) return absl::OkStatus();
    const Nanos start = MonotonicNow();
    absl::StatusOr<Nanos> took = copier_.Wait(s);
    stats_.copy_wait += MonotonicNow() - start;
    slot.copying = false;
    if (!took.ok()) return Annotate(took.status(), CopyName(slot.part));
    const uint64_t bytes = Rows(slot.part) * row_floats_ * sizeof(float);
    (push_ ? stats_.bytes_to_host : stats_.bytes_to_device) += bytes;
    stats_.copy_time += *took;
    if (slot.copy_overlapped) stats_.copy_time_overlapped += *took;
    return absl::OkStatus();
  }

  absl::Status WaitTransfer(size_t s) {
    SlotState& slot = slots_[s];
    if (!slot.transfer) return absl::OkStatus();
    const Nanos start = MonotonicNow();
    absl::Status st = slot.transfer->Wait();
    stats_.transfer_wait += MonotonicNow() - start;
    slot.transfer.reset();
    if (!st.ok()) return Annotate(st, TransferName(slot.part));
    return absl::OkStatus();
  }

  // Waits for every outstanding copy and transfer, in part order, keeping
  // the first error.
  void Drain() {
    std::vector<size_t> busy;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].copying || slots_[s].transfer) busy.push_back(s);
    }
    std::sort(busy.begin(), busy.end(), [&](size_t a, size_t b) { return slots_[a].part < slots_[b].part; });
    for (size_t s : busy) {
      if (absl::Status st = WaitCopy(s); !st.ok()) Fail(st);
      if (absl::Status st = WaitTransfer(s); !st.ok()) Fail(st);
    }
  }

  Copier& copier_;
  TransferPort& port_;
  const bool push_;
  const uint32_t table_;
  const std::span<const Key> keys_;
  const size_t row_floats_;
  const size_t rows_per_part_;
  const size_t parts_;
  // Invariants: slot s serves only parts p with p % buffers == s; it holds
  // at most one outstanding copy or transfer, never both.
  std::vector<SlotState> slots_;
  absl::Status first_error_;
  Stats stats_;
};

// ---------------------------------------------------------------------------
// DeviceStaging

namespace {

constexpr size_t kMaxBuffers = 64;

// Checks the options and allocates the staging buffers.
absl::Status Prepare(Copier* copier, const DeviceStagingOptions& options) {
  if (copier == nullptr) return absl::InvalidArgumentError("device staging: no copier");
  if (options.staging_bytes < sizeof(float)) {
    return absl::InvalidArgumentError(
        absl::StrCat("device staging: staging_bytes ", options.staging_bytes, " is less than one float"));
  }
  if (options.buffers < 1 || options.buffers > kMaxBuffers) {
    return absl::InvalidArgumentError(
        absl::StrCat("device staging: buffers ", options.buffers, " is outside 1..", kMaxBuffers));
  }
  const size_t bytes = options.staging_bytes / sizeof(float) * sizeof(float);
  if (absl::Status s = copier->Allocate(options.buffers, bytes); !s.ok()) {
    return Annotate(s, absl::StrCat("device staging: allocating ", options.buffers, " staging buffers of ", bytes,
                                    " bytes (", copier->name(), ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceStaging>> DeviceStaging::Create(Worker& worker, std::unique_ptr<Copier> copier,
                                                                     DeviceStagingOptions options) {
  if (absl::Status s = Prepare(copier.get(), options); !s.ok()) return s;
  std::unique_ptr<TransferPort> port = MakeWorkerTransferPort(worker);
  TransferPort& ref = *port;
  return std::unique_ptr<DeviceStaging>(new DeviceStaging(std::move(port), ref, std::move(copier), options));
}

absl::StatusOr<std::unique_ptr<DeviceStaging>> DeviceStaging::Create(TransferPort& port,
                                                                     std::unique_ptr<Copier> copier,
                                                                     DeviceStagingOptions options) {
  if (absl::Status s = Prepare(copier.get(), options); !s.ok()) return s;
  return std::unique_ptr<DeviceStaging>(new DeviceStaging(nullptr, port, std::move(copier), options));
}

DeviceStaging::DeviceStaging(std::unique_ptr<TransferPort> owned_port, TransferPort& port,
                             std::unique_ptr<Copier> copier, DeviceStagingOptions options)
    : options_(options),
      buffer_floats_(options.staging_bytes / sizeof(float)),
      owned_port_(std::move(owned_port)),
      port_(port),
      copier_(std::move(copier)) {}

DeviceStaging::~DeviceStaging() = default;

size_t DeviceStaging::RowsPerPart(size_t row_floats) const {
  return row_floats == 0 ? 0 : buffer_floats_ / row_floats;
}

absl::Status DeviceStaging::CheckRequest(std::span<const Key> keys, const void* device, size_t row_floats) const {
  if (row_floats == 0) return absl::InvalidArgumentError("device staging: row_floats must be at least 1");
  if (RowsPerPart(row_floats) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "device staging: a row of ", row_floats, " floats (", row_floats * sizeof(float),
        " bytes) does not fit a staging buffer of ", buffer_floats_ * sizeof(float), " bytes (staging_bytes)"));
  }
  if (keys.size() > std::numeric_limits<size_t>::max() / sizeof(float) / row_floats) {
    return absl::InvalidArgumentError("device staging: request too large");
  }
  if (!keys.empty() && device == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("device staging: null device memory for ", keys.size(), " rows"));
  }
  return absl::OkStatus();
}

absl::Status DeviceStaging::PushFromDevice(uint32_t table, std::span<const Key> keys, const float* device_values,
                                           size_t row_floats) {
  return RunCall(/*push=*/true, table, keys, device_values, row_floats,
                 [&](Call& run) { return run.RunPush(device_values); });
}

absl::Status DeviceStaging::PullToDevice(uint32_t table, std::span<const Key> keys, float* device_out,
                                         size_t row_floats) {
  return RunCall(/*push=*/false, table, keys, device_out, row_floats,
                 [&](Call& run) { return run.RunPull(device_out); });
}

absl::Status DeviceStaging::RunCall(bool push, uint32_t table, std::span<const Key> keys, const void* device,
                                    size_t row_floats, const std::function<absl::Status(Call&)>& body) {
  Stats call;
  (push ? call.pushes : call.pulls) = 1;
  absl::Status result = CheckRequest(keys, device, row_floats);
  if (result.ok() && !keys.empty()) {
    std::lock_guard lock(call_mu_);
    const Nanos start = MonotonicNow();
    Call run(*copier_, port_, options_.buffers, push, table, keys, row_floats, RowsPerPart(row_floats));
    result = body(run);
    const Stats& s = run.stats();
    call.parts_pushed = s.parts_pushed;
    call.parts_pulled = s.parts_pulled;
    call.bytes_to_host = s.bytes_to_host;
    call.bytes_to_device = s.bytes_to_device;
    call.copy_time = s.copy_time;
    call.copy_time_overlapped = s.copy_time_overlapped;
    call.copy_wait = s.copy_wait;
    call.transfer_wait = s.transfer_wait;
    call.wall = MonotonicNow() - start;
  }
  if (!result.ok()) call.failed_calls = 1;
  AddStats(call);
  return result;
}

void DeviceStaging::AddStats(const Stats& c) {
  std::lock_guard lock(stats_mu_);
  stats_.pushes += c.pushes;
  stats_.pulls += c.pulls;
  stats_.failed_calls += c.failed_calls;
  stats_.parts_pushed += c.parts_pushed;
  stats_.parts_pulled += c.parts_pulled;
  stats_.bytes_to_host += c.bytes_to_host;
  stats_.bytes_to_device += c.bytes_to_device;
  stats_.copy_time += c.copy_time;
  stats_.copy_time_overlapped += c.copy_time_overlapped;
  stats_.copy_wait += c.copy_wait;
  stats_.transfer_wait += c.transfer_wait;
  stats_.wall += c.wall;
}

DeviceStaging::Stats DeviceStaging::stats() const {
  std::lock_guard lock(stats_mu_);
  return stats_;
}

}  // namespace tessera
