// Implements bench_report.h: collects the figures a bench program prints and
// writes them, with the machine, commit and date, as one JSON document.
#include "tests/bench/bench_report.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "common/clock.h"

namespace fwai::testing {
namespace {

std::string FirstLineValue(const std::string& path, const std::string& key, char sep) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) != 0) continue;
    size_t at = line.find(sep);
    if (at == std::string::npos) continue;
    std::string v = line.substr(at + 1);
    v.erase(0, v.find_first_not_of(" \t\""));
    while (!v.empty() && (v.back() == '"' || v.back() == ' ')) v.pop_back();
    return v;
  }
  return "";
}

}  // namespace

BenchReport::Json MachineJson() {
  BenchReport::Json m;
  m["cpu"] = FirstLineValue("/proc/cpuinfo", "model name", ':');
  m["cores"] = std::thread::hardware_concurrency();
  std::string kb = FirstLineValue("/proc/meminfo", "MemTotal", ':');
  double gb = std::strtod(kb.c_str(), nullptr) / (1024.0 * 1024.0);
  m["memory_gb"] = static_cast<double>(static_cast<int>(gb * 10 + 0.5)) / 10;
  m["os"] = FirstLineValue("/etc/os-release", "PRETTY_NAME", '=');
  std::ifstream k("/proc/sys/kernel/osrelease");
  std::string kernel;
  std::getline(k, kernel);
  m["kernel"] = kernel;
  return m;
}

void BenchReport::Init(std::string bench, int argc, char** argv) {
  bench_ = std::move(bench);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json" && i + 1 < argc) {
      path_ = argv[++i];
      continue;
    }
    if (a == "--quick") quick_ = true;
    args_.push_back(a);
  }
}

BenchReport::Json& BenchReport::Add(const std::string& id, const std::string& measure,
                                    const std::string& input, double value,
                                    const std::string& unit) {
  Json r;
  r["id"] = id;
  r["measure"] = measure;
  r["input"] = input;
  r["value"] = value;
  r["unit"] = unit;
  results_.push_back(std::move(r));
  return results_.back();
}

const BenchReport::Json* BenchReport::Find(const std::string& id) const {
  for (const auto& r : results_) {
    if (r["id"] == id) return &r;
  }
  return nullptr;
}

void BenchReport::SetBaseline(Json& result, const std::string& baseline_id,
                              const std::string& name) {
  const Json* b = Find(baseline_id);
  if (b == nullptr) return;
  result["baseline"] = {{"id", baseline_id}, {"name", name}, {"value", (*b)["value"]}};
}

bool BenchReport::Write() const {
  if (path_.empty()) return true;
  Json doc;
  doc["bench"] = bench_;
  const char* commit = std::getenv("FWAI_COMMIT");
  doc["commit"] = commit != nullptr && *commit != '\0' ? commit : "unknown";
  doc["date"] = FormatUtc(NowMicros());
  doc["machine"] = MachineJson();
  doc["quick"] = quick_;
  doc["args"] = args_;
  doc["results"] = Json::array();
  for (const auto& r : results_) doc["results"].push_back(r);
  std::ofstream out(path_, std::ios::trunc);
  out << doc.dump(2) << "\n";
  if (!out.good()) {
    std::fprintf(stderr, "cannot write %s\n", path_.c_str());
    return false;
  }
  return true;
}

BenchReport& Report() {
  static BenchReport report;
  return report;
}

}  // namespace fwai::testing
