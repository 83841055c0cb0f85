#include "util/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace meshtrain::log {

namespace {
std::shared_ptr<spdlog::logger> out_logger, err_logger;
bool print_info = true;

void ensure() {
  if (!out_logger) init(0, "", false);
}
}  // namespace

void init(int rank, const std::string& host, bool verbose_all_ranks) {
  print_info = verbose_all_ranks || rank == 0;
  spdlog::drop("meshtrain");
  spdlog::drop("meshtrain-err");
  out_logger = spdlog::stdout_logger_mt("meshtrain");
  err_logger = spdlog::stderr_logger_mt("meshtrain-err");
  out_logger->set_pattern("%v");
  err_logger->set_pattern("[rank " + std::to_string(rank) + " " + host + "] %l: %v");
  out_logger->flush_on(spdlog::level::info);
  err_logger->flush_on(spdlog::level::warn);
}

void info(const std::string& msg) {
  ensure();
  if (print_info) out_logger->info(msg);
}

void warn(const std::string& msg) {
  ensure();
  err_logger->warn(msg);
}

void error(const std::string& msg) {
  ensure();
  err_logger->error(msg);
}

}  // namespace meshtrain::log
