#include "common/logging.h"

#include "spdlog/sinks/stdout_sinks.h"

namespace tessera {

void InitLogging(const std::string& name, bool debug) {
  auto logger = spdlog::stderr_logger_mt(name);
  logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %n %l %v");
  logger->set_level(debug ? spdlog::level::debug : spdlog::level::info);
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

}  // namespace tessera
