// fwai_register_bench: register truth's recall and precision per kind of
// error on correct code for two vendors' parts with one error made at a time
// (register_eval.h), and the checker's time per 1,000 lines. With
// --update-doc FILE, the table between the register-bench markers in FILE is
// replaced by this run's; with --json FILE the figures are written there too
// (bench_report.h).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/firmware/check_registers.h"
#include "server/firmware/register_check.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/bench/register_eval.h"

namespace fs = std::filesystem;
using fwai::testing::EvaluateRegisterChecks;

namespace {

std::string ReadAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Milliseconds per 1,000 lines: the median of `rounds` checks of every
// corpus file against its part's SVD (parsed once).
double MsPerKiloLine(const std::string& corpus, const std::string& svd_dir, int rounds,
                     int* lines) {
  fwai::SvdCatalog catalog({svd_dir});
  std::vector<std::pair<std::shared_ptr<const fwai::SvdDevice>, std::vector<std::string>>> work;
  for (const auto& part : fs::directory_iterator(corpus)) {
    if (!part.is_directory()) continue;
    auto svd = catalog.FindForPart(part.path().filename().string());
    if (!svd.ok()) continue;
    auto device = catalog.Load(fwai::LocalFileAccess(), *svd);
    if (!device.ok()) continue;
    std::vector<std::string> texts;
    for (const auto& f : fs::directory_iterator(part.path())) texts.push_back(ReadAll(f.path()));
    work.emplace_back(*device, std::move(texts));
  }
  std::vector<double> per_kline;
  for (int r = 0; r < rounds; ++r) {
    int n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& [device, texts] : work) {
      fwai::RegisterChecker checker(*device);
      for (const auto& t : texts) checker.Check("f.c", t);
      n += checker.stats().lines;
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    per_kline.push_back(ms * 1000.0 / std::max(1, n));
    *lines = n;
  }
  return fwai::testing::Median(per_kline);
}

}  // namespace

int main(int argc, char** argv) {
  std::string doc;
  auto& report = fwai::testing::Report();
  report.Init("fwai_register_bench", argc, argv);
  const bool quick = report.quick();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--update-doc" && i + 1 < argc) doc = argv[++i];
  }
  const std::string corpus = std::string(FWAI_SOURCE_DIR) + "/tests/bench/registers";
  const std::string svd_dir = std::string(FWAI_SOURCE_DIR) + "/data/svd";
  const auto r = EvaluateRegisterChecks(corpus, svd_dir);
  int lines = 0;
  const double ms = MsPerKiloLine(corpus, svd_dir, quick ? 20 : 200, &lines);
  std::string table =
      "| kind of error | made | found at its line | recall | findings on other lines "
      "|\n|---|---|---|---|---|\n";
  int injected = 0, found = 0, wrong = 0;
  for (const auto& [kind, k] : r.kinds) {
    absl::StrAppend(&table, "| ", kind, " | ", k.injected, " | ", k.found, " | ",
                    absl::StrFormat("%.2f", k.injected ? double(k.found) / k.injected : 0), " | ",
                    k.false_findings, " |\n");
    injected += k.injected;
    found += k.found;
    wrong += k.false_findings;
  }
  absl::StrAppend(&table, "| **all** | ", injected, " | ", found, " | ",
                  absl::StrFormat("**%.3f**", injected ? double(found) / injected : 0), " | ",
                  wrong, " |\n\n", "Correct files: ", r.clean_files, " (", r.clean_lines,
                  " lines, STM32F100 and LM3S6965), findings on them: **", r.clean_findings,
                  "**. Precision (findings at the changed line among all findings): **",
                  absl::StrFormat("%.3f", found + wrong ? double(found) / (found + wrong) : 1.0),
                  "**. Time: **", absl::StrFormat("%.2f ms per 1,000 lines", ms), "** (median of ",
                  quick ? 20 : 200, " checks of the ", lines, " lines, the SVD parsed once).\n");
  std::printf("%s", table.c_str());
  for (const auto& m : r.misses) std::printf("missed: %s\n", m.c_str());
  std::printf(
      "RESULT register_recall %.3f\nRESULT register_false_findings %d\nRESULT "
      "register_ms_per_kline %.3f\n",
      injected ? double(found) / injected : 0, wrong + r.clean_findings, ms);
  const std::string corpus_text = absl::StrCat(
      r.clean_files, " correct files (", r.clean_lines,
      " lines, STM32F100 and LM3S6965), one error made at a time: ", injected, " errors");
  auto& recall = report.Add("register_recall", "recall: errors found at their line", corpus_text,
                            injected ? double(found) / injected : 0, "");
  recall["also"] = {{{"label", "precision"},
                     {"value", found + wrong ? double(found) / (found + wrong) : 1.0},
                     {"unit", ""}},
                    {{"label", "findings on other lines"}, {"value", wrong}, {"unit", ""}}};
  report.Add("register_clean_findings", "findings on the correct files", corpus_text,
             r.clean_findings, "findings");
  report.Add("register_ms_per_kline", "checker time per 1,000 lines",
             absl::StrCat("median of ", quick ? 20 : 200, " checks of the ", lines,
                          " lines, the SVD parsed once"),
             ms, "ms");
  if (!doc.empty()) {
    std::string text = ReadAll(doc);
    const std::string begin =
        "<!-- register-bench: generated by build/bin/fwai_register_bench --update-doc -->\n";
    const std::string end = "<!-- /register-bench -->";
    const size_t a = text.find(begin), b = text.find(end);
    if (a == std::string::npos || b == std::string::npos || b < a) {
      std::fprintf(stderr, "%s: no register-bench markers\n", doc.c_str());
      return 2;
    }
    text.replace(a + begin.size(), b - a - begin.size(), table);
    std::ofstream(doc, std::ios::trunc) << text;
  }
  return report.Write() ? 0 : 1;
}
