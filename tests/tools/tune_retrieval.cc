// tune_retrieval DATA_DIR QUERIES.jsonl
// Opens a stopped fwaid's knowledge base and measures chunk-level MRR@10 on
// the queries for a grid of fusion settings, then fits the built-in
// reranker's feature weights by coordinate ascent. Prints what it chose.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/reranker.h"
#include "server/storage/storage.h"

using namespace fwai;

namespace {

std::string Norm(const std::string& s) {
  std::string o;
  bool sp = false;
  for (unsigned char c : s) {
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      sp = true;
      continue;
    }
    if (sp && !o.empty()) o.push_back(' ');
    sp = false;
    o.push_back(static_cast<char>(std::tolower(c)));
  }
  return o;
}

struct Query {
  std::string id, query, doc, needle, kind;
};

bool Relevant(const Query& q, const KbSearchHit& h) {
  return h.doc == q.doc && Norm(h.text).find(Norm(q.needle)) != std::string::npos;
}

double Mrr(const std::vector<Query>& qs, const std::vector<std::vector<KbSearchHit>>& runs) {
  double sum = 0;
  for (size_t i = 0; i < qs.size(); ++i) {
    for (size_t r = 0; r < runs[i].size() && r < 10; ++r) {
      if (Relevant(qs[i], runs[i][r])) {
        sum += 1.0 / (r + 1);
        break;
      }
    }
  }
  return sum / qs.size();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tune_retrieval DATA_DIR QUERIES.jsonl\n");
    return 2;
  }
  const std::string data = argv[1];
  std::vector<Query> qs;
  std::ifstream in(argv[2]);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    qs.push_back({j["id"], j["query"], j["doc"], j["needle"], j["kind"]});
  }
  auto storage = Storage::Open(data + "/db");
  if (!storage.ok()) {
    std::fprintf(stderr, "%s\n", storage.status().ToString().c_str());
    return 1;
  }
  auto embedder = MakeBuiltinEmbedder(256);
  auto reranker = MakeBuiltinReranker();
  auto kb = KnowledgeBase::Open(**storage, data + "/index", KnowledgeOptions{}, *embedder, *reranker);
  if (!kb.ok()) {
    std::fprintf(stderr, "%s\n", kb.status().ToString().c_str());
    return 1;
  }
  // 1) Fusion grid, no rerank.
  struct Setting {
    FusionOverrides f;
    double mrr;
  };
  std::vector<Setting> settings;
  for (double wv : {0.0, 0.1, 0.2, 0.3, 0.5, 1.0}) {
    for (double wd : {0.0, 0.25, 0.5, 1.0}) {
      for (double k : {10.0, 30.0, 60.0}) {
        FusionOverrides f{1.0, wv, wd, k};
        std::vector<std::vector<KbSearchHit>> runs;
        for (const auto& q : qs) {
          KbSearchRequest r;
          r.query = q.query;
          r.rerank = false;
          r.overrides = &f;
          runs.push_back(*(*kb)->Search(r));
        }
        settings.push_back({f, Mrr(qs, runs)});
      }
    }
  }
  std::sort(settings.begin(), settings.end(), [](const auto& a, const auto& b) { return a.mrr > b.mrr; });
  std::printf("fusion (no rerank), best 8 of %zu: lexical=1\n", settings.size());
  for (size_t i = 0; i < 8 && i < settings.size(); ++i) {
    std::printf("  vector=%.2f doc=%.2f k=%.0f  MRR@10=%.4f\n", settings[i].f.vector_weight, settings[i].f.doc_weight,
                settings[i].f.rrf_k, settings[i].mrr);
  }
  // 2) Reranker weights by coordinate ascent over the best fusion's top 50.
  for (int pick = 0; pick < 3 && pick < static_cast<int>(settings.size()); ++pick) {
    FusionOverrides f = settings[pick].f;
    std::vector<std::vector<KbSearchHit>> cands;
    std::vector<std::vector<RerankFeatures>> feats;
    for (const auto& q : qs) {
      KbSearchRequest r;
      r.query = q.query;
      r.rerank = false;
      r.max_results = 50;
      r.overrides = &f;
      cands.push_back(*(*kb)->Search(r));
      std::vector<RerankFeatures> fs;
      for (const auto& h : cands.back()) {
        RerankCandidate c{h.text, h.context, h.vector_sim, h.lexical_norm, h.fused_norm, h.doc_match};
        fs.push_back(ComputeRerankFeatures(q.query, c));
      }
      feats.push_back(std::move(fs));
    }
    auto eval = [&](const std::vector<double>& w) {
      std::vector<std::vector<KbSearchHit>> runs;
      for (size_t i = 0; i < qs.size(); ++i) {
        std::vector<std::pair<double, size_t>> sc;
        for (size_t c = 0; c < feats[i].size(); ++c) {
          const auto& x = feats[i][c];
          double s = w[0] * x.identifier + w[1] * x.coverage + w[2] * x.proximity + w[3] * x.context + w[4] * x.vector +
                     w[5] * x.lexical + w[6] * x.fused + w[7] * x.doc;
          sc.emplace_back(-s, c);
        }
        std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<KbSearchHit> run;
        for (size_t k = 0; k < sc.size() && k < 10; ++k) run.push_back(cands[i][sc[k].second]);
        runs.push_back(std::move(run));
      }
      return Mrr(qs, runs);
    };
    RerankWeights d;
    std::vector<double> w = {d.identifier, d.coverage, d.proximity, d.context, d.vector, d.lexical, d.fused, d.doc};
    double best = eval(w);
    const double start = best;
    const std::vector<double> grid = {0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8};
    for (int round = 0; round < 4; ++round) {
      bool improved = false;
      for (size_t p = 0; p < w.size(); ++p) {
        for (double v : grid) {
          auto t = w;
          t[p] = v;
          double m = eval(t);
          if (m > best + 1e-9) {
            best = m;
            w = t;
            improved = true;
          }
        }
      }
      if (!improved) break;
    }
    std::printf("rerank over fusion vector=%.2f doc=%.2f k=%.0f: default weights MRR@10=%.4f -> fitted %.4f\n",
                f.vector_weight, f.doc_weight, f.rrf_k, start, best);
    std::printf("  identifier=%.2f coverage=%.2f proximity=%.2f context=%.2f vector=%.2f lexical=%.2f fused=%.2f doc=%.2f\n",
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]);
  }
  return 0;
}
