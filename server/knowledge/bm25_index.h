// An in-memory BM25 index over documents named by dense uint32 ids (chunk
// ordinals), in two tiers: an immutable base read from a saved image
// (memory-mapped; postings compressed: delta-coded document ids and term
// frequencies as varints, terms sorted and found by binary search, so
// opening a million-chunk index costs a mapping, not a load), and a mutable
// tier for what was added since. Removing a base document hides it (its
// postings are dropped at the next save); saving writes one merged image.
// Each term's saved postings are cut into blocks of 128 with a skip entry
// (last doc, end offset, largest tf, shortest doc) so a search can skip
// blocks and bound a term's score (MaxScore: only the top k are scored
// exactly, not every posting); an image may also carry each term's postings
// over groups of docs (a chunk's document: summed tf), so document-level
// BM25 reads one posting per document instead of one per chunk.
// Not thread-safe: the owner serializes writers against readers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
    float b = 0.3f;  // length normalization at group level
    // True if every doc of a group maps to that group in `group_of` and
    // the saved image's group postings were written with a group key that
    // is a member doc (see Save): then group scores come from the image's
    // group postings (plus the mutable tier's docs) instead of every doc's.
    bool by_member = false;
    std::vector<std::pair<uint32_t, float>> scores;  // out: every scored group, unordered
  };
  // Indexes `doc` with its terms; replaces an existing doc of that id.
  void Add(uint32_t doc, const std::vector<std::string>& terms);
  void Remove(uint32_t doc);
  bool Contains(uint32_t doc) const { return doc < doc_len_.size() && doc_len_[doc] > 0; }
  size_t size() const { return num_docs_; }
  size_t num_terms() const;
  // How many docs hold `term` (hidden base docs count until the next save).
  size_t DocFreq(const std::string& term) const;

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

  // The same top `k` (the same docs, scores and order) and, with `groups`,
  // the same group scores as Search() with `all` and `groups`, but only the
  // docs that can still reach the top k are scored (MaxScore over the
  // saved image's skip blocks) and groups are read from the group postings.
  // nullopt if the index cannot (no base image with skips; groups asked for
  // and not `by_member` or not saved with the image): use Search().
  std::optional<std::vector<std::pair<uint32_t, float>>> SearchPruned(
      const std::vector<std::pair<std::string, float>>& weighted_query, size_t k,
      const std::function<bool(uint32_t)>& accept, Groups* groups) const;
  // The exact scores (as Search() computes them) of those of `docs` that
  // match a query term and are accepted, in the order of `docs`.
  std::vector<std::pair<uint32_t, float>> ScoreDocs(
      const std::vector<std::pair<std::string, float>>& weighted_query,
      const std::vector<uint32_t>& docs, const std::function<bool(uint32_t)>& accept) const;
  // Off: the plain Search() scores every posting even when it could prune
  // (for comparisons); on by default.
  void set_pruning(bool on) { pruning_ = on; }

  // The length of `doc` in terms (0 if absent).
  uint32_t Length(uint32_t doc) const {
    return doc < doc_len_.size() && doc_len_[doc] > 0 ? doc_len_[doc] - 1 : 0;
  }

  // Writes the merged image to `path` atomically (temp + rename, synced),
  // stamped with `generation`. With `group_key` (doc -> a member doc of its
  // group, kNoGroup: none), each term's group postings are saved as well.
  [[nodiscard]] absl::Status Save(
      const std::string& path, uint64_t generation,
      const std::function<uint32_t(uint32_t)>& group_key = nullptr) const;
  // After a save written from a copy of `newer`, while `newer` went on
  // taking writes: makes this index (the saved image, loaded) hold what
  // `newer` holds, by hiding the docs `newer` removed since and adding the
  // docs it has and this one lacks, from `newer`'s mutable tier. A doc's id
  // names its content (a changed doc comes back under a new id). False,
  // with this index unusable, if a doc to add is not in `newer`'s mutable
  // tier.
  [[nodiscard]] bool CatchUp(const Bm25Index& newer);
  // Maps a saved image as the base tier. NOT_FOUND if absent;
  // FAILED_PRECONDITION if it carries another generation; DATA_LOSS if
  // damaged or truncated.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Bm25Index>> Load(const std::string& path,
                                                                       uint64_t generation);
  // The same image as bytes, and back (generation 0).
  std::string Serialize() const;
  [[nodiscard]] static absl::StatusOr<Bm25Index> Deserialize(std::string_view bytes);
  // Bytes of postings held in memory by the mutable tier, and mapped by the base.
  size_t mutable_bytes() const;
  size_t base_bytes() const;
  // The layout version of the mapped image (3 without one); older images
  // are searched exhaustively until they are saved again.
  int image_version() const;

  struct Image;  // a parsed saved image (the base tier)

 private:
  struct Posting {
    uint32_t doc;
    uint32_t tf;
  };
  uint32_t TermId(const std::string& term);
  void Write(const std::function<void(const char*, size_t)>& out, uint64_t generation,
             const std::function<uint32_t(uint32_t)>& group_key) const;
  struct Cursor;
  // A query term as SearchPruned walks it: its weight, idf, the bound of
  // its contribution and its cursor over both tiers.
  struct PrunedTerm;
  // The best `k` accepted docs of `terms` by MaxScore (best first).
  std::vector<std::pair<uint32_t, float>> MaxScoreTopK(
      std::vector<std::unique_ptr<PrunedTerm>>& terms, size_t k,
      const std::function<bool(uint32_t)>& accept, float avg_len) const;
  static absl::StatusOr<Bm25Index> FromImage(std::shared_ptr<const Image> image);

  Bm25Params params_;
  bool pruning_ = true;
  // Base tier: the saved image and which of its docs are still live.
  std::shared_ptr<const Image> base_;
  std::vector<bool> base_live_;
  // Mutable tier.
  std::unordered_map<std::string, uint32_t> terms_;
  std::vector<std::vector<Posting>> postings_;  // by term id, sorted by doc
  // The mutable tier's docs: each one's distinct term ids (only theirs: a
  // doc-indexed vector made a million long by the first add after a load).
  std::unordered_map<uint32_t, std::vector<uint32_t>> doc_terms_;
  // Both tiers.
  std::vector<uint32_t> doc_len_;  // by doc; 0 = absent, else length + 1
  size_t num_docs_ = 0;
  uint64_t total_len_ = 0;
};

}  // namespace fwai
