#include "rdma/credit_window.h"

#include "absl/strings/str_cat.h"
#include "rdma/invariant.h"

namespace tessera::rdma {

CreditWindow::CreditWindow(uint32_t local_window, uint32_t peer_window)
    : local_window_(local_window), peer_window_(peer_window), available_(peer_window) {
  RDMA_CHECK(local_window >= 1 && local_window <= kMaxWindow);
  RDMA_CHECK(peer_window >= 1 && peer_window <= kMaxWindow);
}

bool CreditWindow::TryConsume() {
  if (available_ == 0) return false;
  --available_;
  return true;
}

absl::Status CreditWindow::OnReturned(uint32_t credits) {
  if (credits > peer_window_ - available_) {
    return absl::FailedPreconditionError(absl::StrCat("peer returned ", credits, " credits while only ",
                                                      peer_window_ - available_, " were taken"));
  }
  available_ += credits;
  return absl::OkStatus();
}

absl::Status CreditWindow::OnRegularReceived() {
  if (returnable_ >= local_window_) {
    ++overruns_;
    return absl::FailedPreconditionError(
        absl::StrCat("peer sent beyond its window of ", local_window_, " credits"));
  }
  ++returnable_;
  return absl::OkStatus();
}

uint16_t CreditWindow::TakeReturnable() {
  const uint16_t n = static_cast<uint16_t>(returnable_);
  returnable_ = 0;
  return n;
}

}  // namespace tessera::rdma
