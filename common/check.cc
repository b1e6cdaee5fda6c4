#include "common/check.h"

#include <cstdio>
#include <cstdlib>

#include "common/logging.h"

namespace tessera::check_internal {

void CheckFailed(const char* file, int line, const char* condition, absl::string_view message) noexcept {
  std::string text = std::string("check failed: ") + file + ":" + std::to_string(line) + ": " + condition;
  if (!message.empty()) text.append(": ").append(message.data(), message.size());
  // stderr first and unbuffered: it needs nothing that may be what broke.
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
  try {
    TLOG_ERROR("{}", text);
    if (auto* logger = ::spdlog::default_logger_raw(); logger != nullptr) logger->flush();
  } catch (...) {
    // The line is on stderr already.
  }
  std::abort();
}

}  // namespace tessera::check_internal
