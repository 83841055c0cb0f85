// The span recorder (util/trace.hpp), its Chrome trace JSON (metrics/chrome_trace.hpp) and the
// [profiling] step schedule (metrics/step_profiler.hpp).
#define BOOST_TEST_MODULE trace
#include <unistd.h>

#include <boost/test/unit_test.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "metrics/chrome_trace.hpp"
#include "metrics/step_profiler.hpp"
#include "util/trace.hpp"
#include "scratch_dir.hpp"

using namespace meshtrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path tmp_dir(const std::string& name) {
  const fs::path d = meshtrain::testing::scratch_dir("meshtrain_test_trace") / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  BOOST_REQUIRE_MESSAGE(f.good(), path + " was not written");
  return json::parse(f);  // throws on malformed JSON
}

// The work one thread records: outer { inner.a, inner.b { leaf } }, plus an async interval.
void record_nested(const std::string& prefix, const std::string& thread_name, int64_t* tid_out) {
  if (!thread_name.empty()) trace::set_thread_name(thread_name);
  *tid_out = int64_t(::gettid());
  trace::Span outer(prefix + "outer", "forward");
  outer.arg("bytes", int64_t(4096)).arg("group", "dp_shard").arg("ratio", 0.5);
  const int64_t issued = trace::now_ns();
  { trace::Span a(prefix + "inner.a", "backward"); }
  {
    trace::Span b(prefix + "inner.b", "backward");
    trace::Span leaf(prefix + "leaf", "recompute");
  }
  trace::record_async(prefix + "all_gather", "collective", issued, trace::now_ns(), {{"bytes", int64_t(64)}});
}

// The "X" events of one thread, by name.
std::map<std::string, json> spans_of(const json& doc, int64_t tid) {
  std::map<std::string, json> out;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == tid) out[e["name"].get<std::string>()] = e;
  return out;
}

bool within(const json& child, const json& parent) {
  const double cs = child["ts"], ce = cs + child["dur"].get<double>();
  const double ps = parent["ts"], pe = ps + parent["dur"].get<double>();
  return cs >= ps && ce <= pe;
}

}  // namespace

BOOST_AUTO_TEST_CASE(disabled_tracing_records_nothing) {
  trace::enable(false);
  trace::take();
  {
    trace::Span s("unit", "forward");
    s.arg("bytes", int64_t(1));
    BOOST_TEST(!s.active());
    trace::record_async("all_reduce", "collective", 0, 10);
  }
  const trace::Recording r = trace::take();
  BOOST_TEST(r.events.empty());
  BOOST_TEST(r.dropped == 0);
}

BOOST_AUTO_TEST_CASE(nested_spans_on_two_threads_make_a_valid_chrome_trace) {
  trace::take();
  trace::enable(true);
  int64_t tid_main = 0, tid_worker = 0;
  record_nested("m.", "", &tid_main);
  std::thread worker(record_nested, "w.", "progress", &tid_worker);
  worker.join();
  trace::enable(false);
  const trace::Recording rec = trace::take();
  BOOST_TEST(rec.events.size() == 2u * 5u);
  BOOST_TEST(tid_main != tid_worker);
  BOOST_TEST(rec.thread_names.at(tid_main) == "main");
  BOOST_TEST(rec.thread_names.at(tid_worker) == "progress");

  const fs::path dir = tmp_dir("two_threads");
  const std::string path = write_chrome_trace(dir.string(), 7, 3, rec);
  BOOST_TEST(path == (dir / "iteration_7" / "rank3_trace.json").string());
  BOOST_TEST(std::distance(fs::directory_iterator(dir / "iteration_7"), fs::directory_iterator()) == 1);  // no .tmp left
  const json doc = read_json(path);

  BOOST_TEST(doc["displayTimeUnit"] == "ms");
  BOOST_TEST(doc["otherData"]["rank"] == 3);
  BOOST_TEST(doc["otherData"]["step"] == 7);
  bool named_process = false;
  std::map<int64_t, std::string> thread_names;
  int complete = 0;
  std::map<uint64_t, std::vector<json>> async;
  for (const json& e : doc["traceEvents"]) {
    BOOST_TEST(e["pid"] == 3);
    BOOST_TEST(e.contains("tid"));
    const std::string ph = e["ph"];
    if (ph == "M" && e["name"] == "process_name") named_process = e["args"]["name"] == "rank 3";
    if (ph == "M" && e["name"] == "thread_name") thread_names[e["tid"]] = e["args"]["name"];
    if (ph == "X") {
      ++complete;
      BOOST_TEST(e["ts"].is_number());
      BOOST_TEST(e["dur"].get<double>() >= 0.0);
      BOOST_TEST(e["cat"].is_string());
    }
    if (ph == "b" || ph == "e") async[e["id"].get<uint64_t>()].push_back(e);
  }
  BOOST_TEST(named_process);
  BOOST_TEST(thread_names[tid_main] == "main");
  BOOST_TEST(thread_names[tid_worker] == "progress");
  BOOST_TEST(complete == 8);

  for (int64_t tid : {tid_main, tid_worker}) {
    const std::string p = tid == tid_main ? "m." : "w.";
    auto s = spans_of(doc, tid);
    BOOST_REQUIRE(s.size() == 4u);
    const json& outer = s[p + "outer"];
    BOOST_TEST(outer["cat"] == "forward");
    BOOST_TEST(outer["args"]["bytes"] == 4096);
    BOOST_TEST(outer["args"]["group"] == "dp_shard");
    BOOST_TEST(outer["args"]["ratio"] == 0.5);
    BOOST_TEST(within(s[p + "inner.a"], outer));
    BOOST_TEST(within(s[p + "inner.b"], outer));
    BOOST_TEST(within(s[p + "leaf"], s[p + "inner.b"]));
    BOOST_TEST(s[p + "leaf"]["cat"] == "recompute");
    // Siblings do not overlap: inner.b starts after inner.a ended.
    BOOST_TEST(s[p + "inner.b"]["ts"].get<double>() >=
               s[p + "inner.a"]["ts"].get<double>() + s[p + "inner.a"]["dur"].get<double>());
  }
  // Parents precede their children in the file (sorted by start, longer first).
  double last_ts = -1;
  for (const json& e : doc["traceEvents"])
    if (e["ph"] == "X") {
      BOOST_TEST(e["ts"].get<double>() >= last_ts);
      last_ts = e["ts"];
    }

  BOOST_TEST(async.size() == 2u);
  for (const auto& [id, pair] : async) {
    BOOST_REQUIRE(pair.size() == 2u);
    const json& b = pair[0]["ph"] == "b" ? pair[0] : pair[1];
    const json& e = pair[0]["ph"] == "b" ? pair[1] : pair[0];
    BOOST_TEST(b["ph"] == "b");
    BOOST_TEST(e["ph"] == "e");
    BOOST_TEST(b["cat"] == e["cat"]);
    BOOST_TEST(b["name"] == e["name"]);
    BOOST_TEST(e["ts"].get<double>() >= b["ts"].get<double>());
    BOOST_TEST(b["args"]["bytes"] == 64);
  }
}

BOOST_AUTO_TEST_CASE(a_span_open_when_recording_stops_is_still_recorded) {
  trace::take();
  trace::enable(true);
  {
    trace::Span s("step", "step");
    trace::enable(false);
    trace::Span late("after", "forward");  // recording already off: not recorded
    BOOST_TEST(!late.active());
  }
  const trace::Recording r = trace::take();
  BOOST_REQUIRE(r.events.size() == 1u);
  BOOST_TEST(r.events[0].name == "step");
}

BOOST_AUTO_TEST_CASE(profile_schedule_matches_torch_profiler_schedule) {
  ProfilingOptions o;
  o.enable_profiling = true;
  o.profile_freq = 10;
  o.profiler_warmup = 3;
  o.profiler_active = 2;
  StepProfiler p(o, 0);
  // wait = 10 - 3 - 2 = 5: steps 1-5 idle, 6-8 warm-up, 9-10 recorded, written after 10.
  for (int64_t s = 1; s <= 30; ++s) {
    const int64_t m = (s - 1) % 10 + 1;
    BOOST_TEST(p.records(s) == (m >= 9), "step " << s);
    BOOST_TEST(p.warms_up(s) == (m >= 6 && m <= 8), "step " << s);
    BOOST_TEST(p.writes_after(s) == (m == 10), "step " << s);
  }
  o.enable_profiling = false;
  StepProfiler off(o, 0);
  BOOST_TEST(!off.records(10));
  BOOST_TEST(!off.writes_after(10));
}

BOOST_AUTO_TEST_CASE(profile_options_are_checked) {
  auto make = [](int64_t freq, int64_t warmup, int64_t active) {
    ProfilingOptions o;
    o.enable_profiling = true;
    o.profile_freq = freq;
    o.profiler_warmup = warmup;
    o.profiler_active = active;
    StepProfiler p(o, 0);
  };
  auto message = [&](int64_t f, int64_t w, int64_t a) {
    try {
      make(f, w, a);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  BOOST_TEST(message(0, 0, 1).find("[profiling] profile_freq") != std::string::npos);
  BOOST_TEST(message(10, 0, 0).find("[profiling] profiler_active") != std::string::npos);
  BOOST_TEST(message(10, -1, 1).find("[profiling] profiler_warmup") != std::string::npos);
  BOOST_TEST(message(10, 9, 2).find("<= profile_freq (10)") != std::string::npos);
  BOOST_CHECK_NO_THROW(make(10, 9, 1));
}

BOOST_AUTO_TEST_CASE(step_profiler_writes_only_the_active_window) {
  const fs::path dir = tmp_dir("profiler");
  ProfilingOptions o;
  o.enable_profiling = true;
  o.save_traces_folder = dir.string();
  o.profile_freq = 5;
  o.profiler_warmup = 1;
  o.profiler_active = 2;
  std::vector<std::string> written;
  {
    StepProfiler p(o, 1);
    for (int64_t step = 1; step <= 10; ++step) {
      p.begin_step(step);
      {
        trace::Span s("step " + std::to_string(step), "step");
        trace::Span opt("optimizer", "optimizer");
      }
      const std::string path = p.end_step(step);
      if (!path.empty()) written.push_back(path);
      BOOST_TEST(trace::enabled() == (step == 3 || step == 4 || step == 8 || step == 9), "step " << step);
    }
  }
  BOOST_TEST(!trace::enabled());
  BOOST_REQUIRE(written.size() == 2u);
  BOOST_TEST(written[0] == chrome_trace_path(dir.string(), 5, 1));
  BOOST_TEST(written[1] == chrome_trace_path(dir.string(), 10, 1));
  for (int w = 0; w < 2; ++w) {
    std::vector<std::string> steps;
    const json doc = read_json(written[size_t(w)]);
    for (const json& e : doc["traceEvents"])
      if (e["ph"] == "X" && e["cat"] == "step") steps.push_back(e["name"]);
    // Steps 4 and 5 (9 and 10); the warm-up step 3 (8) was recorded and discarded.
    const std::vector<std::string> expect = w == 0 ? std::vector<std::string>{"step 4", "step 5"}
                                                   : std::vector<std::string>{"step 9", "step 10"};
    BOOST_TEST(steps == expect, "window " << w);
  }
}

BOOST_AUTO_TEST_CASE(unwritable_trace_folder_names_the_folder) {
  const fs::path dir = tmp_dir("unwritable");
  const fs::path file = dir / "a_file";
  std::ofstream(file) << "x";
  try {
    write_chrome_trace((file / "sub").string(), 1, 0, trace::Recording{});
    BOOST_FAIL("expected an error");
  } catch (const std::runtime_error& e) {
    BOOST_TEST(std::string(e.what()).find((file / "sub").string()) != std::string::npos);
  }
}
