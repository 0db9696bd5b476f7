// Vectors by chunk id over FAISS: exact inner product below a size threshold,
// an approximate index above it: HNSW over full vectors, or IVF with 8-bit
// scalar-quantized vectors (a quarter of the memory, built in minutes where
// HNSW takes hours at a million vectors; trained on a sample, retrained when
// the collection has grown fourfold). The search breadth (HNSW efSearch, IVF
// nprobe) is chosen so recall@10 against exact search is at least 0.95 on a
// sample. An approximate index whose breadth cap leaves it below
// `min_recall` on that sample is not kept: the index is off (searches find
// nothing, adds record ids only) until the collection has grown by the
// retrain growth and a build measures again. Deletions are tombstones with
// filtered search; a rebuild is due past a tombstone ratio (or, for IVF or
// an index that is off, the growth above). Saved atomically
// (temp + rename) with a generation number. Not thread-safe for writers: the
// owner holds a lock; concurrent Search calls are safe.
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
  size_t exact_below = 20000;        // vectors; the approximate kind at and above
  std::string approximate = "hnsw";  // hnsw | ivf
  int hnsw_m = 32;
  int ef_construction = 80;
  int ef_search = 0;  // 0: choose by measured recall
  // Threads that insert into the HNSW graph; 0 uses every core. The graph a
  // multi-threaded build makes depends on scheduling; 1 makes it reproducible.
  int build_threads = 0;
  int ivf_lists = 0;   // 0: about 4 * sqrt(n), a power of two
  int ivf_nprobe = 0;  // 0: choose by measured recall
  // The most lists a search probes when the breadth is chosen by recall: this
  // share of them (at least 16). Each probed list is scanned in full, so the
  // share bounds a search's cost: where the vectors have little cluster
  // structure the recall bar alone asks for every list, which at a million
  // vectors is a 256 MB scan per search.
  double ivf_max_probe_share = 1.0 / 32;
  double ivf_retrain_growth = 4;  // retrain once this many times the vectors it was trained on
  double rebuild_tombstone_ratio = 0.25;
  // An approximate index whose chosen breadth reaches a recall@10 below this
  // on its sample (at the breadth cap) is dropped: kind() "off". 0: every
  // index is kept. Only an index whose breadth was chosen by measurement is
  // judged (a breadth the options name is kept as named). Once off, the
  // vectors are gone: the owner rebuilds from its own store when
  // NeedsRebuild() says so (build_on_add cannot, having nothing to build from).
  double min_recall = 0;
  // Add() turns an exact index approximate when it reaches `exact_below`.
  // False: it stays exact and NeedsRebuild() says a build is due, so the
  // owner can build the new index aside, without its lock, and swap it in.
  bool build_on_add = true;
};

// FAISS's matrix products (its BLAS, OpenBLAS on Debian) run on the thread
// that asks for them, at that thread's priority. OpenBLAS otherwise starts its
// own workers when it loads, at the priority of the process, and hands them
// half of every large product: a background thread's index update (the coarse
// assignment of each document's chunks, the training of the lists) ran half at
// normal priority, beside the streaming turns. The workers it started are
// ended. Idempotent; fwaid calls it before it starts any thread of its own, and
// every VectorIndex calls it. Returns whether a BLAS with its own threads was
// found and confined.
bool RunBlasOnCallingThreads();

class VectorIndex {
 public:
  VectorIndex(int dimension, VectorIndexOptions options);
  ~VectorIndex();
  VectorIndex(const VectorIndex&) = delete;
  VectorIndex& operator=(const VectorIndex&) = delete;

  // `vectors` holds ids.size() * dimension floats, unit length.
  void Add(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);
  // The IVF lists `vectors` go to (empty for other kinds): the costly part of
  // an IVF add, a search of the coarse centroids, made without changing the
  // index, so it may run concurrently with searches (outside the owner's
  // write lock). Valid for Add() until the index is rebuilt or retrained.
  struct Assignment {
    uint64_t epoch = 0;  // the coarse quantizer it was made with (see epoch_)
    std::vector<int64_t> lists;
  };
  Assignment Assign(const std::vector<float>& vectors) const;
  // Add() with lists from Assign(); if they were made by another quantizer
  // (the index was rebuilt since), they are computed again.
  void Add(const std::vector<uint32_t>& ids, const std::vector<float>& vectors,
           const Assignment& assignment);
  void Remove(uint32_t id);
  bool NeedsRebuild() const;
  // Replaces the contents (picks flat or HNSW by size).
  void Build(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);

  std::vector<std::pair<uint32_t, float>> Search(
      const float* query, size_t k, const std::function<bool(uint32_t)>& accept = nullptr) const;

  size_t size() const { return ids_.size() - dead_.size(); }
  int dimension() const { return dim_; }
  // "flat", "hnsw", "ivf-sq8" or "off"; describe() adds the search breadth
  // (or, when off, the index that was tried and the recall it reached).
  std::string kind() const;
  std::string describe() const;
  // Off: the approximate index was below `min_recall` and was dropped.
  bool off() const { return off_; }
  // Why it is off, e.g. "ivf-sq8(lists=1024,nprobe=32) reached recall@10
  // 0.41 < 0.90 on its sample"; "" when it is not.
  const std::string& off_reason() const { return off_reason_; }
  int ef_search() const { return ef_search_; }
  // The recall@10 against exact search the breadth reached on the tuning
  // sample, or -1 if it was not tuned in this process (loaded, or given).
  double tuned_recall() const { return tuned_recall_; }
  // IVF: vectors in the added tier (see tier_); 0 after a build or load.
  size_t added_tier_size() const;
  // Bytes the index holds in memory (approximately: codes, links, lists).
  size_t memory_bytes() const;

  [[nodiscard]] absl::Status Save(const std::string& path, uint64_t generation) const;
  // Save() in two steps: the saved form copied into memory (the owner holds
  // its lock for this copy only), then written to `path` without the index.
  struct Image {
    std::vector<uint8_t> faiss;  // the index (IVF: the built or loaded part)
    std::vector<uint8_t> tier;   // IVF: the added part, merged in when written
    std::string meta;            // up to the FAISS file's size
    uint64_t trained_on = 0;
    std::string off_reason;  // an index that is off: why
  };
  [[nodiscard]] absl::StatusOr<Image> Capture(uint64_t generation) const;
  [[nodiscard]] static absl::Status WriteImage(const Image& image, const std::string& path);
  // NOT_FOUND if absent; FAILED_PRECONDITION if stale (other generation or
  // dimension); DATA_LOSS if damaged.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<VectorIndex>> Load(
      const std::string& path, uint64_t generation, int dimension, VectorIndexOptions options);

 private:
  void BuildInternal(const std::vector<uint32_t>& ids, const std::vector<float>& vectors);
  void TuneEfSearch(const std::vector<float>& vectors);
  // Sets the breadth (efSearch / nprobe) from `candidates`, the first that
  // reaches recall@10 >= 0.98 against exact search on a sample, for each kind
  // of sample query (noisy copies, mixtures).
  // Returns the recall@10 reached (the lower of the two kinds).
  double TuneBreadth(const std::vector<float>& vectors, const std::vector<int>& candidates,
                     const std::function<void(int)>& set);
  // The IVF breadth cap for `lists` lists (see ivf_max_probe_share).
  static int MaxProbes(size_t lists, const VectorIndexOptions& o);
  // After a build: drops an approximate index whose tuned recall is below
  // options_.min_recall (see off()).
  void DropIfBelowRecall();
  std::vector<float> LiveVectors(std::vector<uint32_t>* ids) const;
  // index_'s search and, with a tier, the tier's, merged: the `k` best.
  void SearchBoth(const float* query, size_t k, float* dist, int64_t* labels) const;

  const int dim_;
  const VectorIndexOptions options_;
  std::unique_ptr<faiss::Index> index_;
  // IVF: the vectors added since the index was built or loaded, in lists of
  // their own over the same centroids (labels: their positions). The lists of
  // `index_`, sized exactly when loaded, are then never reallocated by an
  // add; a search probes both; a save writes them merged as one index.
  std::unique_ptr<faiss::Index> tier_;
  bool hnsw_ = false;
  bool ivf_ = false;
  bool off_ = false;                   // see off(); neither hnsw_ nor ivf_ then
  std::string off_reason_;             // see off_reason()
  int ef_search_ = 0;                  // HNSW efSearch or IVF nprobe
  size_t trained_on_ = 0;              // IVF, off: vectors when trained (measured)
  uint64_t epoch_ = 0;                 // IVF: names its coarse quantizer (unique per process)
  double tuned_recall_ = -1;           // recall@10 the breadth reached when tuned here
  std::vector<uint32_t> ids_;          // FAISS position -> chunk id
  std::unordered_set<uint32_t> dead_;  // tombstoned positions
  std::unordered_map<uint32_t, uint32_t> pos_;  // chunk id -> position
};

}  // namespace fwai
