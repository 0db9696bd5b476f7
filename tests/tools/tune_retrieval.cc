// tune_retrieval DATA_DIR QUERIES.jsonl [--validate OTHER.jsonl | --explain ID]
// Opens a stopped fwaid's knowledge base and measures chunk-level MRR@10 on
// the queries for a grid of fusion settings, then fits the built-in
// reranker's feature weights by coordinate ascent. Prints what it chose, and
// with --validate the MRR@10 of default and fitted weights on other queries.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/tokenizer.h"
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
  std::vector<Query> val;
  if (argc >= 5 && std::string(argv[3]) == "--validate") {
    std::ifstream vin(argv[4]);
    while (std::getline(vin, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      val.push_back({j["id"], j["query"], j["doc"], j["needle"], j["kind"]});
    }
  }
  auto storage = Storage::Open(data + "/db");
  if (!storage.ok()) {
    std::fprintf(stderr, "%s\n", storage.status().ToString().c_str());
    return 1;
  }
  auto embedder = MakeBuiltinEmbedder(256);
  auto reranker = MakeBuiltinReranker();
  KnowledgeOptions options;
  if (const char* v = std::getenv("FWAI_TUNE_DOC_TEXT_B")) options.doc_text_b = std::atof(v);
  if (const char* v = std::getenv("FWAI_TUNE_DOC_TEXT_CANDIDATES")) options.doc_text_candidates = std::atoi(v);
  auto kb = KnowledgeBase::Open(**storage, data + "/index", options, *embedder, *reranker);
  if (!kb.ok()) {
    std::fprintf(stderr, "%s\n", kb.status().ToString().c_str());
    return 1;
  }
  // --explain ID: the reranked top 15 of one query with their features.
  if (argc >= 5 && std::string(argv[3]) == "--explain") {
    for (const auto& q : qs) {
      if (q.id != argv[4]) continue;
      KbSearchRequest r;
      r.query = q.query;
      r.max_results = 40;
      auto hits = *(*kb)->Search(r);
      std::printf("%s: %s\n  expect %s / %s\n", q.id.c_str(), q.query.c_str(), q.doc.c_str(), q.needle.c_str());
      for (const auto& h : hits) {
        RerankCandidate c{h.text, h.context, h.vector_sim, h.lexical_norm, h.fused_norm, h.doc_match, h.doc_text, h.named};
        auto f = ComputeRerankFeatures(q.query, c);
        std::printf("%2d %.3f %s%s id=%.2f cov=%.2f prox=%.2f ctx=%.2f vec=%.2f lex=%.2f fus=%.2f doc=%.2f dtext=%.2f named=%.2f | %.60s\n",
                    h.rank, h.score, Relevant(q, h) ? "* " : "", h.doc.c_str(), f.identifier, f.coverage, f.proximity,
                    f.context, f.vector, f.lexical, f.fused, f.doc, f.doc_text, f.named, Norm(h.text).c_str());
      }
    }
    return 0;
  }
  // 1) Fusion grid, no rerank.
  struct Setting {
    FusionOverrides f;
    double mrr;
  };
  std::vector<Setting> settings;
  std::vector<double> vector_grid = {0.0, 0.1, 0.3, 1.0};
  if (const char* v = std::getenv("FWAI_TUNE_VECTOR")) vector_grid = {std::atof(v)};
  for (double wv : vector_grid) {
    for (double wd : {0.0, 0.25, 0.5, 1.0}) {
      for (double wt : {0.0, 0.25, 0.5, 1.0}) {
      for (double k : {10.0, 30.0, 60.0}) {
        FusionOverrides f{1.0, wv, wd, k, wt};
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
  }
  std::sort(settings.begin(), settings.end(), [](const auto& a, const auto& b) { return a.mrr > b.mrr; });
  std::printf("fusion (no rerank), best 8 of %zu: lexical=1\n", settings.size());
  for (size_t i = 0; i < 8 && i < settings.size(); ++i) {
    std::printf("  vector=%.2f doc=%.2f doc_text=%.2f k=%.0f  MRR@10=%.4f\n", settings[i].f.vector_weight,
                settings[i].f.doc_weight, settings[i].f.doc_text_weight, settings[i].f.rrf_k, settings[i].mrr);
  }
  // 2) Reranker weights by coordinate ascent over the best fusion's top 50.
  for (int pick = 0; pick < 3 && pick < static_cast<int>(settings.size()); ++pick) {
    FusionOverrides f = settings[pick].f;
    struct Pool {
      std::vector<std::vector<KbSearchHit>> cands;
      std::vector<std::vector<RerankFeatures>> feats;
    };
    auto build = [&](const std::vector<Query>& set) {
      Pool p;
      for (const auto& q : set) {
        KbSearchRequest r;
        r.query = q.query;
        r.rerank = false;
        r.max_results = std::getenv("FWAI_TUNE_POOL") ? std::atoi(std::getenv("FWAI_TUNE_POOL")) : 50;
        r.overrides = &f;
        p.cands.push_back(*(*kb)->Search(r));
        std::vector<RerankFeatures> fs;
        for (const auto& h : p.cands.back()) {
          RerankCandidate c{h.text, h.context, h.vector_sim, h.lexical_norm, h.fused_norm, h.doc_match, h.doc_text, h.named};
          fs.push_back(ComputeRerankFeatures(q.query, c));
        }
        p.feats.push_back(std::move(fs));
      }
      return p;
    };
    auto score = [&](const std::vector<Query>& set, const Pool& p, const std::vector<double>& w) {
      std::vector<std::vector<KbSearchHit>> runs;
      for (size_t i = 0; i < set.size(); ++i) {
        const bool has_ids = !FindIdentifiers(set[i].query).empty();
        std::vector<std::pair<double, size_t>> sc;
        for (size_t c = 0; c < p.feats[i].size(); ++c) {
          const auto& x = p.feats[i][c];
          const double wi = has_ids ? w[0] : 0.0, wc = has_ids ? w[1] : w[1] + w[0];
          double s = wi * x.identifier + wc * x.coverage + w[2] * x.proximity + w[3] * x.context + w[4] * x.vector +
                     w[5] * x.lexical + w[6] * x.fused + w[7] * x.doc + w[8] * x.doc_text + w[9] * x.named;
          sc.emplace_back(-s, c);
        }
        std::stable_sort(sc.begin(), sc.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
        std::vector<KbSearchHit> run;
        for (size_t k = 0; k < sc.size() && k < 10; ++k) run.push_back(p.cands[i][sc[k].second]);
        runs.push_back(std::move(run));
      }
      return Mrr(set, runs);
    };
    const Pool pool = build(qs);
    const Pool val_pool = build(val);
    auto eval = [&](const std::vector<double>& w) { return score(qs, pool, w); };
    RerankWeights d;
    std::vector<double> w = {d.identifier, d.coverage, d.proximity, d.context, d.vector, d.lexical, d.fused, d.doc, d.doc_text, d.named};
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
    std::printf("rerank over fusion vector=%.2f doc=%.2f doc_text=%.2f k=%.0f: default weights MRR@10=%.4f -> fitted %.4f\n",
                f.vector_weight, f.doc_weight, f.doc_text_weight, f.rrf_k, start, best);
    std::printf("  identifier=%.2f coverage=%.2f proximity=%.2f context=%.2f vector=%.2f lexical=%.2f fused=%.2f doc=%.2f doc_text=%.2f named=%.2f\n",
                w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7], w[8], w[9]);
    if (!val.empty()) {
      std::printf("  validation (%zu queries): default weights MRR@10=%.4f, fitted %.4f\n", val.size(),
                  score(val, val_pool, {d.identifier, d.coverage, d.proximity, d.context, d.vector, d.lexical, d.fused, d.doc,
                                        d.doc_text, d.named}),
                  score(val, val_pool, w));
    }
  }
  return 0;
}
