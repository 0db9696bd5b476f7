#include "server/knowledge/reranker.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <unordered_map>

#include "server/knowledge/tokenizer.h"

namespace fwai {
namespace {

std::string Lower(const std::string& s) {
  std::string o = s;
  for (auto& c : o) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return o;
}

}  // namespace

RerankFeatures ComputeRerankFeatures(const std::string& query, const RerankCandidate& c) {
  RerankFeatures f{};
  // Exact identifier matches (case-insensitive, whole).
  auto ids = FindIdentifiers(query);
  if (!ids.empty()) {
    const std::string text = Lower(c.text) + "\n" + Lower(c.context);
    int hit = 0;
    for (const auto& id : ids) hit += text.find(Lower(id)) != std::string::npos ? 1 : 0;
    f.identifier = static_cast<double>(hit) / ids.size();
  }
  // Coverage and proximity over distinct query terms.
  std::vector<std::string> qterms, tterms, cterms;
  Tokenize(query, &qterms);
  std::set<std::string> qset(qterms.begin(), qterms.end());
  if (!qset.empty()) {
    Tokenize(c.text, &tterms);
    Tokenize(c.context, &cterms);
    std::set<std::string> tset(tterms.begin(), tterms.end());
    std::set<std::string> cset(cterms.begin(), cterms.end());
    int in_text = 0, in_ctx = 0;
    for (const auto& q : qset) {
      in_text += tset.count(q) ? 1 : 0;
      in_ctx += cset.count(q) ? 1 : 0;
    }
    f.coverage = static_cast<double>(in_text) / qset.size();
    f.context = static_cast<double>(in_ctx) / qset.size();
    // Smallest window holding every query term present in the text.
    if (in_text >= 2) {
      std::unordered_map<std::string, int> need;
      for (const auto& q : qset) {
        if (tset.count(q)) need[q] = 0;
      }
      const int wanted = static_cast<int>(need.size());
      int have = 0;
      size_t best = tterms.size() + 1, lo = 0;
      for (size_t hi = 0; hi < tterms.size(); ++hi) {
        auto it = need.find(tterms[hi]);
        if (it != need.end() && it->second++ == 0) ++have;
        while (have == wanted) {
          best = std::min(best, hi - lo + 1);
          auto jt = need.find(tterms[lo]);
          if (jt != need.end() && --jt->second == 0) --have;
          ++lo;
        }
      }
      f.proximity = best <= tterms.size() ? std::min(1.0, static_cast<double>(wanted) / best * 2.0) : 0.0;
    } else {
      f.proximity = in_text == 1 ? 0.2 : 0.0;
    }
  }
  f.vector = std::clamp(c.vector_sim, 0.0, 1.0);
  f.lexical = std::clamp(c.lexical_norm, 0.0, 1.0);
  f.fused = std::clamp(c.fused_norm, 0.0, 1.0);
  f.doc = std::clamp(c.doc_match, 0.0, 1.0);
  return f;
}

namespace {

class BuiltinReranker final : public Reranker {
 public:
  explicit BuiltinReranker(RerankWeights w) : w_(w) {
    double sum = w_.identifier + w_.coverage + w_.proximity + w_.context + w_.vector + w_.lexical + w_.fused + w_.doc;
    norm_ = sum > 0 ? 1.0 / sum : 1.0;
  }
  std::string name() const override { return "builtin"; }
  absl::StatusOr<std::vector<double>> Score(const std::string& query,
                                            const std::vector<RerankCandidate>& cands) override {
    const bool has_ids = !FindIdentifiers(query).empty();
    std::vector<double> out;
    out.reserve(cands.size());
    for (const auto& c : cands) {
      RerankFeatures f = ComputeRerankFeatures(query, c);
      // Without identifiers in the query, their weight goes to coverage.
      double wi = has_ids ? w_.identifier : 0.0;
      double wc = has_ids ? w_.coverage : w_.coverage + w_.identifier;
      double s = wi * f.identifier + wc * f.coverage + w_.proximity * f.proximity + w_.context * f.context +
                 w_.vector * f.vector + w_.lexical * f.lexical + w_.fused * f.fused + w_.doc * f.doc;
      out.push_back(std::clamp(s * norm_, 0.0, 1.0));
    }
    return out;
  }

 private:
  RerankWeights w_;
  double norm_;
};

}  // namespace

std::unique_ptr<Reranker> MakeBuiltinReranker(RerankWeights weights) {
  return std::make_unique<BuiltinReranker>(weights);
}

}  // namespace fwai
