#include "server/knowledge/reranker.h"

#include <algorithm>
#include <cctype>
#include <unordered_map>

#include "server/knowledge/tokenizer.h"

namespace fwai {
namespace {

std::string Lower(const std::string& s) {
  std::string o = s;
  for (auto& c : o) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return o;
}

}  // namespace

namespace {

// What the features need from the query, computed once per query.
struct PreparedQuery {
  std::vector<std::string> ids;                // lowercase identifiers
  std::unordered_map<std::string, int> terms;  // distinct terms -> index
};

PreparedQuery Prepare(const std::string& query) {
  PreparedQuery p;
  for (const auto& id : FindIdentifiers(query)) p.ids.push_back(Lower(id));
  std::vector<std::string> qterms;
  Tokenize(query, &qterms);
  for (const auto& t : qterms) p.terms.emplace(t, static_cast<int>(p.terms.size()));
  return p;
}

RerankFeatures Compute(const PreparedQuery& q, const RerankCandidate& c) {
  RerankFeatures f{};
  // Exact identifier matches (case-insensitive, whole).
  if (!q.ids.empty()) {
    const std::string text = Lower(c.text) + "\n" + Lower(c.context);
    int hit = 0;
    for (const auto& id : q.ids) hit += text.find(id) != std::string::npos ? 1 : 0;
    f.identifier = static_cast<double>(hit) / q.ids.size();
  }
  // Coverage and proximity over distinct query terms.
  const size_t nq = q.terms.size();
  if (nq > 0) {
    std::vector<std::string> tterms, cterms;
    Tokenize(c.text, &tterms);
    Tokenize(c.context, &cterms);
    std::vector<int> pos(tterms.size(), -1);  // query-term index of each text term
    std::vector<char> in_text(nq, 0), in_ctx(nq, 0);
    for (size_t i = 0; i < tterms.size(); ++i) {
      auto it = q.terms.find(tterms[i]);
      if (it != q.terms.end()) {
        pos[i] = it->second;
        in_text[it->second] = 1;
      }
    }
    for (const auto& t : cterms) {
      auto it = q.terms.find(t);
      if (it != q.terms.end()) in_ctx[it->second] = 1;
    }
    int n_text = 0, n_ctx = 0;
    for (size_t i = 0; i < nq; ++i) {
      n_text += in_text[i];
      n_ctx += in_ctx[i];
    }
    f.coverage = static_cast<double>(n_text) / nq;
    f.context = static_cast<double>(n_ctx) / nq;
    // Smallest window holding every query term present in the text.
    if (n_text >= 2) {
      std::vector<int> count(nq, 0);
      int have = 0;
      size_t best = tterms.size() + 1, lo = 0;
      for (size_t hi = 0; hi < tterms.size(); ++hi) {
        if (pos[hi] >= 0 && count[pos[hi]]++ == 0) ++have;
        while (have == n_text) {
          best = std::min(best, hi - lo + 1);
          if (pos[lo] >= 0 && --count[pos[lo]] == 0) --have;
          ++lo;
        }
      }
      f.proximity =
          best <= tterms.size() ? std::min(1.0, static_cast<double>(n_text) / best * 2.0) : 0.0;
    } else {
      f.proximity = n_text == 1 ? 0.2 : 0.0;
    }
  }
  f.vector = std::clamp(c.vector_sim, 0.0, 1.0);
  f.lexical = std::clamp(c.lexical_norm, 0.0, 1.0);
  f.fused = std::clamp(c.fused_norm, 0.0, 1.0);
  f.doc = std::clamp(c.doc_match, 0.0, 1.0);
  f.doc_text = std::clamp(c.doc_text, 0.0, 1.0);
  f.named = std::clamp(c.named, 0.0, 1.0);
  return f;
}

}  // namespace

RerankFeatures ComputeRerankFeatures(const std::string& query, const RerankCandidate& c) {
  return Compute(Prepare(query), c);
}

namespace {

class BuiltinReranker final : public Reranker {
 public:
  explicit BuiltinReranker(RerankWeights w) : w_(w) {
    double sum = w_.identifier + w_.coverage + w_.proximity + w_.context + w_.vector + w_.lexical +
                 w_.fused + w_.doc + w_.doc_text + w_.named;
    norm_ = sum > 0 ? 1.0 / sum : 1.0;
  }
  std::string name() const override { return "builtin"; }
  absl::StatusOr<std::vector<double>> Score(const std::string& query,
                                            const std::vector<RerankCandidate>& cands) override {
    const PreparedQuery q = Prepare(query);
    const bool has_ids = !q.ids.empty();
    std::vector<double> out;
    out.reserve(cands.size());
    for (const auto& c : cands) {
      RerankFeatures f = Compute(q, c);
      // Without identifiers in the query, their weight goes to coverage.
      double wi = has_ids ? w_.identifier : 0.0;
      double wc = has_ids ? w_.coverage : w_.coverage + w_.identifier;
      double s = wi * f.identifier + wc * f.coverage + w_.proximity * f.proximity +
                 w_.context * f.context + w_.vector * f.vector + w_.lexical * f.lexical +
                 w_.fused * f.fused + w_.doc * f.doc + w_.doc_text * f.doc_text +
                 w_.named * f.named;
      out.push_back(std::clamp(s * norm_, 0.0, 1.0));
    }
    return out;
  }

 private:
  RerankWeights w_;
  double norm_;
};

}  // namespace

bool SetRerankWeight(RerankWeights& w, const std::string& feature, double value) {
  double RerankWeights::*field = nullptr;
  if (feature == "identifier") field = &RerankWeights::identifier;
  if (feature == "coverage") field = &RerankWeights::coverage;
  if (feature == "proximity") field = &RerankWeights::proximity;
  if (feature == "context") field = &RerankWeights::context;
  if (feature == "vector") field = &RerankWeights::vector;
  if (feature == "lexical") field = &RerankWeights::lexical;
  if (feature == "fused") field = &RerankWeights::fused;
  if (feature == "doc") field = &RerankWeights::doc;
  if (feature == "doc_text") field = &RerankWeights::doc_text;
  if (feature == "named") field = &RerankWeights::named;
  if (field == nullptr) return false;
  w.*field = value;
  return true;
}

std::unique_ptr<Reranker> MakeBuiltinReranker(RerankWeights weights) {
  return std::make_unique<BuiltinReranker>(weights);
}

}  // namespace fwai
