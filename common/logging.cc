#include "common/logging.h"

#include <mutex>

#include "spdlog/sinks/stdout_sinks.h"

namespace tessera {
namespace {
std::mutex name_mu;
std::string* process_name = nullptr;  // set by InitLogging; guarded by name_mu

std::string Pattern(const std::string& token) { return "%Y-%m-%d %H:%M:%S.%e " + token + " %l %v"; }
}  // namespace

void InitLogging(const std::string& name, bool debug) {
  auto logger = spdlog::stderr_logger_mt(name);
  logger->set_pattern(Pattern(name));
  logger->set_level(debug ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  std::lock_guard lock(name_mu);
  if (process_name == nullptr) process_name = new std::string;
  *process_name = name;
}

void SetLogNodeId(uint32_t node_id) {
  std::lock_guard lock(name_mu);
  if (process_name == nullptr) return;
  spdlog::default_logger()->set_pattern(Pattern(*process_name + "/node-" + std::to_string(node_id)));
}

}  // namespace tessera
