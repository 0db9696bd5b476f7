// Rerankers reorder fused candidates. The built-in one needs no weights: a
// weighted sum of features in [0,1] (exact identifier match, query-term
// coverage, proximity, title-path/doc-name match, vector similarity, lexical
// and fusion rank), so its score is in [0,1] too.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct RerankCandidate {
  std::string text;
  std::string context;  // doc name, doc title and title path
  double vector_sim = 0;   // cosine, or 0 if absent
  double lexical_norm = 0;  // BM25 score / best BM25 score of the query
  double fused_norm = 0;    // fused score / best fused score
};

struct RerankWeights {
  double identifier = 0.30;
  double coverage = 0.20;
  double proximity = 0.10;
  double context = 0.10;
  double vector = 0.05;
  double lexical = 0.10;
  double fused = 0.15;
};

class Reranker {
 public:
  virtual ~Reranker() = default;
  virtual std::string name() const = 0;
  // Scores in [0,1], one per candidate, same order.
  [[nodiscard]] virtual absl::StatusOr<std::vector<double>> Score(
      const std::string& query, const std::vector<RerankCandidate>& candidates) = 0;
};

std::unique_ptr<Reranker> MakeBuiltinReranker(RerankWeights weights = {});

// The features the built-in reranker uses, exposed for fitting and tests.
struct RerankFeatures {
  double identifier, coverage, proximity, context, vector, lexical, fused;
};
RerankFeatures ComputeRerankFeatures(const std::string& query, const RerankCandidate& c);

}  // namespace fwai
