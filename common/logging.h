#pragma once
// Logging: one line per event with time, role, node and level, through spdlog.
// Binaries call InitLogging once in main; libraries log through TLOG_* macros.
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

// Debian's Abseil has its own string_view type (not std::string_view);
// this lets log lines format it, e.g. a Status's message().
#if !defined(ABSL_USES_STD_STRING_VIEW)
template <>
struct fmt::formatter<absl::string_view> : fmt::formatter<fmt::string_view> {
  template <typename Context>
  auto format(absl::string_view s, Context& ctx) const {
    return fmt::formatter<fmt::string_view>::format(fmt::string_view(s.data(), s.size()), ctx);
  }
};
#endif

namespace tessera {

// Sets the process-wide line format "2026-12-02 12:00:00.123 server-1 info msg".
// `name` is the role and rank, e.g. "server-1". `debug` enables debug lines.
void InitLogging(const std::string& name, bool debug);

// Once the coordinator has given the process its node id: every later line
// names it after the role and rank, "server-1/node-3" (one token, so that
// log readers split lines the same way). Does nothing before InitLogging.
void SetLogNodeId(uint32_t node_id);

namespace logging_internal {
// spdlog builds its registry and default logger on first use. Building them
// during static initialization, before any thread exists, orders that build
// before every thread's first log line; otherwise two threads logging for
// the first time at once race on it in ThreadSanitizer's view (spdlog is
// not instrumented, so its own once-only guard is invisible to it).
inline const bool kLoggerRegistryBuilt = ::spdlog::default_logger_raw() != nullptr;
}  // namespace logging_internal

}  // namespace tessera

#define TLOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define TLOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define TLOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define TLOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
