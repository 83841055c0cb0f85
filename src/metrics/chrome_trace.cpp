#include "metrics/chrome_trace.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

namespace meshtrain {

namespace {

// The format's timestamps are microseconds; fractional values keep the recorder's nanoseconds.
double us(int64_t ns) { return double(ns) / 1000.0; }

nlohmann::json args_json(const std::vector<std::pair<std::string, trace::ArgValue>>& args) {
  nlohmann::json a = nlohmann::json::object();
  for (const auto& [key, value] : args) std::visit([&](const auto& v) { a[key] = v; }, value);
  return a;
}

}  // namespace

nlohmann::json chrome_trace_json(const trace::Recording& rec, int rank, int64_t step) {
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"tid", 0},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"tid", 0},
                    {"args", {{"sort_index", rank}}}});
  for (const auto& [tid, name] : rec.thread_names)
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}});

  std::vector<const trace::Event*> order;
  order.reserve(rec.events.size());
  for (const trace::Event& e : rec.events) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const trace::Event* a, const trace::Event* b) {
    if (a->start_ns != b->start_ns) return a->start_ns < b->start_ns;
    return a->duration_ns > b->duration_ns;
  });
  for (const trace::Event* e : order) {
    nlohmann::json ev = {{"name", e->name}, {"cat", e->category}, {"pid", rank}, {"tid", e->tid},
                         {"ts", us(e->start_ns)}};
    if (e->phase == trace::Event::Phase::kComplete) {
      ev["ph"] = "X";
      ev["dur"] = us(e->duration_ns);
      ev["args"] = args_json(e->args);
      events.push_back(std::move(ev));
    } else {
      ev["ph"] = "b";
      ev["id"] = e->id;
      ev["args"] = args_json(e->args);
      nlohmann::json end = {{"name", e->name}, {"cat", e->category}, {"pid", rank}, {"tid", e->tid},
                            {"ts", us(e->start_ns + e->duration_ns)}, {"ph", "e"}, {"id", e->id}};
      events.push_back(std::move(ev));
      events.push_back(std::move(end));
    }
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"rank", rank},
            {"step", step},
            {"origin_unix_us", trace::origin_unix_us()},
            {"dropped_events", rec.dropped},
            {"generator", "meshtrain"}}}};
}

std::string chrome_trace_path(const std::string& folder, int64_t step, int rank) {
  return (std::filesystem::path(folder) / ("iteration_" + std::to_string(step)) /
          ("rank" + std::to_string(rank) + "_trace.json"))
      .string();
}

std::string write_chrome_trace(const std::string& folder, int64_t step, int rank, const trace::Recording& rec) {
  const std::string path = chrome_trace_path(folder, step, rank);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw std::runtime_error(dir.string() + ": cannot create the trace folder (" + ec.message() + ")");

  const std::string text = chrome_trace_json(rec, rank, step).dump();
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) throw std::runtime_error(tmp + ": cannot open for writing (" + std::strerror(errno) + ")");
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int saved_errno = errno;
  if (std::fclose(f) != 0 || !written) {
    std::remove(tmp.c_str());
    throw std::runtime_error(tmp + ": write failed (" + std::strerror(written ? errno : saved_errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    throw std::runtime_error(path + ": cannot rename " + tmp + " onto it (" + std::strerror(e) + ")");
  }
  return path;
}

}  // namespace meshtrain
