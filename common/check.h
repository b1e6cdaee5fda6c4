#pragma once
// Invariant checks that stay in release builds.
//
// TESSERA_CHECK(cond) and TESSERA_CHECK_MSG(cond, msg) evaluate `cond` once,
// in every build (NDEBUG or not). When it is false they write one line
// naming the file, the line, the condition's text and, for _MSG, the
// message to stderr and to the process log (common/logging.h), and then call
// std::abort(): the process ends with SIGABRT (and a core file where those
// are enabled). `msg` is evaluated only on failure; it may be a const char*,
// a std::string, a std::string_view or an absl::string_view.
//
// Use them for conditions that, if false, mean the program is wrong and
// carrying on would corrupt state or answer wrongly. Keep the condition cheap:
// a comparison or two. A check that would cost in a per-row or per-element
// loop is a TESSERA_DCHECK instead: the same in builds without NDEBUG, and
// compiled out (the condition still type-checks but is never evaluated) in
// builds with it. Errors that a caller or a peer can cause are Status
// returns, never checks.
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace tessera::check_internal {

// Reports a failed check (see above) and aborts. Never returns.
[[noreturn]] void CheckFailed(const char* file, int line, const char* condition, absl::string_view message) noexcept;

// The message argument of TESSERA_CHECK_MSG as one type, whichever string
// type was given (Debian's Abseil has its own string_view type).
inline absl::string_view CheckMessage(const char* m) { return m == nullptr ? absl::string_view() : m; }
inline absl::string_view CheckMessage(const std::string& m) { return m; }
inline absl::string_view CheckMessage(absl::string_view m) { return m; }
#if !defined(ABSL_USES_STD_STRING_VIEW)
inline absl::string_view CheckMessage(std::string_view m) { return absl::string_view(m.data(), m.size()); }
#endif

}  // namespace tessera::check_internal

#define TESSERA_CHECK(cond)                                                                     \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::tessera::check_internal::CheckFailed(__FILE__, __LINE__, #cond, ::absl::string_view()); \
  } while (false)

#define TESSERA_CHECK_MSG(cond, msg)                                                        \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::tessera::check_internal::CheckFailed(__FILE__, __LINE__, #cond,                     \
                                             ::tessera::check_internal::CheckMessage(msg)); \
  } while (false)

#ifdef NDEBUG
#define TESSERA_DCHECK(cond)            \
  do {                                  \
    if (false) static_cast<void>(cond); \
  } while (false)
#else
#define TESSERA_DCHECK(cond) TESSERA_CHECK(cond)
#endif
