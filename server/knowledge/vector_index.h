// Vectors by chunk id over FAISS: exact inner product below a size threshold,
// HNSW above it (efSearch chosen so recall@10 against exact search is at
// least 0.95 on a sample). Deletions are tombstones with filtered search; a
// rebuild is due past a tombstone ratio. Saved atomically (temp + rename)
// with a generation number. Not thread-safe for writers: the owner holds a
// lock; concurrent Search calls are safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace faiss {
struct Index;
}

namespace fwai {

struct VectorIndexOptions {
  size_t exact_below = 20000;  // vectors; HNSW at and above
  int hnsw_m = 32;
  int ef_construction = 80;
  int ef_search = 0;  // 0: choose by measured recall
  // Threads that insert into the HNSW graph; 0 uses every core. The graph a
  // multi-threaded build makes depends on scheduling; 1 makes it reproducible.
  int build_threads = 0;
  double rebuild_tombstone_ratio = 0.25;
};

class VectorIndex {
 public:
  VectorIndex(int dimension, VectorIndexOptions options);
  ~VectorIndex();
  VectorIndex(const VectorIndex&) = delete;
  VectorIndex& operator=(const VectorIndex&) = delete;

  // `vectors` holds ids.size() * dimension floats, unit length.
  void Add(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);
  void Remove(uint32_t id);
  bool NeedsRebuild() const;
  // Replaces the contents (picks flat or HNSW by size).
  void Build(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);

  std::vector<std::pair<uint32_t, float>> Search(const float* query, size_t k,
                                                 const std::function<bool(uint32_t)>& accept = nullptr) const;

  size_t size() const { return ids_.size() - dead_.size(); }
  int dimension() const { return dim_; }
  std::string kind() const;
  int ef_search() const { return ef_search_; }

  [[nodiscard]] absl::Status Save(const std::string& path, uint64_t generation) const;
  // NOT_FOUND if absent; FAILED_PRECONDITION if stale (other generation or
  // dimension); DATA_LOSS if damaged.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VectorIndex>> Load(const std::string& path,
                                                                        uint64_t generation, int dimension,
                                                                        VectorIndexOptions options);

 private:
  void BuildInternal(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);
  void TuneEfSearch(const std::vector<float>& vectors);
  std::vector<float> LiveVectors(std::vector<uint32_t>* ids) const;

  const int dim_;
  const VectorIndexOptions options_;
  std::unique_ptr<faiss::Index> index_;
  bool hnsw_ = false;
  int ef_search_ = 0;
  std::vector<uint32_t> ids_;             // FAISS position -> chunk id
  std::unordered_set<uint32_t> dead_;     // tombstoned positions
  std::unordered_map<uint32_t, uint32_t> pos_;  // chunk id -> position
};

}  // namespace fwai
