// An in-memory BM25 index over documents named by dense uint32 ids (chunk
// ordinals). Incremental add and remove; serializes to bytes so a restart
// loads postings instead of re-tokenizing the corpus. Not thread-safe: the
// owner serializes writers against readers.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

struct Bm25Params {
  float k1 = 1.2f;
  float b = 0.75f;
};

class Bm25Index {
 public:
  explicit Bm25Index(Bm25Params params = {}) : params_(params) {}

  // BM25 over groups of docs (a chunk's document), scored in the same pass
  // as the docs: a group's term frequency is the sum of its members', its
  // length `group_len[g]` (the sum of theirs), and document frequency counts
  // groups. `group_of[doc]` names the group (kNoGroup or out of range: none).
  static constexpr uint32_t kNoGroup = 0xffffffffu;
  struct Groups {
    const std::vector<uint32_t>* group_of = nullptr;
    const std::vector<uint32_t>* group_len = nullptr;
    uint32_t present = 0;  // groups with a length
    float avg_len = 0;
    float b = 0.3f;        // length normalization at group level
    std::vector<std::pair<uint32_t, float>> scores;  // out: every scored group, unordered
  };
  // Indexes `doc` with its terms; replaces an existing doc of that id.
  void Add(uint32_t doc, const std::vector<std::string>& terms);
  void Remove(uint32_t doc);
  bool Contains(uint32_t doc) const { return doc < doc_len_.size() && doc_len_[doc] > 0; }
  size_t size() const { return num_docs_; }
  size_t num_terms() const { return terms_.size(); }
  // How many docs hold `term`.
  size_t DocFreq(const std::string& term) const {
    auto it = terms_.find(term);
    return it == terms_.end() ? 0 : postings_[it->second].size();
  }

  // The `k` best docs for `query` terms, best first; `accept` (optional) filters.
  std::vector<std::pair<uint32_t, float>> Search(
      const std::vector<std::string>& query, size_t k,
      const std::function<bool(uint32_t)>& accept = nullptr) const;
  // The same with a weight per query term (expansions weigh less); `all`
  // (optional) receives every accepted doc's score, unordered; `groups`
  // (optional) scores groups of docs as well (see Groups).
  std::vector<std::pair<uint32_t, float>> Search(
      const std::vector<std::pair<std::string, float>>& weighted_query, size_t k,
      const std::function<bool(uint32_t)>& accept = nullptr,
      std::vector<std::pair<uint32_t, float>>* all = nullptr, Groups* groups = nullptr) const;

  // The length of `doc` in terms (0 if absent).
  uint32_t Length(uint32_t doc) const { return doc < doc_len_.size() && doc_len_[doc] > 0 ? doc_len_[doc] - 1 : 0; }

  std::string Serialize() const;
  // Fails with DATA_LOSS on a truncated or damaged image.
  [[nodiscard]] static absl::StatusOr<Bm25Index> Deserialize(std::string_view bytes);

 private:
  struct Posting {
    uint32_t doc;
    uint32_t tf;
  };
  uint32_t TermId(const std::string& term);
  // doc_terms_ is only needed to remove documents; after a load it is built
  // on first use, so a restart does not pay for it.
  void EnsureDocTerms();

  Bm25Params params_;
  std::unordered_map<std::string, uint32_t> terms_;
  std::vector<std::vector<Posting>> postings_;  // by term id, sorted by doc
  std::vector<uint32_t> doc_len_;               // by doc; 0 = absent, else length + 1
  std::vector<std::vector<uint32_t>> doc_terms_;  // by doc: its distinct term ids
  bool doc_terms_ready_ = true;
  size_t num_docs_ = 0;
  uint64_t total_len_ = 0;
};

}  // namespace fwai
