// fwai_kb_bench: knowledge-base figures.
//   search   p50/p95 of hybrid + rerank search over a synthetic 100k-chunk collection
//   start    daemon start with that collection until a search answers
//   ingest   PDF pages/s (built-in embedder, no external calls)
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "client/lib/client.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/reranker.h"
#include "server/storage/storage.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/pdf_writer.h"

using namespace fwai;
namespace fs = std::filesystem;

namespace {

double Pct(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

double Secs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Zipf-ish vocabulary of words plus register-like identifiers.
struct Vocab {
  std::vector<std::string> words;
  std::mt19937 rng{7};
  Vocab() {
    const char* syll[] = {"con", "fig", "reg", "ister", "clock", "en", "able", "pin", "mode", "tim", "er",
                          "dma", "chan", "nel", "int", "err", "upt", "flag", "stat", "us", "ctrl", "data",
                          "buf", "fer", "level", "edge", "trig", "ger", "pow", "wake", "sleep", "reset"};
    for (int i = 0; i < 20000; ++i) {
      std::string w;
      int n = 1 + rng() % 3;
      for (int k = 0; k < n; ++k) w += syll[rng() % 32];
      if (i % 10 == 0) w = "REG" + std::to_string(i) + "_" + w;
      words.push_back(w);
    }
  }
  const std::string& Pick() {
    // Skewed: low indexes far more often.
    double u = std::uniform_real_distribution<double>(0, 1)(rng);
    size_t i = static_cast<size_t>(std::pow(u, 3.0) * words.size());
    return words[std::min(i, words.size() - 1)];
  }
};

}  // namespace

int main(int argc, char** argv) {
  size_t target_chunks = 100000;
  std::string pdf_dir;
  std::string keep;  // --data DIR: build the collection there once, reuse it after
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") target_chunks = 20000;
    if (a == "--pdf-dir" && i + 1 < argc) pdf_dir = argv[++i];
    if (a == "--data" && i + 1 < argc) keep = argv[++i];
  }
  std::printf("fwai_kb_bench  commit: %s\n", std::getenv("FWAI_COMMIT") ? std::getenv("FWAI_COMMIT") : "?");
  const std::string dir = keep.empty() ? testing::MakeTempDir("fwai-kb-bench-") : keep;
  const bool reuse = !keep.empty() && fs::exists(keep + "/data/db");
  Vocab vocab;
  auto embedder = MakeBuiltinEmbedder(256);
  auto reranker = MakeBuiltinReranker();
  std::vector<std::string> queries;
  {
    auto storage = Storage::Open(dir + "/data/db");
    auto kb = KnowledgeBase::Open(**storage, dir + "/data/index", {}, *embedder, *reranker);
    if (!kb.ok()) {
      std::fprintf(stderr, "%s\n", kb.status().ToString().c_str());
      return 1;
    }
    // --- Ingest: PDF pages/s.
    if (!reuse) {
      std::vector<std::string> pages;
      for (int p = 0; p < 200; ++p) {
        std::string text = std::to_string(p + 1) + ".1 Section about " + vocab.Pick() + "\n";
        for (int l = 0; l < 40; ++l) {
          std::string line;
          for (int w = 0; w < 10; ++w) line += vocab.Pick() + " ";
          text += line + "\n";
        }
        pages.push_back(text);
      }
      std::string pdf = testing::MakePdf(pages);
      auto t0 = std::chrono::steady_clock::now();
      IngestRequest r;
      r.name = "synthetic-manual.pdf";
      r.bytes = pdf;
      auto res = (*kb)->Ingest(std::move(r));
      double s = Secs(t0);
      std::printf("RESULT ingest_pdf pages=%d seconds=%.3f pages_per_s=%.1f chunks=%d (synthetic, %.1f KB of text/page) target>=50\n",
                  res.ok() ? res->pages : 0, s, res.ok() ? res->pages / s : 0.0, res.ok() ? res->chunks : 0,
                  pages[0].size() / 1024.0);
      for (const auto& entry : pdf_dir.empty() ? std::vector<fs::path>{} : std::vector<fs::path>{fs::directory_iterator(pdf_dir), {}}) {
        if (entry.extension() != ".pdf") continue;
        std::ifstream f(entry, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        auto t1 = std::chrono::steady_clock::now();
        IngestRequest pr;
        const std::string fname = entry.filename().string();
        pr.name = fname;
        pr.bytes = bytes;
        auto pres = (*kb)->Ingest(std::move(pr));
        double ps = Secs(t1);
        if (pres.ok()) {
          std::printf("RESULT ingest_pdf file=%s pages=%d seconds=%.3f pages_per_s=%.1f chunks=%d\n", fname.c_str(),
                      pres->pages, ps, pres->pages / ps, pres->chunks);
        }
      }
    }
    // --- A synthetic collection of ~target_chunks chunks (markdown, one H2 section a chunk).
    auto t0 = std::chrono::steady_clock::now();
    size_t chunks = reuse ? static_cast<size_t>((*kb)->Stats("")->chunks) : 0;
    int doc = 0;
    while (chunks < target_chunks) {
      std::string md = "# Device " + std::to_string(doc) + "\n\n";
      for (int s = 0; s < 100; ++s) {
        md += "## " + vocab.Pick() + " " + std::to_string(s) + "\n\n";
        for (int w = 0; w < 180; ++w) md += vocab.Pick() + (w % 15 == 14 ? ".\n" : " ");
        md += "\n\n";
      }
      IngestRequest r;
      r.name = "device" + std::to_string(doc++) + ".md";
      r.bytes = md;
      auto res = (*kb)->Ingest(std::move(r));
      if (!res.ok()) {
        std::fprintf(stderr, "%s\n", res.status().ToString().c_str());
        return 1;
      }
      chunks += res->chunks;
    }
    std::printf("built collection: %zu chunks in %d documents in %.1f s\n", chunks, doc, Secs(t0));
    auto stats = (*kb)->Stats("");
    std::printf("indexes: %s, %s\n", stats->index_kinds[0].c_str(), stats->index_kinds[1].c_str());
    // --- Search latency.
    for (int q = 0; q < 300; ++q) {
      std::string text;
      int n = 3 + q % 6;
      for (int w = 0; w < n; ++w) text += vocab.Pick() + " ";
      queries.push_back(text);
    }
    for (bool rerank : {false, true}) {
      std::vector<double> ms;
      for (const auto& q : queries) {
        KbSearchRequest r;
        r.query = q;
        r.rerank = rerank;
        auto t1 = std::chrono::steady_clock::now();
        auto hits = (*kb)->Search(r);
        ms.push_back(Secs(t1) * 1000);
        if (!hits.ok()) return 1;
      }
      std::printf("RESULT search_ms chunks=%zu mode=hybrid%s p50=%.2f p95=%.2f max=%.2f (%zu queries of 3-8 words) target p95<=30\n",
                  chunks, rerank ? "+rerank" : "", Pct(ms, 0.5), Pct(ms, 0.95), Pct(ms, 1.0), ms.size());
    }
    auto save0 = std::chrono::steady_clock::now();
    (void)(*kb)->SaveIndexes();
    std::printf("indexes saved in %.2f s\n", Secs(save0));
  }
  // --- Daemon start with the collection until a search answers.
  std::vector<double> starts;
  for (int run = 0; run < 3; ++run) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      std::string bin = std::string(FWAI_BIN_DIR) + "/fwaid";
      std::string listen = "unix:" + dir + "/s.sock";
      std::string data = dir + "/data";
      execl(bin.c_str(), bin.c_str(), "--listen", listen.c_str(), "--data-dir", data.c_str(), "--log-level", "warn",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    auto addr = ResolveDaemonAddress("unix:" + dir + "/s.sock");
    bool answered = false;
    for (int i = 0; i < 3000 && !answered; ++i) {
      auto ch = ConnectToDaemon(*addr, false, 50);
      if (!ch.ok()) {
        usleep(2000);
        continue;
      }
      auto stub = fwai::v1::Knowledge::NewStub(*ch);
      grpc::ClientContext ctx;
      fwai::v1::SearchRequest req;
      req.set_query(queries[0]);
      fwai::v1::SearchResponse resp;
      answered = stub->Search(&ctx, req, &resp).ok() && resp.results_size() > 0;
    }
    starts.push_back(Secs(t0));
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    if (!answered) {
      std::fprintf(stderr, "daemon did not answer a search\n");
      return 1;
    }
  }
  std::printf("RESULT start_to_first_search_s median=%.3f (runs %.3f %.3f %.3f; %zu-chunk collection) target<=1\n",
              Pct(starts, 0.5), starts[0], starts[1], starts[2], target_chunks);
  if (keep.empty()) fs::remove_all(dir);
  return 0;
}
