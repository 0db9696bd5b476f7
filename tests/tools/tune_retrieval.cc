// fwai_tune_retrieval DATA_DIR QUERIES.jsonl [--also MORE.jsonl] [--folds K] [--seed S]
//                     [--passage-tokens N] [--check OTHER.jsonl] [--explain ID]
//                     [--stages windows]
//
// Chooses the retrieval settings (fusion weights, the built-in reranker's
// feature weights, the passage stage's weights) by coordinate ascent on
// chunk-level MRR@10 (the needle in the returned passage), and measures what
// that choosing is worth by K-fold cross-validation: the questions are split
// into K folds (stratified by kind, seeded); for each fold the settings are
// chosen on the other K-1 folds, starting from neutral settings, and scored
// on the held-out fold. Prints each fold's choice and held-out MRR@10
// (overall and per kind), their mean and spread, then the choice on all
// questions (what the defaults should be) and, with --check, the MRR@10 of
// the current defaults and of that choice on other questions.
//
// Opens a stopped fwaid's knowledge base (DATA_DIR as given to --data-dir).
// Each fusion setting's candidate pool is searched once (every candidate
// widened into its passage, budget 400); rankings are then recomputed from
// the candidates' features, so the search over settings is arithmetic.
//
// --stages windows: the window-evidence stage (knowledge.windows) on top of
// the current defaults instead. Each of its settings (documents, weight, k)
// is searched by the knowledge base itself for every question; procedures
// that choose a setting (for all questions, or only for those without an
// identifier) are cross-validated as above.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "server/knowledge/embedder.h"
#include "server/knowledge/knowledge_base.h"
#include "server/knowledge/passage.h"
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

std::vector<Query> LoadQueries(const std::string& path) {
  std::vector<Query> qs;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    qs.push_back({j["id"], j["query"], j["doc"], j["needle"], j["kind"]});
  }
  return qs;
}

// The settings searched. Fusion settings pick a candidate pool; the rest
// rank it.
constexpr int kRerank =
    10;  // identifier coverage proximity context vector lexical fused doc doc_text named
const char* kRerankNames[kRerank] = {"identifier", "coverage", "proximity", "context",  "vector",
                                     "lexical",    "fused",    "doc",       "doc_text", "named"};
const std::vector<double> kVectorGrid = {0.0, 0.1, 0.3, 1.0};
const std::vector<double> kDocTextGrid = {0.0, 0.5, 1.0};
const std::vector<double> kRrfKGrid = {10, 30, 60};
const std::vector<double> kWeightGrid = {0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8};
const std::vector<double> kWithinDocGrid = {0.0, 0.25, 0.5, 0.75, 1.0};

struct Settings {
  int vector = 0, doc_text = 0, rrf_k = 0;  // grid indexes
  double rerank[kRerank];
  double passage_coverage = 0, passage_sentence = 0;
  int pool = 30;
  int forward = 0;        // passages grow forward from a lead-in hit (a pool setting)
  double within_doc = 0;  // within-document ranking weight
};

Settings Neutral() {
  Settings s;
  s.vector = 1;    // 0.1
  s.doc_text = 1;  // 0.5
  s.rrf_k = 2;     // 60, the usual constant
  for (double& w : s.rerank) w = 0.3;
  return s;
}

Settings Defaults() {
  Settings s;
  KnowledgeOptions o;
  s.vector = static_cast<int>(std::find(kVectorGrid.begin(), kVectorGrid.end(), o.vector_weight) -
                              kVectorGrid.begin());
  s.doc_text =
      static_cast<int>(std::find(kDocTextGrid.begin(), kDocTextGrid.end(), o.doc_text_weight) -
                       kDocTextGrid.begin());
  s.rrf_k =
      static_cast<int>(std::find(kRrfKGrid.begin(), kRrfKGrid.end(), o.rrf_k) - kRrfKGrid.begin());
  RerankWeights d;
  const double w[kRerank] = {d.identifier, d.coverage, d.proximity, d.context,  d.vector,
                             d.lexical,    d.fused,    d.doc,       d.doc_text, d.named};
  std::copy(w, w + kRerank, s.rerank);
  s.passage_coverage = o.passage_coverage_weight;
  s.passage_sentence = o.passage_sentence_weight;
  s.pool = o.passage_pool;
  s.forward = o.passage_forward ? 1 : 0;
  s.within_doc = o.passage_within_doc;
  return s;
}

std::string Describe(const Settings& s) {
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "vector=%.2f doc_text=%.2f rrf_k=%.0f |",
                        kVectorGrid[s.vector], kDocTextGrid[s.doc_text], kRrfKGrid[s.rrf_k]);
  for (int i = 0; i < kRerank; ++i)
    n += std::snprintf(buf + n, sizeof buf - n, " %s=%.2f", kRerankNames[i], s.rerank[i]);
  std::snprintf(buf + n, sizeof buf - n,
                " | passage_coverage=%.2f passage_sentence=%.2f forward=%d within_doc=%.2f",
                s.passage_coverage, s.passage_sentence, s.forward, s.within_doc);
  return buf;
}

struct Cand {
  RerankFeatures f;
  bool ids = false;  // the query has identifiers
  bool relevant = false;
  std::string doc;
  uint32_t begin_chunk, begin_offset, end_chunk, end_offset;
  double coverage, sentence;
};

// Candidate pools, by query and fusion setting.
class Pools {
 public:
  Pools(KnowledgeBase& kb, const std::vector<Query>& qs, int passage_tokens = -1)
      : kb_(kb), qs_(qs), passage_tokens_(passage_tokens) {}
  const std::vector<Cand>& Get(size_t q, const Settings& s) {
    const int key = ((s.forward * 10 + s.vector) * 10 + s.doc_text) * 10 + s.rrf_k;
    auto& slot = cache_[key];
    if (slot.empty()) slot.resize(qs_.size());
    if (!slot[q].loaded) {
      FusionOverrides f;
      f.lexical_weight = 1.0;
      f.vector_weight = kVectorGrid[s.vector];
      f.doc_text_weight = kDocTextGrid[s.doc_text];
      f.rrf_k = kRrfKGrid[s.rrf_k];
      f.passage_forward = s.forward;
      KbSearchRequest r;
      r.query = qs_[q].query;
      r.rerank = false;
      r.all_candidates = true;
      r.passage_tokens = passage_tokens_;
      r.overrides = &f;
      auto hits = kb_.Search(r);
      if (!hits.ok()) {
        std::fprintf(stderr, "%s: %s\n", qs_[q].id.c_str(), hits.status().ToString().c_str());
        std::exit(1);
      }
      const bool ids = !FindIdentifiers(qs_[q].query).empty();
      const std::string needle = Norm(qs_[q].needle);
      for (const auto& h : *hits) {
        RerankCandidate c{h.text,       h.context,   h.vector_sim, h.lexical_norm,
                          h.fused_norm, h.doc_match, h.doc_text,   h.named};
        Cand x;
        // Stage 1 scores the chunk; the passage's text is wider. The chunk
        // is the passage's hit: features come from the chunk as the daemon
        // computes them, so recompute them from the chunk text.
        c.text = h.chunk_text;
        x.f = ComputeRerankFeatures(qs_[q].query, c);
        x.ids = ids;
        x.relevant = h.doc == qs_[q].doc && Norm(h.text).find(needle) != std::string::npos;
        x.doc = h.doc;
        x.begin_chunk = h.begin_chunk;
        x.begin_offset = h.begin_offset;
        x.end_chunk = h.end_chunk;
        x.end_offset = h.end_offset;
        x.coverage = h.coverage;
        x.sentence = h.best_sentence;
        slot[q].cands.push_back(std::move(x));
      }
      slot[q].loaded = true;
    }
    return slot[q].cands;
  }

 private:
  struct Entry {
    bool loaded = false;
    std::vector<Cand> cands;
  };
  KnowledgeBase& kb_;
  const std::vector<Query>& qs_;
  int passage_tokens_;
  std::map<int, std::vector<Entry>> cache_;
};

// Reciprocal rank of the first relevant passage in the top 10, as the
// daemon ranks them: stage 1 orders the chunks, the best `pool` are ranked
// again with their passages' signals, passages overlapping one ranked
// earlier are merged into it.
double ReciprocalRank(const std::vector<Cand>& cands, const Settings& s) {
  double sum = 0;
  for (double w : s.rerank) sum += w;
  const double norm = sum > 0 ? 1.0 / sum : 1.0;
  std::vector<std::pair<double, size_t>> stage1;
  stage1.reserve(cands.size());
  for (size_t i = 0; i < cands.size(); ++i) {
    const auto& f = cands[i].f;
    const double wi = cands[i].ids ? s.rerank[0] : 0.0;
    const double wc = cands[i].ids ? s.rerank[1] : s.rerank[1] + s.rerank[0];
    const double v = wi * f.identifier + wc * f.coverage + s.rerank[2] * f.proximity +
                     s.rerank[3] * f.context + s.rerank[4] * f.vector + s.rerank[5] * f.lexical +
                     s.rerank[6] * f.fused + s.rerank[7] * f.doc + s.rerank[8] * f.doc_text +
                     s.rerank[9] * f.named;
    stage1.emplace_back(std::clamp(v * norm, 0.0, 1.0), i);
  }
  std::stable_sort(stage1.begin(), stage1.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  if (stage1.size() > static_cast<size_t>(std::max(s.pool, 20)))
    stage1.resize(std::max(s.pool, 20));
  for (auto& [score, i] : stage1) {
    score =
        (score + s.passage_coverage * cands[i].coverage + s.passage_sentence * cands[i].sentence) /
        (1 + s.passage_coverage + s.passage_sentence);
  }
  if (s.within_doc > 0) {
    std::map<std::string, double> best;
    for (const auto& [score, i] : stage1) best[cands[i].doc] = std::max(best[cands[i].doc], score);
    for (auto& [score, i] : stage1) {
      score = WithinDocScore(score, best[cands[i].doc], cands[i].coverage, cands[i].sentence,
                             s.within_doc);
    }
  }
  std::stable_sort(stage1.begin(), stage1.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  struct Taken {
    size_t i;
    bool relevant;
  };
  std::vector<Taken> taken;
  for (const auto& [score, i] : stage1) {
    if (taken.size() >= 10) break;
    const Cand& c = cands[i];
    bool merged = false;
    for (auto& t : taken) {
      const Cand& o = cands[t.i];
      if (o.doc != c.doc) continue;
      const bool before =
          std::tie(c.end_chunk, c.end_offset) < std::tie(o.begin_chunk, o.begin_offset);
      const bool after =
          std::tie(o.end_chunk, o.end_offset) < std::tie(c.begin_chunk, c.begin_offset);
      if (!before && !after) {
        t.relevant = t.relevant || c.relevant;
        merged = true;
        break;
      }
    }
    if (!merged) taken.push_back({i, c.relevant});
  }
  for (size_t r = 0; r < taken.size(); ++r) {
    if (taken[r].relevant) return 1.0 / (r + 1);
  }
  return 0;
}

double Mrr(Pools& pools, const std::vector<size_t>& set, const Settings& s) {
  if (set.empty()) return 0;
  double sum = 0;
  for (size_t q : set) sum += ReciprocalRank(pools.Get(q, s), s);
  return sum / set.size();
}

// Which settings a fit may change.
struct Mask {
  bool fusion = true, rerank = true, passage = true;
  bool forward = false, within = false;  // the passage placement, within-document ranking
};

// The fused order: the reranker reads only the fusion score (what a search
// without rerank returns).
Settings Forward(Settings s) {
  s.forward = 1;
  return s;
}
Settings WithinDoc(Settings s, double w) {
  s.within_doc = w;
  return s;
}

Settings FusedOnly(Settings s) {
  for (double& w : s.rerank) w = 0;
  s.rerank[6] = 1;  // fused
  return s;
}

// Coordinate ascent from `start` on the questions in `train`. A step is
// taken only if it raises the training MRR@10 by more than `min_gain` (a
// regularizer: with min_gain 1/n a change must be worth at least one
// question moved from nowhere to first, or several moved up).
Settings Fit(Pools& pools, const std::vector<size_t>& train, Settings start, Mask mask = {},
             double min_gain = 0) {
  Settings best = start;
  double best_mrr = Mrr(pools, train, best);
  auto consider = [&](const Settings& t) {
    const double m = Mrr(pools, train, t);
    if (m > best_mrr + std::max(1e-9, min_gain)) {
      best_mrr = m;
      best = t;
      return true;
    }
    return false;
  };
  for (int round = 0; round < 4; ++round) {
    bool improved = false;
    for (int v = 0; mask.fusion && v < static_cast<int>(kVectorGrid.size()); ++v) {
      Settings t = best;
      t.vector = v;
      improved |= consider(t);
    }
    for (int v = 0; mask.fusion && v < static_cast<int>(kDocTextGrid.size()); ++v) {
      Settings t = best;
      t.doc_text = v;
      improved |= consider(t);
    }
    for (int v = 0; mask.fusion && v < static_cast<int>(kRrfKGrid.size()); ++v) {
      Settings t = best;
      t.rrf_k = v;
      improved |= consider(t);
    }
    for (int v = 0; mask.forward && v < 2; ++v) {
      Settings t = best;
      t.forward = v;
      improved |= consider(t);
    }
    for (double v : kWithinDocGrid) {
      if (!mask.within) break;
      Settings t = best;
      t.within_doc = v;
      improved |= consider(t);
    }
    for (int p = 0; mask.rerank && p < kRerank; ++p) {
      for (double v : kWeightGrid) {
        Settings t = best;
        t.rerank[p] = v;
        improved |= consider(t);
      }
    }
    for (double v : kWeightGrid) {
      if (!mask.passage) break;
      Settings t = best;
      t.passage_coverage = v;
      improved |= consider(t);
    }
    for (double v : kWeightGrid) {
      if (!mask.passage) break;
      Settings t = best;
      t.passage_sentence = v;
      improved |= consider(t);
    }
    if (!improved) break;
  }
  return best;
}

// One step from the fused order toward the neutral reranker (every feature
// equal): weights (1 - a) * fused-only + a * neutral, `a` and the fusion
// settings chosen by exhaustive search on `train`. One reranker parameter,
// so little to overfit.
const std::vector<double> kBlendGrid = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
Settings Blend(const Settings& fusion, double a) {
  Settings s = FusedOnly(fusion);
  for (int i = 0; i < kRerank; ++i) s.rerank[i] = (1 - a) * s.rerank[i] + a * 0.3;
  return s;
}
Settings FitBlend(Pools& pools, const std::vector<size_t>& train, bool fusion) {
  Settings best = Blend(Neutral(), 0);
  double best_mrr = -1;
  const Settings start = Neutral();
  for (int v = 0; v < static_cast<int>(kVectorGrid.size()); ++v) {
    for (int d = 0; d < static_cast<int>(kDocTextGrid.size()); ++d) {
      for (int k = 0; k < static_cast<int>(kRrfKGrid.size()); ++k) {
        Settings f = start;
        if (fusion) {
          f.vector = v;
          f.doc_text = d;
          f.rrf_k = k;
        } else if (v + d + k > 0) {
          continue;
        }
        for (double a : kBlendGrid) {
          const Settings t = Blend(f, a);
          const double m = Mrr(pools, train, t);
          if (m > best_mrr + 1e-9) {
            best_mrr = m;
            best = t;
          }
        }
      }
    }
  }
  return best;
}

void PrintKinds(const char* label, Pools& pools, const std::vector<Query>& qs,
                const std::vector<size_t>& set, const Settings& s) {
  std::printf("  %-28s overall %.3f", label, Mrr(pools, set, s));
  for (const char* kind : {"identifier", "paraphrase", "howto"}) {
    std::vector<size_t> sub;
    for (size_t q : set) {
      if (qs[q].kind == kind) sub.push_back(q);
    }
    if (!sub.empty()) std::printf("  %s(%zu) %.3f", kind, sub.size(), Mrr(pools, sub, s));
  }
  std::printf("\n");
}

struct WindowSetting {
  int docs = 0;  // 0: off
  double weight = 0, k = 0;
  bool identifiers = false;  // also for questions with an identifier
};

std::string DescribeWindows(const WindowSetting& w) {
  if (w.docs == 0) return "off";
  char buf[128];
  std::snprintf(buf, sizeof buf, "docs=%d weight=%.1f k=%.0f %s", w.docs, w.weight, w.k,
                w.identifiers ? "all questions" : "questions without an identifier");
  return buf;
}

// The window stage's settings, cross-validated on the daemon's own ranking.
int TuneWindows(KnowledgeBase& kb, const std::vector<Query>& qs,
                const std::vector<std::vector<size_t>>& fold, int passage_tokens) {
  const std::vector<int> docs_grid = {1, 2, 3, 5};
  const std::vector<double> weight_grid = {0.2, 0.4, 0.6, 0.8, 1.0};
  const std::vector<double> k_grid = {10, 30, 60};
  std::vector<WindowSetting> grid;  // [0] off; then each setting for all questions
  grid.push_back({});
  for (int d : docs_grid)
    for (double w : weight_grid)
      for (double k : k_grid) grid.push_back({d, w, k, true});
  std::vector<bool> ids(qs.size());
  for (size_t q = 0; q < qs.size(); ++q) ids[q] = !FindIdentifiers(qs[q].query).empty();
  // Reciprocal rank of every question under every setting (applied to all).
  std::vector<std::vector<double>> rr(grid.size(), std::vector<double>(qs.size()));
  for (size_t g = 0; g < grid.size(); ++g) {
    FusionOverrides f;
    f.window_docs = grid[g].docs;
    f.window_weight = grid[g].weight;
    f.window_k = grid[g].k;
    f.window_identifiers = 1;
    for (size_t q = 0; q < qs.size(); ++q) {
      KbSearchRequest r;
      r.query = qs[q].query;
      r.log = false;
      r.max_results = 10;
      r.passage_tokens = passage_tokens;
      r.overrides = &f;
      auto hits = kb.Search(r);
      if (!hits.ok()) {
        std::fprintf(stderr, "%s: %s\n", qs[q].id.c_str(), hits.status().ToString().c_str());
        std::exit(1);
      }
      const std::string needle = Norm(qs[q].needle);
      for (size_t i = 0; i < hits->size() && i < 10; ++i) {
        const auto& h = (*hits)[i];
        if (h.doc == qs[q].doc && Norm(h.text).find(needle) != std::string::npos) {
          rr[g][q] = 1.0 / (i + 1);
          break;
        }
      }
    }
  }
  // A setting as applied: index into `grid` and whether identifiers get it.
  struct Applied {
    size_t g = 0;
    bool identifiers = false;
  };
  auto rr_of = [&](const Applied& a, size_t q) {
    return ids[q] && !a.identifiers ? rr[0][q] : rr[a.g][q];
  };
  auto mrr = [&](const Applied& a, const std::vector<size_t>& set) {
    double sum = 0;
    for (size_t q : set) sum += rr_of(a, q);
    return set.empty() ? 0.0 : sum / set.size();
  };
  auto describe = [&](const Applied& a) {
    WindowSetting w = grid[a.g];
    w.identifiers = a.identifiers;
    return DescribeWindows(w);
  };
  // Exhaustive search on `train`; ties keep the first (off first).
  auto choose = [&](const std::vector<size_t>& train, bool may_all, bool may_non_id) {
    Applied best;
    double best_mrr = mrr(best, train);
    for (size_t g = 1; g < grid.size(); ++g) {
      for (bool all : {false, true}) {
        if ((all && !may_all) || (!all && !may_non_id)) continue;
        const Applied a{g, all};
        const double m = mrr(a, train);
        if (m > best_mrr + 1e-9) {
          best_mrr = m;
          best = a;
        }
      }
    }
    return best;
  };
  auto mean_sd = [](const std::vector<double>& v) {
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    return std::make_pair(mean, v.size() > 1 ? std::sqrt(var / (v.size() - 1)) : 0.0);
  };
  auto report = [&](const char* name,
                    const std::function<Applied(const std::vector<size_t>&)>& pick,
                    bool print_folds) {
    std::vector<double> held;
    std::map<std::string, std::vector<double>> kinds;
    for (size_t f = 0; f < fold.size(); ++f) {
      std::vector<size_t> train;
      for (size_t g = 0; g < fold.size(); ++g) {
        if (g != f) train.insert(train.end(), fold[g].begin(), fold[g].end());
      }
      const Applied a = pick(train);
      held.push_back(mrr(a, fold[f]));
      for (const char* kind : {"identifier", "paraphrase", "howto"}) {
        std::vector<size_t> sub;
        for (size_t q : fold[f]) {
          if (qs[q].kind == kind) sub.push_back(q);
        }
        if (!sub.empty()) kinds[kind].push_back(mrr(a, sub));
      }
      if (print_folds) {
        std::printf("    fold %zu: held out %.3f (train %.3f)  %s\n", f + 1, held.back(),
                    mrr(a, train), describe(a).c_str());
      }
    }
    const auto [m, sd] = mean_sd(held);
    std::printf("  %-58s held-out MRR@10 %.3f +- %.3f", name, m, sd);
    for (const auto& [kind, v] : kinds) {
      const auto [km, ksd] = mean_sd(v);
      std::printf("; %s %.3f +- %.3f", kind.c_str(), km, ksd);
    }
    std::printf("\n");
    return m;
  };
  auto fixed = [&](int docs, double weight, double k, bool all) {
    for (size_t g = 1; g < grid.size(); ++g) {
      if (grid[g].docs == docs && grid[g].weight == weight && grid[g].k == k) {
        return Applied{g, all};
      }
    }
    return Applied{};
  };
  std::printf("window evidence on the current defaults, %zu settings searched:\n", grid.size());
  std::printf("fixed settings, per fold:\n");
  report(
      "off", [](const std::vector<size_t>&) { return Applied{}; }, false);
  for (bool all : {true, false}) {
    for (const auto& [d, w, k] : {std::tuple<int, double, double>{3, 0.8, 10},
                                  {3, 0.4, 10},
                                  {1, 0.8, 10},
                                  {5, 0.8, 10},
                                  {3, 0.8, 60}}) {
      const Applied a = fixed(d, w, k, all);
      report(
          describe(a).c_str(), [a](const std::vector<size_t>&) { return a; }, false);
    }
  }
  std::printf("choosing procedures, cross-validated:\n");
  struct Proc {
    const char* name;
    bool may_all, may_non_id;
  };
  const Proc procs[] = {{"one setting for all questions (or off)", true, false},
                        {"a setting for questions without an identifier (or off)", false, true},
                        {"a setting and whether identifiers get it (or off)", true, true}};
  const Proc* best = nullptr;
  double best_cv = -1;
  for (const auto& p : procs) {
    const double m = report(
        p.name,
        [&](const std::vector<size_t>& train) { return choose(train, p.may_all, p.may_non_id); },
        true);
    if (m > best_cv + 1e-9) {
      best_cv = m;
      best = &p;
    }
  }
  const double off_cv = mean_sd([&] {
                          std::vector<double> v;
                          for (const auto& f : fold) v.push_back(mrr(Applied{}, f));
                          return v;
                        }())
                            .first;
  std::vector<size_t> all(qs.size());
  std::iota(all.begin(), all.end(), 0);
  if (best_cv <= off_cv + 1e-9) {
    std::printf("no procedure beats off held out (%.3f): the stage stays off\n", off_cv);
    return 0;
  }
  const Applied final_choice = choose(all, best->may_all, best->may_non_id);
  std::printf(
      "best procedure by cross-validation: %s (%.3f, off %.3f); applied to all %zu questions: %s\n",
      best->name, best_cv, off_cv, qs.size(), describe(final_choice).c_str());
  for (const auto& [label, a] :
       {std::pair<const char*, Applied>{"that choice", final_choice}, {"off", Applied{}}}) {
    std::printf("  all questions, %-12s overall %.3f", label, mrr(a, all));
    for (const char* kind : {"identifier", "paraphrase", "howto"}) {
      std::vector<size_t> sub;
      for (size_t q : all) {
        if (qs[q].kind == kind) sub.push_back(q);
      }
      std::printf("  %s(%zu) %.3f", kind, sub.size(), mrr(a, sub));
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr,
                 "usage: fwai_tune_retrieval DATA_DIR QUERIES.jsonl [--folds K] [--seed S] "
                 "[--also MORE.jsonl] [--passage-tokens N] [--check OTHER.jsonl]\n");
    return 2;
  }
  const std::string data = argv[1];
  std::vector<Query> qs = LoadQueries(argv[2]);
  int folds = 5;
  unsigned seed = 1;
  std::string check_path, explain, stages;
  int passage_tokens = -1;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--folds") folds = std::atoi(argv[i + 1]);
    if (a == "--seed") seed = static_cast<unsigned>(std::atoi(argv[i + 1]));
    if (a == "--check") check_path = argv[i + 1];
    if (a == "--explain") explain = argv[i + 1];
    if (a == "--stages") stages = argv[i + 1];
    if (a == "--passage-tokens") passage_tokens = std::atoi(argv[i + 1]);
    if (a == "--also") {
      for (auto& q : LoadQueries(argv[i + 1])) qs.push_back(std::move(q));
    }
  }
  auto storage = Storage::Open(data + "/db");
  if (!storage.ok()) {
    std::fprintf(stderr, "%s\n", storage.status().ToString().c_str());
    return 1;
  }
  auto embedder = MakeBuiltinEmbedder(256);
  auto reranker = MakeBuiltinReranker();
  auto kb =
      KnowledgeBase::Open(**storage, data + "/index", KnowledgeOptions{}, *embedder, *reranker);
  if (!kb.ok()) {
    std::fprintf(stderr, "%s\n", kb.status().ToString().c_str());
    return 1;
  }
  if (!explain.empty()) {
    for (const auto& q : qs) {
      if (q.id != explain) continue;
      KbSearchRequest r;
      r.query = q.query;
      r.max_results = 20;
      auto hits = *(*kb)->Search(r);
      std::printf("%s: %s\n  expect %s / %s\n", q.id.c_str(), q.query.c_str(), q.doc.c_str(),
                  q.needle.c_str());
      for (const auto& h : hits) {
        const bool rel = h.doc == q.doc && Norm(h.text).find(Norm(q.needle)) != std::string::npos;
        std::printf("%2d %.3f (stage 1 %.3f, cov %.2f, best %.2f) %s%s %s | %.80s\n", h.rank,
                    h.score, h.first_stage_score, h.coverage, h.best_sentence, rel ? "* " : "",
                    h.doc.c_str(), h.chunk_id.c_str(), Norm(h.text).c_str());
      }
    }
    return 0;
  }

  Pools pools(**kb, qs, passage_tokens);
  std::vector<size_t> all(qs.size());
  std::iota(all.begin(), all.end(), 0);
  // Stratified folds: each kind shuffled (seeded), dealt round-robin.
  std::vector<std::vector<size_t>> fold(folds);
  {
    std::mt19937 rng(seed);
    int next = 0;
    for (const char* kind : {"identifier", "paraphrase", "howto"}) {
      std::vector<size_t> k;
      for (size_t q : all) {
        if (qs[q].kind == kind) k.push_back(q);
      }
      std::shuffle(k.begin(), k.end(), rng);
      for (size_t q : k) fold[next++ % folds].push_back(q);
    }
  }
  std::printf("%zu questions, %d folds (seed %u)\n", qs.size(), folds, seed);
  if (stages == "windows") return TuneWindows(**kb, qs, fold, passage_tokens);
  if (!stages.empty()) {
    std::fprintf(stderr, "--stages: '%s'; expected windows\n", stages.c_str());
    return 2;
  }
  auto mean_sd = [](const std::vector<double>& v) {
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
    double var = 0;
    for (double x : v) var += (x - mean) * (x - mean);
    return std::make_pair(mean, v.size() > 1 ? std::sqrt(var / (v.size() - 1)) : 0.0);
  };
  // The simulation against the daemon's own ranking, on the current defaults.
  {
    double real = 0;
    int differ = 0;
    for (size_t q = 0; q < qs.size(); ++q) {
      KbSearchRequest r;
      r.query = qs[q].query;
      r.log = false;
      r.passage_tokens = passage_tokens;
      auto hits = (*kb)->Search(r);
      double rr = 0;
      for (size_t i = 0; hits.ok() && i < hits->size() && i < 10; ++i) {
        const auto& h = (*hits)[i];
        if (h.doc == qs[q].doc && Norm(h.text).find(Norm(qs[q].needle)) != std::string::npos) {
          rr = 1.0 / (i + 1);
          break;
        }
      }
      real += rr;
      differ += std::abs(rr - ReciprocalRank(pools.Get(q, Defaults()), Defaults())) > 1e-9 ? 1 : 0;
    }
    std::printf(
        "simulation check, current defaults: MRR@10 simulated %.3f, the daemon's %.3f; %d of %zu "
        "questions "
        "rank differently (the simulation merges overlapping passages without their token limit)\n",
        Mrr(pools, all, Defaults()), real / qs.size(), differ, qs.size());
  }
  auto per_kind = [&](const std::vector<size_t>& test, const Settings& s,
                      std::map<std::string, std::vector<double>>* out) {
    for (const char* kind : {"identifier", "paraphrase", "howto"}) {
      std::vector<size_t> sub;
      for (size_t q : test) {
        if (qs[q].kind == kind) sub.push_back(q);
      }
      if (!sub.empty()) (*out)[kind].push_back(Mrr(pools, sub, s));
    }
  };
  auto report = [&](const char* name, const std::vector<double>& held,
                    const std::map<std::string, std::vector<double>>& kinds) {
    const auto [m, sd] = mean_sd(held);
    std::printf("  %-44s held-out MRR@10 %.3f +- %.3f", name, m, sd);
    for (const auto& [kind, v] : kinds) {
      const auto [km, ksd] = mean_sd(v);
      std::printf("; %s %.3f +- %.3f", kind.c_str(), km, ksd);
    }
    std::printf("\n");
  };
  // Fixed settings, scored fold by fold (no choosing involved; the current
  // defaults were chosen on all of these questions before, so theirs is not
  // a held-out figure).
  struct Fixed {
    const char* name;
    Settings s;
  };
  std::vector<Fixed> fixed = {{"neutral settings (nothing chosen)", Neutral()},
                              {"fused order, neutral fusion (no rerank)", FusedOnly(Neutral())},
                              {"fused order, default fusion (no rerank)", FusedOnly(Defaults())},
                              {"current defaults (chosen on all 40 before)", Defaults()},
                              {"current defaults, forward passages", Forward(Defaults())},
                              {"current defaults, within-doc 0.5", WithinDoc(Defaults(), 0.5)},
                              {"current defaults, within-doc 1", WithinDoc(Defaults(), 1.0)}};
  std::printf("fixed settings, per fold:\n");
  for (const auto& f : fixed) {
    std::vector<double> held;
    std::map<std::string, std::vector<double>> kinds;
    for (int g = 0; g < folds; ++g) {
      held.push_back(Mrr(pools, fold[g], f.s));
      per_kind(fold[g], f.s, &kinds);
    }
    report(f.name, held, kinds);
  }
  // Procedures that choose: cross-validated (chosen on K-1 folds, scored on the other).
  struct Procedure {
    const char* name;
    std::function<Settings(const std::vector<size_t>&)> choose;
    bool honest;  // false: starts from settings chosen on all the questions
  };
  auto ascent = [&](Settings start, Mask mask, bool regularized) {
    return [&pools, start, mask, regularized](const std::vector<size_t>& train) {
      return Fit(pools, train, start, mask, regularized ? 1.0 / train.size() : 0.0);
    };
  };
  const Mask kEverything{true, true, true}, kRerankOnly{false, true, false},
      kPassageOnly{false, false, true}, kFusionRerank{true, true, false},
      kRerankForward{false, true, false, true, false},
      kRerankWithin{false, true, false, false, true},
      kRerankForwardWithin{false, true, false, true, true};
  std::vector<Procedure> procedures = {
      {"ascent over reranker weights + forward passages, from neutral",
       ascent(Neutral(), kRerankForward, false), true},
      {"ascent over reranker weights + within-doc, from neutral",
       ascent(Neutral(), kRerankWithin, false), true},
      {"ascent over reranker + forward + within-doc, from neutral",
       ascent(Neutral(), kRerankForwardWithin, false), true},
      {"forward passages fixed on, ascent over reranker weights",
       ascent(Forward(Neutral()), kRerankOnly, false), true},
      {"within-doc 1 fixed, ascent over reranker weights",
       ascent(WithinDoc(Neutral(), 1.0), kRerankOnly, false), true},
      {"ascent over everything, from neutral", ascent(Neutral(), kEverything, false), true},
      {"ascent over reranker weights, from neutral", ascent(Neutral(), kRerankOnly, false), true},
      {"ascent over passage weights, from neutral", ascent(Neutral(), kPassageOnly, false), true},
      {"ascent over passage weights, from defaults*", ascent(Defaults(), kPassageOnly, false),
       false},
      {"ascent over fusion + reranker, from fused order",
       ascent(FusedOnly(Neutral()), kFusionRerank, false), true},
      {"same, a step must gain 1/n (regularized)",
       ascent(FusedOnly(Neutral()), kFusionRerank, true), true},
      {"ascent over everything from neutral, regularized", ascent(Neutral(), kEverything, true),
       true},
      {"blend fused order -> neutral reranker (a only)",
       [&pools](const std::vector<size_t>& train) { return FitBlend(pools, train, false); }, true},
      {"blend, a and fusion settings",
       [&pools](const std::vector<size_t>& train) { return FitBlend(pools, train, true); }, true},
  };
  std::printf("choosing procedures, cross-validated:\n");
  double best_cv = -1;
  const Procedure* best_proc = nullptr;
  for (const auto& p : procedures) {
    std::vector<double> held;
    std::map<std::string, std::vector<double>> kinds;
    for (int f = 0; f < folds; ++f) {
      std::vector<size_t> train;
      for (int g = 0; g < folds; ++g) {
        if (g != f) train.insert(train.end(), fold[g].begin(), fold[g].end());
      }
      const Settings chosen = p.choose(train);
      held.push_back(Mrr(pools, fold[f], chosen));
      per_kind(fold[f], chosen, &kinds);
      std::printf("    fold %d: held out %.3f (train %.3f)  %s\n", f + 1, held.back(),
                  Mrr(pools, train, chosen), Describe(chosen).c_str());
    }
    report(p.name, held, kinds);
    const double m = mean_sd(held).first;
    if (p.honest && m > best_cv) {
      best_cv = m;
      best_proc = &p;
    }
  }
  const Settings final_choice = best_proc->choose(all);
  std::printf("(* starts from settings chosen on all the questions: not a held-out figure)\n");
  std::printf(
      "best procedure by cross-validation: %s (%.3f); applied to all %zu questions:\n  %s\n",
      best_proc->name, best_cv, qs.size(), Describe(final_choice).c_str());
  PrintKinds("all questions, that choice:", pools, qs, all, final_choice);
  PrintKinds("all questions, defaults:", pools, qs, all, Defaults());
  if (!check_path.empty()) {
    const std::vector<Query> other = LoadQueries(check_path);
    Pools other_pools(**kb, other, passage_tokens);
    std::vector<size_t> o(other.size());
    std::iota(o.begin(), o.end(), 0);
    std::printf("%s (%zu questions):\n", check_path.c_str(), other.size());
    PrintKinds("the choice above:", other_pools, other, o, final_choice);
    PrintKinds("current defaults:", other_pools, other, o, Defaults());
  }
  return 0;
}
