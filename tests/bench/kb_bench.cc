// fwai_kb_bench: knowledge-base figures.
//   fwai_kb_bench [--chunks N] [--quick] [--data DIR] [--pdf-dir DIR]
//                 [--ivf-max-probe-share S] [--vector-min-recall R] [--name SUFFIX]
//     builds a synthetic collection of N chunks (default 100,000; --quick
//     20,000) through the knowledge base and reports: ingest throughput and
//     the process's peak memory while building; index files on disk; search
//     p50/p95 without and with rerank (passages on, as `kb search` answers);
//     PDF ingest pages/s into the collection at that size; then a real fwaid
//     on the collection: start until a search answers, and its memory after
//     300 searches. With --search-during-build, a thread searches while the
//     collection builds (one search every 10 ms; the collection passes exact
//     search and the vector index trains its lists meanwhile): its latency
//     p50/p99/max.
//   fwai_kb_bench --vector-indexes N [--hnsw-up-to M]
//     the FAISS index choice: flat, HNSW (M=32, efConstruction 80), HNSW over
//     8-bit scalar-quantized vectors, IVF with 8-bit SQ, IVF with PQ (32
//     bytes) over N vectors of synthetic chunks from the built-in embedder:
//     build time, memory, search p50/p95 (k=100, as the knowledge base asks)
//     at the breadth that reaches recall@10 >= 0.95, and that recall. HNSW
//     kinds are skipped above M vectors (default 200,000): their build time
//     alone rules them out there.
//   fwai_kb_bench --lexical-layouts N
//     the lexical index's layout over N synthetic chunks: postings as
//     in-memory (doc, tf) pairs loaded from a raw image (the layout before),
//     against compressed postings in a mapped image: size, open time,
//     search p50/p95.
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexIVFPQ.h>
#include <faiss/IndexScalarQuantizer.h>
#include <faiss/utils/distances.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/lib/client.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "server/knowledge/bm25_index.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/tokenizer.h"
#include "server/storage/storage.h"
#include "tests/bench/bench_report.h"
#include "tests/bench/bench_util.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/pdf_writer.h"

using namespace fwai;
namespace fs = std::filesystem;
using fwai::testing::Median;
using fwai::testing::Percentile;

namespace {

double Secs(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// VmRSS / VmHWM of a process, in MB.
double StatusMb(pid_t pid, const char* field) {
  std::ifstream f(pid == 0 ? std::string("/proc/self/status")
                           : "/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field, 0) == 0) return std::atof(line.c_str() + std::strlen(field) + 1) / 1024.0;
  }
  return 0;
}

double DirMb(const fs::path& p) {
  uintmax_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(p, ec);
       !ec && it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_regular_file(ec)) n += it->file_size(ec);
  }
  return n / 1048576.0;
}

double FileMb(const fs::path& p) {
  std::error_code ec;
  auto n = fs::file_size(p, ec);
  return ec ? 0 : n / 1048576.0;
}

// Zipf-ish vocabulary of words plus register-like identifiers.
struct Vocab {
  std::vector<std::string> words;
  std::mt19937 rng{7};
  Vocab() {
    const char* syll[] = {"con",   "fig",  "reg",  "ister", "clock", "en",   "able",  "pin",
                          "mode",  "tim",  "er",   "dma",   "chan",  "nel",  "int",   "err",
                          "upt",   "flag", "stat", "us",    "ctrl",  "data", "buf",   "fer",
                          "level", "edge", "trig", "ger",   "pow",   "wake", "sleep", "reset"};
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
  std::string Text(int words_n) {
    std::string t;
    for (int w = 0; w < words_n; ++w) t += Pick() + (w % 15 == 14 ? ".\n" : " ");
    return t;
  }
};

std::vector<std::string> Queries(Vocab& vocab, int n) {
  std::vector<std::string> q;
  for (int i = 0; i < n; ++i) {
    std::string text;
    for (int w = 0; w < 3 + i % 6; ++w) text += vocab.Pick() + " ";
    q.push_back(text);
  }
  return q;
}

// --- The FAISS index choice.
int VectorIndexes(size_t n, size_t hnsw_up_to) {
  Vocab vocab;
  auto embedder = MakeBuiltinEmbedder(256);
  const int dim = 256;
  std::vector<float> data;
  data.reserve(n * dim);
  auto t0 = std::chrono::steady_clock::now();
  for (size_t done = 0; done < n;) {
    std::vector<std::string> texts;
    for (int i = 0; i < 256 && done < n; ++i, ++done) texts.push_back(vocab.Text(180));
    auto v = embedder->Embed(texts, false);
    for (const auto& x : *v) data.insert(data.end(), x.begin(), x.end());
  }
  std::printf("embedded %zu synthetic chunks (256 dims) in %.1f s\n", n, Secs(t0));
  // Queries as the knowledge base embeds them: 3-8 words.
  const int nq = 200;
  std::vector<float> queries;
  for (const auto& q : Queries(vocab, nq)) {
    auto v = embedder->Embed({q}, true);
    queries.insert(queries.end(), (*v)[0].begin(), (*v)[0].end());
  }
  const int k10 = 10, k = 100;
  std::vector<float> d10(nq * k10);
  std::vector<faiss::Index::idx_t> truth(nq * k10);
  faiss::knn_inner_product(queries.data(), data.data(), dim, nq, n, k10, d10.data(), truth.data());
  auto recall = [&](faiss::Index& idx) {
    std::vector<float> d(nq * k10);
    std::vector<faiss::Index::idx_t> got(nq * k10);
    idx.search(nq, queries.data(), k10, d.data(), got.data());
    size_t hits = 0;
    for (int q = 0; q < nq; ++q) {
      for (int a = 0; a < k10; ++a) {
        for (int b = 0; b < k10; ++b) hits += got[q * k10 + a] == truth[q * k10 + b] ? 1 : 0;
      }
    }
    return static_cast<double>(hits) / (nq * k10);
  };
  auto latency = [&](faiss::Index& idx) {
    std::vector<double> ms;
    std::vector<float> d(k);
    std::vector<faiss::Index::idx_t> l(k);
    for (int q = 0; q < nq; ++q) {
      auto t = std::chrono::steady_clock::now();
      idx.search(1, &queries[q * dim], k, d.data(), l.data());
      ms.push_back(Secs(t) * 1000);
    }
    return std::make_pair(Percentile(ms, 0.5), Percentile(ms, 0.95));
  };
  auto report = [&](const char* name, double build_s, double mb, faiss::Index& idx,
                    const std::vector<int>& breadths, const std::function<void(int)>& set,
                    const char* knob) {
    int chosen = breadths.empty() ? 0 : breadths.back();
    double r = 0;
    for (int b : breadths) {
      set(b);
      r = recall(idx);
      chosen = b;
      if (breadths.size() > 1) {
        // The curve: what each breadth costs and reaches.
        auto [c50, c95] = latency(idx);
        std::printf("  %s %s=%d recall@10=%.3f search_ms_p50=%.3f p95=%.3f\n", name, knob, b, r,
                    c50, c95);
      }
      if (r >= 0.95) break;
    }
    if (breadths.empty()) r = recall(idx);
    auto [p50, p95] = latency(idx);
    std::printf(
        "RESULT vector_index kind=%s vectors=%zu build_s=%.1f memory_mb=%.0f %s=%d recall@10=%.3f "
        "search_ms_p50=%.3f p95=%.3f (k=100)\n",
        name, n, build_s, mb, knob, chosen, r, p50, p95);
    auto& res = testing::Report().Add(
        std::string("vector_index_") + name, std::string("vector index ") + name + ", search",
        std::to_string(n) + " vectors, k=100, " + knob + "=" + std::to_string(chosen) +
            " (recall@10 " + std::to_string(r).substr(0, 5) + ")",
        p95, "ms");
    res["p50"] = p50;
    res["p95"] = p95;
    res["also"] = {{{"label", "build"}, {"value", build_s}, {"unit", "s"}},
                   {{"label", "memory"}, {"value", mb}, {"unit", "MB"}},
                   {{"label", "recall@10"}, {"value", r}, {"unit", ""}}};
  };
  {
    auto t = std::chrono::steady_clock::now();
    faiss::IndexFlatIP flat(dim);
    flat.add(n, data.data());
    report(
        "flat", Secs(t), n * dim * 4 / 1048576.0, flat, {}, [](int) {}, "-");
  }
  if (n <= hnsw_up_to) {
    auto t = std::chrono::steady_clock::now();
    faiss::IndexHNSWFlat h(dim, 32, faiss::METRIC_INNER_PRODUCT);
    h.hnsw.efConstruction = 80;
    h.add(n, data.data());
    const double mb = (n * dim * 4 + h.hnsw.neighbors.size() * 4) / 1048576.0;
    report(
        "hnsw32-flat", Secs(t), mb, h, {16, 32, 64, 128, 256, 512, 1024},
        [&](int e) { h.hnsw.efSearch = e; }, "efSearch");
    t = std::chrono::steady_clock::now();
    faiss::IndexHNSWSQ hs(dim, faiss::ScalarQuantizer::QT_8bit, 32, faiss::METRIC_INNER_PRODUCT);
    hs.hnsw.efConstruction = 80;
    hs.train(std::min<size_t>(n, 100000), data.data());
    hs.add(n, data.data());
    const double mbs = (n * dim + hs.hnsw.neighbors.size() * 4) / 1048576.0;
    report(
        "hnsw32-sq8", Secs(t), mbs, hs, {16, 32, 64, 128, 256, 512, 1024},
        [&](int e) { hs.hnsw.efSearch = e; }, "efSearch");
  } else {
    std::printf("hnsw kinds skipped at %zu vectors (above --hnsw-up-to %zu)\n", n, hnsw_up_to);
  }
  size_t lists = 16;  // as the knowledge base picks them
  while (lists * 2 <= std::min(4 * std::sqrt(static_cast<double>(n)), n / 64.0) && lists < 65536)
    lists *= 2;
  const size_t train_n = std::min(n, lists * 64);
  std::vector<int> probes;
  for (int p = 1; p <= static_cast<int>(lists); p *= 2) probes.push_back(p);
  {
    auto t = std::chrono::steady_clock::now();
    faiss::IndexFlatIP* q = new faiss::IndexFlatIP(dim);
    faiss::IndexIVFScalarQuantizer ivf(q, dim, lists, faiss::ScalarQuantizer::QT_8bit,
                                       faiss::METRIC_INNER_PRODUCT, false);
    ivf.own_fields = true;
    ivf.train(train_n, data.data());
    ivf.add(n, data.data());
    const double mb = (n * (ivf.code_size + 8) + lists * dim * 4) / 1048576.0;
    report(
        "ivf-sq8", Secs(t), mb, ivf, probes, [&](int p) { ivf.nprobe = p; }, "nprobe");
  }
  {
    auto t = std::chrono::steady_clock::now();
    faiss::IndexFlatIP* q = new faiss::IndexFlatIP(dim);
    faiss::IndexIVFPQ ivf(q, dim, lists, 32, 8, faiss::METRIC_INNER_PRODUCT);
    ivf.own_fields = true;
    ivf.train(train_n, data.data());
    ivf.add(n, data.data());
    const double mb = (n * (ivf.code_size + 8) + lists * dim * 4) / 1048576.0;
    report(
        "ivf-pq32", Secs(t), mb, ivf, probes, [&](int p) { ivf.nprobe = p; }, "nprobe");
  }
  return 0;
}

// --- The lexical layout.
int LexicalLayouts(size_t n, const std::string& dir) {
  Vocab vocab;
  Bm25Index idx;
  auto t0 = std::chrono::steady_clock::now();
  std::vector<std::string> terms;
  for (size_t i = 0; i < n; ++i) {
    terms.clear();
    Tokenize("device" + std::to_string(i / 100) + ".md section " + vocab.Text(180), &terms);
    idx.Add(static_cast<uint32_t>(i), terms);
  }
  std::printf("indexed %zu synthetic chunks in %.1f s; %zu terms\n", n, Secs(t0), idx.num_terms());
  std::vector<std::vector<std::string>> queries;
  for (const auto& q : Queries(vocab, 300)) {
    std::vector<std::string> t;
    Tokenize(q, &t);
    queries.push_back(t);
  }
  // Adding a 200-page manual's worth of chunks (600) to an index of n:
  // five times, fresh ids each, the median and the largest.
  uint32_t next_id = static_cast<uint32_t>(n) + 1000;
  auto time_add = [&](Bm25Index& x, const char* kind) {
    std::vector<double> ms;
    for (int round = 0; round < 5; ++round) {
      std::vector<std::vector<std::string>> docs(600);
      for (auto& d : docs) Tokenize("manual.pdf section " + vocab.Text(180), &d);
      auto t = std::chrono::steady_clock::now();
      for (auto& d : docs) x.Add(next_id++, d);
      ms.push_back(Secs(t) * 1000);
    }
    std::string each;
    for (double m : ms) each += absl::StrCat(" ", static_cast<int>(m));
    std::printf("RESULT lexical_add kind=%s chunks=%zu added=600 ms_p50=%.1f max=%.1f (each:%s)\n",
                kind, n, Percentile(ms, 0.5), *std::max_element(ms.begin(), ms.end()),
                each.c_str());
    auto& res = testing::Report().Add(std::string("lexical_add_") + kind,
                                      std::string("lexical index, ") + kind + ": adding 600 chunks",
                                      std::to_string(n) + " chunks", Percentile(ms, 0.5), "ms");
    res["also"] = {{{"label", "max of 5"},
                    {"value", *std::max_element(ms.begin(), ms.end())},
                    {"unit", "ms"}}};
  };
  auto latency = [&](const Bm25Index& x) {
    std::vector<double> ms;
    for (const auto& q : queries) {
      auto t = std::chrono::steady_clock::now();
      (void)x.Search(q, 100);
      ms.push_back(Secs(t) * 1000);
    }
    return std::make_pair(Percentile(ms, 0.5), Percentile(ms, 0.95));
  };
  // The layout before: (doc, tf) u32 pairs per term, read whole into memory.
  const double pair_mb = idx.mutable_bytes() / 1048576.0;
  {
    const std::string raw = dir + "/raw-pairs.bin";
    {
      // The same bytes the old image held for postings: write them, then time reading them back
      // into vectors.
      std::ofstream f(raw, std::ios::binary);
      std::vector<char> chunk(idx.mutable_bytes() > (64u << 20) ? (64u << 20)
                                                                : idx.mutable_bytes() + 1);
      size_t left = idx.mutable_bytes();
      while (left > 0) {
        const size_t take = std::min(left, chunk.size());
        f.write(chunk.data(), static_cast<std::streamsize>(take));
        left -= take;
      }
    }
    auto t = std::chrono::steady_clock::now();
    std::ifstream f(raw, std::ios::binary | std::ios::ate);
    std::vector<char> all(static_cast<size_t>(f.tellg()));
    f.seekg(0);
    f.read(all.data(), static_cast<std::streamsize>(all.size()));
    std::vector<uint32_t> copy(all.size() / 4);
    std::memcpy(copy.data(), all.data(), copy.size() * 4);
    const double open_s = Secs(t);
    auto [p50, p95] = latency(idx);
    std::printf(
        "RESULT lexical_layout kind=pairs-in-memory chunks=%zu image_mb=%.0f resident_mb=%.0f "
        "open_s=%.2f (read + copy, page cache warm) search_ms_p50=%.2f p95=%.2f\n",
        n, pair_mb, pair_mb, open_s, p50, p95);
    auto& res =
        testing::Report().Add("lexical_layout_pairs", "lexical index, pairs in memory: search",
                              std::to_string(n) + " chunks", p95, "ms");
    res["p50"] = p50;
    res["p95"] = p95;
    res["also"] = {{{"label", "image"}, {"value", pair_mb}, {"unit", "MB"}},
                   {{"label", "open"}, {"value", open_s}, {"unit", "s"}}};
    fs::remove(raw);
  }
  {
    const std::string path = dir + "/lexical.bm25";
    auto t = std::chrono::steady_clock::now();
    if (auto s = idx.Save(path, 1); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double save_s = Secs(t);
    // Warm the page cache, then time the open as a restart does.
    { auto warm = Bm25Index::Load(path, 1); }
    t = std::chrono::steady_clock::now();
    auto mapped = Bm25Index::Load(path, 1);
    const double open_s = Secs(t);
    if (!mapped.ok()) {
      std::fprintf(stderr, "%s\n", mapped.status().ToString().c_str());
      return 1;
    }
    auto [p50, p95] = latency(**mapped);
    std::printf(
        "RESULT lexical_layout kind=compressed-mapped chunks=%zu image_mb=%.0f save_s=%.2f "
        "open_s=%.3f "
        "(map + checksum, page cache warm) search_ms_p50=%.2f p95=%.2f\n",
        n, FileMb(path), save_s, open_s, p50, p95);
    auto& res = testing::Report().Add("lexical_layout_mapped",
                                      "lexical index, compressed and mapped: search",
                                      std::to_string(n) + " chunks", p95, "ms");
    res["p50"] = p50;
    res["p95"] = p95;
    res["also"] = {{{"label", "image"}, {"value", FileMb(path)}, {"unit", "MB"}},
                   {{"label", "open"}, {"value", open_s}, {"unit", "s"}}};
    time_add(**mapped, "mapped");
    fs::remove(path);
  }
  time_add(idx, "in-memory");
  return 0;
}

// Where a search's time went: the median of each stage the knowledge base
// timed (KbSearchInfo::stages_ms), those of at least 0.01 ms, beside the
// median of the whole search inside it.
void ReportStages(size_t chunks, bool rerank, const std::vector<double>& took,
                  const std::vector<std::pair<std::string, std::vector<double>>>& stages) {
  std::printf("RESULT search_stages chunks=%zu mode=hybrid%s took_p50=%.2f", chunks,
              rerank ? "+rerank" : "", Median(took));
  auto also = testing::BenchReport::Json::array();
  for (const auto& [name, ms] : stages) {
    std::printf(" %s=%.2f/%.2f", name.c_str(), Median(ms), Percentile(ms, 0.95));
    if (Median(ms) >= 0.01)
      also.push_back({{"label", name}, {"value", Median(ms)}, {"unit", "ms"}});
  }
  std::printf(" (stage=p50/p95 ms)\n");
  auto& r = testing::Report().Add(
      rerank ? "search_rerank_stages" : "search_stages",
      rerank ? "search, hybrid + rerank: median by stage" : "search, hybrid: median by stage",
      absl::StrCat(chunks, "-chunk collection, the same queries, inside the knowledge base"),
      Median(took), "ms");
  r["also"] = std::move(also);
}

}  // namespace

static int Run(int argc, char** argv) {
  size_t target_chunks = 100000;
  std::string pdf_dir;
  std::string keep;  // --data DIR: build the collection there once, reuse it after
  size_t vector_n = 0, lexical_n = 0, hnsw_up_to = 200000;
  std::string skip;
  int manuals = 1;
  bool search_during_build = false;
  KnowledgeOptions kb_options;
  setvbuf(stdout, nullptr, _IOLBF, 0);  // RESULT lines show as they come, also into a file
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--quick") target_chunks = 20000;
    if (a == "--chunks" && i + 1 < argc) target_chunks = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--pdf-dir" && i + 1 < argc) pdf_dir = argv[++i];
    if (a == "--data" && i + 1 < argc) keep = argv[++i];
    if (a == "--vector-indexes" && i + 1 < argc) vector_n = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--hnsw-up-to" && i + 1 < argc) hnsw_up_to = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--lexical-layouts" && i + 1 < argc) lexical_n = std::strtoull(argv[++i], nullptr, 10);
    if (a == "--ivf-max-probe-share" && i + 1 < argc)
      kb_options.ivf_max_probe_share = std::strtod(argv[++i], nullptr);
    // 0: keep the approximate index whatever its recall (as before an index
    // could be off), to compare in one run.
    if (a == "--vector-min-recall" && i + 1 < argc)
      kb_options.vector_min_recall = std::strtod(argv[++i], nullptr);
    // --skip search,pdf,start: leave those measurements out (shorter runs
    // on a kept collection while working on one of the others).
    if (a == "--skip" && i + 1 < argc) skip = argv[++i];
    if (a == "--pdfs" && i + 1 < argc) manuals = std::atoi(argv[++i]);
    if (a == "--search-during-build") search_during_build = true;
  }
  testing::Report().SetQuick(target_chunks < 100000);  // 100,000 chunks is the full run
  auto skipped = [&skip](const std::string& what) {
    return ("," + skip + ",").find("," + what + ",") != std::string::npos;
  };
  std::printf("fwai_kb_bench  commit: %s\n",
              std::getenv("FWAI_COMMIT") ? std::getenv("FWAI_COMMIT") : "?");
  if (vector_n > 0) return VectorIndexes(vector_n, hnsw_up_to);
  if (lexical_n > 0) {
    const std::string d = testing::MakeTempDir("fwai-kb-lex-");
    const int rc = LexicalLayouts(lexical_n, d);
    fs::remove_all(d);
    return rc;
  }
  const std::string dir = keep.empty() ? testing::MakeTempDir("fwai-kb-bench-") : keep;
  const bool reuse = !keep.empty() && fs::exists(keep + "/data/db");
  Vocab vocab;
  auto embedder = MakeBuiltinEmbedder(256);
  auto reranker = MakeBuiltinReranker();
  std::vector<std::string> queries;
  size_t chunks = 0;
  {
    auto storage = Storage::Open(dir + "/data/db");
    if (!storage.ok()) {
      std::fprintf(stderr, "%s\n", storage.status().ToString().c_str());
      return 1;
    }
    auto kb = KnowledgeBase::Open(**storage, dir + "/data/index", kb_options, *embedder, *reranker);
    if (!kb.ok()) {
      std::fprintf(stderr, "%s\n", kb.status().ToString().c_str());
      return 1;
    }
    // --- A synthetic collection of ~target_chunks chunks (markdown, one H2 section a chunk).
    auto t0 = std::chrono::steady_clock::now();
    chunks = reuse ? static_cast<size_t>((*kb)->Stats("")->chunks) : 0;
    const size_t had = chunks;
    int doc = 0;
    // Searches beside the build (--search-during-build).
    std::atomic<bool> building{true};
    std::vector<double> during_ms;
    std::thread searcher;
    if (search_during_build) {
      searcher = std::thread([&, asked = Queries(vocab, 50)] {
        for (size_t i = 0; building.load(); ++i) {
          KbSearchRequest r;
          r.query = asked[i % asked.size()];
          r.log = false;
          const auto t = std::chrono::steady_clock::now();
          (void)(*kb)->Search(r);
          during_ms.push_back(Secs(t) * 1000);
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      });
    }
    while (chunks < target_chunks) {
      std::string md = "# Device " + std::to_string(doc) + "\n\n";
      for (int s = 0; s < 100; ++s) {
        md += "## " + vocab.Pick() + " " + std::to_string(s) + "\n\n" + vocab.Text(180) + "\n\n";
      }
      IngestRequest r;
      r.name = "device" + std::to_string(doc++) + ".md";
      r.bytes = md;
      auto res = (*kb)->Ingest(std::move(r));
      if (!res.ok()) {
        std::fprintf(stderr, "%s\n", res.status().ToString().c_str());
        building = false;
        if (searcher.joinable()) searcher.join();
        return 1;
      }
      chunks += res->chunks;
      if (doc % 1000 == 0) {
        std::printf("  %zu chunks, %.0f s, rss %.0f MB\n", chunks, Secs(t0), StatusMb(0, "VmRSS:"));
        std::fflush(stdout);
      }
    }
    const double build_s = Secs(t0);
    building = false;
    if (searcher.joinable()) {
      searcher.join();
      std::printf(
          "RESULT search_during_build chunks=%zu searches=%zu p50=%.2f p99=%.2f max=%.2f ms (one "
          "search every 10 ms while the collection built: hybrid, reranked, passages on)\n",
          chunks - had, during_ms.size(), Percentile(during_ms, 0.5), Percentile(during_ms, 0.99),
          Percentile(during_ms, 1.0));
      auto& r = testing::Report().Add(
          "search_during_build", "search while the collection is built",
          absl::StrCat("one search every 10 ms while ", chunks - had,
                       " chunks are ingested in process (hybrid, reranked, passages on)"),
          Percentile(during_ms, 0.99), "ms");
      r["p50"] = Percentile(during_ms, 0.5);
      r["p99"] = Percentile(during_ms, 0.99);
      r["max"] = Percentile(during_ms, 1.0);
    }
    if (chunks > had) {
      std::printf(
          "RESULT ingest_chunks chunks=%zu documents=%d seconds=%.1f chunks_per_s=%.0f "
          "peak_rss_mb=%.0f\n",
          chunks - had, doc, build_s, (chunks - had) / build_s, StatusMb(0, "VmHWM:"));
      auto& r =
          testing::Report().Add("ingest_chunks", "ingest, Markdown, in process",
                                absl::StrCat(chunks - had, " chunks in ", doc,
                                             " synthetic documents of 100 sections of 180 words"),
                                (chunks - had) / build_s, "chunks/s");
      r["also"] = {{{"label", "took"}, {"value", build_s}, {"unit", "s"}},
                   {{"label", "peak RSS"}, {"value", StatusMb(0, "VmHWM:")}, {"unit", "MB"}}};
    }
    auto t1 = std::chrono::steady_clock::now();
    (void)(*kb)->SaveIndexes();
    std::printf("indexes saved in %.2f s\n", Secs(t1));
    auto stats = (*kb)->Stats("");
    std::printf("indexes: %s, %s\n", stats->index_kinds[0].c_str(), stats->index_kinds[1].c_str());
    std::printf(
        "RESULT index_files chunks=%zu lexical_mb=%.0f vector_mb=%.0f rocksdb_mb=%.0f\n", chunks,
        FileMb(dir + "/data/index/lexical.bm25"),
        FileMb(dir + "/data/index/vectors.faiss") + FileMb(dir + "/data/index/vectors.meta"),
        DirMb(dir + "/data/db"));
    auto& files = testing::Report().Add("index_files", "index files: lexical",
                                        absl::StrCat(chunks, "-chunk collection"),
                                        FileMb(dir + "/data/index/lexical.bm25"), "MB");
    files["also"] = {{{"label", "vectors"},
                      {"value", FileMb(dir + "/data/index/vectors.faiss") +
                                    FileMb(dir + "/data/index/vectors.meta")},
                      {"unit", "MB"}},
                     {{"label", "RocksDB"}, {"value", DirMb(dir + "/data/db")}, {"unit", "MB"}}};
    // --- Search latency (passages on, as kb search answers).
    queries = Queries(vocab, 300);
    for (bool rerank : {false, true}) {
      if (skipped("search")) break;
      std::vector<double> ms, took;
      // Each stage's times, in the order the stages first ran.
      std::vector<std::pair<std::string, std::vector<double>>> stages;
      for (const auto& q : queries) {
        KbSearchRequest r;
        r.query = q;
        r.rerank = rerank;
        r.log = false;
        KbSearchInfo info;
        auto t1 = std::chrono::steady_clock::now();
        auto hits = (*kb)->Search(r, &info);
        ms.push_back(Secs(t1) * 1000);
        if (!hits.ok()) return 1;
        took.push_back(info.took_ms);
        for (const auto& [name, stage_ms] : info.stages_ms) {
          auto it = std::find_if(stages.begin(), stages.end(),
                                 [&name](const auto& s) { return s.first == name; });
          if (it == stages.end()) it = stages.insert(stages.end(), {name, {}});
          it->second.push_back(stage_ms);
        }
      }
      ReportStages(chunks, rerank, took, stages);
      std::printf(
          "RESULT search_ms chunks=%zu mode=hybrid%s p50=%.2f p95=%.2f max=%.2f (%zu queries of "
          "3-8 words, "
          "passages of 400 tokens) target p95<=50 with rerank\n",
          chunks, rerank ? "+rerank" : "", Percentile(ms, 0.5), Percentile(ms, 0.95),
          Percentile(ms, 1.0), ms.size());
      auto& r = testing::Report().Add(
          rerank ? "search_rerank" : "search",
          rerank ? "search, hybrid + rerank" : "search, hybrid",
          absl::StrCat(chunks, "-chunk collection, ", ms.size(),
                       " queries of 3-8 words, passages of 400 tokens, in process"),
          Percentile(ms, 0.95), "ms");
      r["p50"] = Percentile(ms, 0.5);
      r["p95"] = Percentile(ms, 0.95);
      r["max"] = Percentile(ms, 1.0);
      if (rerank) r["target"] = "p95 ≤ 50 ms";
    }
    // --- PDF ingest at this size: 200-page manuals (--pdfs N of them, each
    // new; the first replaces the previous run's) and any in --pdf-dir.
    std::vector<std::pair<std::string, std::string>> pdfs;
    for (int m = 0; m < manuals; ++m) {
      std::vector<std::string> pages;
      // A revision stamp makes each run's manual new (an unchanged one is
      // recognized by its hash and not ingested again).
      const std::string revision =
          std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
      for (int p = 0; p < 200; ++p) {
        std::string text = std::to_string(p + 1) + ".1 Section about " + vocab.Pick() + "\n";
        if (p == 0) text += "Revision " + revision + "\n";
        for (int l = 0; l < 40; ++l) text += vocab.Text(10) + "\n";
        pages.push_back(text);
      }
      pdfs.emplace_back("synthetic-manual-" + std::to_string(chunks) +
                            (m == 0 ? std::string() : "-" + std::to_string(m)) + ".pdf",
                        testing::MakePdf(pages));
    }
    if (!pdf_dir.empty()) {
      for (const auto& entry : fs::directory_iterator(pdf_dir)) {
        if (entry.path().extension() != ".pdf") continue;
        std::ifstream f(entry.path(), std::ios::binary);
        pdfs.emplace_back(
            entry.path().filename().string(),
            std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
      }
    }
    if (skipped("pdf")) pdfs.clear();
    std::vector<double> pdf_rates, pdf_adding;
    for (auto& [name, bytes] : pdfs) {
      IngestRequest r;
      r.name = name;
      r.bytes = bytes;
      auto t2 = std::chrono::steady_clock::now();
      // Where the time goes: each stage until the next one starts.
      std::vector<std::pair<std::string, double>> stages;
      auto last = t2;
      std::string current = "start";
      auto res = (*kb)->Ingest(std::move(r), [&](const std::string& stage) {
        const auto now = std::chrono::steady_clock::now();
        stages.emplace_back(current, std::chrono::duration<double, std::milli>(now - last).count());
        current = stage;
        last = now;
      });
      const double s = Secs(t2);
      if (res.ok() && !res->unchanged) {
        std::string split;
        for (const auto& [stage, ms] : stages) {
          if (stage != "start")
            split += " " + stage + "_ms=" + std::to_string(static_cast<int>(ms));
          if (stage == "adding") pdf_adding.push_back(ms);
        }
        pdf_rates.push_back(res->pages / s);
        char adding[200];
        std::snprintf(
            adding, sizeof adding,
            " (adding: lock %.1f, replaced %.1f, lexical %.1f, vectors %.1f, tables %.1f)",
            res->lock_ms, res->remove_ms, res->lexical_ms, res->vectors_ms, res->tables_ms);
        std::printf("RESULT ingest_pdf_stages file=%s%s%s\n", name.c_str(), split.c_str(), adding);
        std::printf(
            "RESULT ingest_pdf file=%s pages=%d seconds=%.3f pages_per_s=%.0f chunks=%d "
            "into=%zu_chunks "
            "target>=500\n",
            name.c_str(), res->pages, s, res->pages / s, res->chunks, chunks);
        auto& r = testing::Report().Add(
            "ingest_pdf_" + std::to_string(pdf_rates.size()), "PDF ingest, built-in embedder",
            absl::StrCat(name, ": ", res->pages, " pages into the ", chunks, "-chunk collection"),
            res->pages / s, "pages/s");
        r["also"] = {{{"label", "adding to the indexes"},
                      {"value", res->lock_ms + res->remove_ms + res->lexical_ms + res->vectors_ms +
                                    res->tables_ms},
                      {"unit", "ms"}}};
        r["target"] = "≥ 500 pages/s";
      }
    }
    if (pdf_rates.size() > 1) {
      std::printf(
          "RESULT ingest_pdf_median pages_per_s=%.0f adding_ms=%.0f (%zu manuals of 200 pages)\n",
          Percentile(pdf_rates, 0.5), Percentile(pdf_adding, 0.5), pdf_rates.size());
      auto& r =
          testing::Report().Add("ingest_pdf_median", "PDF ingest, median of the manuals",
                                absl::StrCat(pdf_rates.size(), " manuals of 200 pages into the ",
                                             chunks, "-chunk collection"),
                                Percentile(pdf_rates, 0.5), "pages/s");
      r["target"] = "≥ 500 pages/s";
    }
    auto save0 = std::chrono::steady_clock::now();
    (void)(*kb)->SaveIndexes();
    std::printf("indexes saved in %.2f s\n", Secs(save0));
  }
  // --- Daemon start with the collection until a search answers; its memory while serving.
  std::vector<double> starts;
  double serving_rss = 0;
  for (int run = 0; run < 3 && !skipped("start"); ++run) {
    auto t0 = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) {
      int devnull = open("/dev/null", O_WRONLY);
      dup2(devnull, 1);
      dup2(devnull, 2);
      std::string bin = std::string(FWAI_BIN_DIR) + "/fwaid";
      std::string listen = "unix:" + dir + "/s.sock";
      std::string data = dir + "/data";
      execl(bin.c_str(), bin.c_str(), "--listen", listen.c_str(), "--data-dir", data.c_str(),
            "--log-level", "warn", static_cast<char*>(nullptr));
      _exit(127);
    }
    auto addr = ResolveDaemonAddress("unix:" + dir + "/s.sock");
    bool answered = false;
    std::shared_ptr<grpc::Channel> channel;
    for (int i = 0; i < 30000 && !answered; ++i) {
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
      channel = *ch;
    }
    starts.push_back(Secs(t0));
    if (answered && run == 2) {
      auto stub = fwai::v1::Knowledge::NewStub(channel);
      for (const auto& q : queries) {
        grpc::ClientContext ctx;
        fwai::v1::SearchRequest req;
        req.set_query(q);
        fwai::v1::SearchResponse resp;
        (void)stub->Search(&ctx, req, &resp);
      }
      serving_rss = StatusMb(pid, "VmRSS:");
    }
    kill(pid, SIGTERM);
    int status;
    waitpid(pid, &status, 0);
    if (!answered) {
      std::fprintf(stderr, "daemon did not answer a search\n");
      return 1;
    }
  }
  if (skipped("start")) {
    if (keep.empty()) fs::remove_all(dir);
    return 0;
  }
  std::printf(
      "RESULT start_to_first_search_s median=%.3f (runs %.3f %.3f %.3f; %zu-chunk collection) "
      "target<=3\n",
      Percentile(starts, 0.5), starts[0], starts[1], starts[2], chunks);
  auto& start = testing::Report().Add(
      "start_to_first_search", "daemon start until a search answers",
      absl::StrCat(chunks, "-chunk collection, index files in the page cache; median of 3"),
      Percentile(starts, 0.5), "s");
  start["median"] = Percentile(starts, 0.5);
  start["max"] = Percentile(starts, 1.0);
  start["target"] = "≤ 3 s";
  testing::Report().Add(
      "daemon_rss", "daemon RSS while serving",
      absl::StrCat("after ", queries.size(), " searches of the ", chunks, "-chunk collection"),
      serving_rss, "MB")["target"] = "≤ 6 GB";
  std::printf("RESULT daemon_rss_mb=%.0f after %zu searches (%zu-chunk collection) target<=6144\n",
              serving_rss, queries.size(), chunks);
  if (keep.empty()) fs::remove_all(dir);
  return 0;
}

int main(int argc, char** argv) {
  // The results' name: fwai_kb_bench, or with --name SUFFIX fwai_kb_bench-SUFFIX (a
  // million-chunk run beside the default one in docs/bench-results).
  std::string name = "fwai_kb_bench";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) == "--name") name += "-" + std::string(argv[i + 1]);
  }
  testing::Report().Init(name, argc, argv);
  const int rc = Run(argc, argv);
  return rc == 0 && !testing::Report().Write() ? 1 : rc;
}
