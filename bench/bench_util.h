#pragma once
// Shared by the benchmark programs in bench/: a monotonic clock in seconds,
// and the lines a worker program prints for tessera-launch (the process
// contract: TESSERA_PROGRESS lines and one TESSERA_RESULT line, each a tag
// and a JSON object).
#include <chrono>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"

namespace tessera::bench {

// Seconds on the steady clock (for differences only).
inline double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Prints "TAG JSON" as one line on stdout, flushed.
inline void Emit(const std::string& tag, const std::string& json) {
  std::fputs(absl::StrCat(tag, " ", json, "\n").c_str(), stdout);
  std::fflush(stdout);
}

}  // namespace tessera::bench
