#include "server/knowledge/vector_index.h"

#include <dlfcn.h>
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVF.h>
#include <faiss/IndexScalarQuantizer.h>
#include <faiss/impl/io.h>
#include <faiss/index_io.h>
#include <faiss/utils/distances.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <sstream>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace fwai {

using idx_t = faiss::Index::idx_t;

namespace {
// Each IVF coarse quantizer built or loaded gets a number no other had.
std::atomic<uint64_t> next_epoch{1};
}  // namespace

bool RunBlasOnCallingThreads() {
  static std::once_flag once;
  static bool confined = false;
  std::call_once(once, [] {
    // Looked up, not linked: the BLAS behind libblas.so.3 is the system's
    // choice (reference BLAS and others have no threads of their own).
    using SetThreads = void (*)(int);
    if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
      set(1);
      confined = true;
      // The workers OpenBLAS started as it loaded would go on waiting for
      // work in a loop of sched_yield for a while (about a tenth of a second
      // of a core at each start), then sleep for good: end them now. With one
      // thread, OpenBLAS never starts them again.
      using Shutdown = int (*)();
      if (auto end = reinterpret_cast<Shutdown>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_")))
        end();
    }
  });
  return confined;
}

VectorIndex::VectorIndex(int dimension, VectorIndexOptions options)
    : dim_(dimension), options_(options), index_(std::make_unique<faiss::IndexFlatIP>(dimension)) {
  RunBlasOnCallingThreads();
}

VectorIndex::~VectorIndex() = default;

std::string VectorIndex::kind() const {
  return off_ ? "off" : hnsw_ ? "hnsw" : ivf_ ? "ivf-sq8" : "flat";
}

std::string VectorIndex::describe() const {
  if (off_) return absl::StrCat("off(", off_reason_, ")");
  if (hnsw_) return absl::StrCat("hnsw(M=", options_.hnsw_m, ",efSearch=", ef_search_, ")");
  if (ivf_) {
    return absl::StrCat("ivf-sq8(lists=", static_cast<const faiss::IndexIVF*>(index_.get())->nlist,
                        ",nprobe=", ef_search_, ")");
  }
  return "flat";
}

size_t VectorIndex::added_tier_size() const {
  return tier_ ? static_cast<size_t>(tier_->ntotal) : 0;
}

size_t VectorIndex::memory_bytes() const {
  const size_t n = ids_.size();
  if (hnsw_) {
    auto* h = static_cast<const faiss::IndexHNSWFlat*>(index_.get());
    return n * dim_ * 4 + h->hnsw.neighbors.size() * 4 + h->hnsw.offsets.size() * 8 +
           h->hnsw.levels.size() * 4;
  }
  if (ivf_) {
    auto* ivf = static_cast<const faiss::IndexIVF*>(index_.get());
    return n * (ivf->code_size + 8) + ivf->nlist * dim_ * 4;
  }
  if (off_) return n * 4;
  return n * dim_ * 4;
}

std::vector<float> VectorIndex::LiveVectors(std::vector<uint32_t>* ids) const {
  std::vector<float> out;
  out.reserve(size() * dim_);
  std::vector<float> v(dim_);
  for (size_t p = 0; p < ids_.size(); ++p) {
    if (dead_.count(static_cast<uint32_t>(p))) continue;
    index_->reconstruct(static_cast<idx_t>(p), v.data());
    out.insert(out.end(), v.begin(), v.end());
    ids->push_back(ids_[p]);
  }
  return out;
}

VectorIndex::Assignment VectorIndex::Assign(const std::vector<float>& vectors) const {
  Assignment a;
  if (!ivf_ || vectors.empty()) return a;
  auto* ivf = static_cast<const faiss::IndexIVF*>(index_.get());
  const idx_t n = static_cast<idx_t>(vectors.size() / dim_);
  a.epoch = epoch_;
  a.lists.resize(static_cast<size_t>(n));
  ivf->quantizer->assign(n, vectors.data(), a.lists.data());
  return a;
}

void VectorIndex::Add(const std::vector<uint32_t>& ids, const std::vector<float>& vectors) {
  Add(ids, vectors, Assignment{});
}

void VectorIndex::Add(const std::vector<uint32_t>& ids, const std::vector<float>& vectors,
                      const Assignment& assignment) {
  if (ids.empty()) return;
  for (uint32_t id : ids) Remove(id);  // replacing a chunk's vector
  if (options_.build_on_add && !hnsw_ && !ivf_ && !off_ &&
      size() + ids.size() >= options_.exact_below) {
    std::vector<uint32_t> all;
    std::vector<float> vecs = LiveVectors(&all);
    all.insert(all.end(), ids.begin(), ids.end());
    vecs.insert(vecs.end(), vectors.begin(), vectors.end());
    BuildInternal(all, vecs);
    return;
  }
  for (uint32_t id : ids) {
    pos_[id] = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
  }
  if (off_) return;  // only the ids: the measure of growth and the next build
  auto* ivf = ivf_ ? dynamic_cast<faiss::IndexIVFScalarQuantizer*>(index_.get()) : nullptr;
  if (ivf != nullptr) {
    if (!tier_) {
      auto t = std::make_unique<faiss::IndexIVFScalarQuantizer>(
          ivf->quantizer, dim_, ivf->nlist, ivf->sq.qtype, faiss::METRIC_INNER_PRODUCT,
          ivf->by_residual);
      t->sq = ivf->sq;  // the trained ranges
      t->is_trained = true;
      t->own_fields = false;  // the quantizer is index_'s
      t->nprobe = ivf->nprobe;
      tier_ = std::move(t);
    }
    auto* tier = static_cast<faiss::IndexIVF*>(tier_.get());
    std::vector<idx_t> labels(ids.size());
    for (size_t i = 0; i < ids.size(); ++i)
      labels[i] = static_cast<idx_t>(ids_.size() - ids.size() + i);
    std::vector<int64_t> lists = assignment.lists;
    if (assignment.epoch != epoch_ || epoch_ == 0 || lists.size() != ids.size()) {
      lists = Assign(vectors).lists;
    }
    tier->add_core(static_cast<idx_t>(ids.size()), vectors.data(), labels.data(), lists.data());
    return;
  }
  index_->add(static_cast<idx_t>(ids.size()), vectors.data());
}

void VectorIndex::Remove(uint32_t id) {
  auto it = pos_.find(id);
  if (it == pos_.end()) return;
  dead_.insert(it->second);
  pos_.erase(it);
}

bool VectorIndex::NeedsRebuild() const {
  if (!options_.build_on_add && !hnsw_ && !ivf_ && !off_ && size() >= options_.exact_below)
    return true;
  if ((ivf_ || off_) && trained_on_ > 0 && size() >= options_.ivf_retrain_growth * trained_on_)
    return true;
  return !ids_.empty() && dead_.size() > options_.rebuild_tombstone_ratio * ids_.size();
}

void VectorIndex::Build(const std::vector<uint32_t>& ids, const std::vector<float>& vectors) {
  BuildInternal(ids, vectors);
}

void VectorIndex::BuildInternal(const std::vector<uint32_t>& ids,
                                const std::vector<float>& vectors) {
  tier_.reset();
  ids_.clear();
  dead_.clear();
  pos_.clear();
  off_ = false;
  off_reason_.clear();
  tuned_recall_ = -1;
  const bool approximate = ids.size() >= options_.exact_below;
  hnsw_ = approximate && options_.approximate != "ivf";
  ivf_ = approximate && options_.approximate == "ivf";
  trained_on_ = 0;
  if (hnsw_) {
    auto h =
        std::make_unique<faiss::IndexHNSWFlat>(dim_, options_.hnsw_m, faiss::METRIC_INNER_PRODUCT);
    h->hnsw.efConstruction = options_.ef_construction;
    index_ = std::move(h);
  } else if (ivf_) {
    // About 4 * sqrt(n) lists (a power of two), at least 64 vectors a list.
    size_t lists = options_.ivf_lists > 0 ? static_cast<size_t>(options_.ivf_lists) : 16;
    if (options_.ivf_lists <= 0) {
      const double n = static_cast<double>(ids.size());
      while (lists * 2 <= std::min(4 * std::sqrt(n), n / 64) && lists < 65536) lists *= 2;
    }
    // k-means needs a vector per list at least (a configured count may be more).
    lists = std::max<size_t>(1, std::min(lists, ids.size()));
    auto quantizer = new faiss::IndexFlatIP(dim_);
    auto ivf = std::make_unique<faiss::IndexIVFScalarQuantizer>(
        quantizer, dim_, lists, faiss::ScalarQuantizer::QT_8bit, faiss::METRIC_INNER_PRODUCT,
        /*encode_residual=*/false);
    ivf->own_fields = true;
    // Trained on a seeded sample: about 64 vectors a list.
    const size_t n = ids.size(), want = std::min(n, lists * 64);
    std::vector<float> sample;
    if (want == n) {
      sample = vectors;
    } else {
      std::mt19937 rng(7);
      std::vector<size_t> pick(n);
      for (size_t i = 0; i < n; ++i) pick[i] = i;
      for (size_t i = 0; i < want; ++i) std::swap(pick[i], pick[i + rng() % (n - i)]);
      sample.resize(want * dim_);
      for (size_t i = 0; i < want; ++i) {
        std::memcpy(&sample[i * dim_], &vectors[pick[i] * dim_], sizeof(float) * dim_);
      }
    }
    ivf->cp.seed = 7;
    ivf->train(static_cast<idx_t>(want), sample.data());
    trained_on_ = n;
    epoch_ = next_epoch++;
    index_ = std::move(ivf);
  } else {
    index_ = std::make_unique<faiss::IndexFlatIP>(dim_);
  }
  for (uint32_t id : ids) {
    pos_[id] = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
  }
  if (!ids.empty()) {
    const int threads = omp_get_max_threads();
    if (options_.build_threads > 0) omp_set_num_threads(options_.build_threads);
    index_->add(static_cast<idx_t>(ids.size()), vectors.data());
    omp_set_num_threads(threads);
  }
  if (hnsw_) TuneEfSearch(vectors);
  if (ivf_) {
    auto* ivf = static_cast<faiss::IndexIVF*>(index_.get());
    if (options_.ivf_nprobe > 0) {
      ef_search_ = static_cast<int>(ivf->nprobe = static_cast<size_t>(options_.ivf_nprobe));
    } else {
      std::vector<int> candidates;
      const int most = MaxProbes(ivf->nlist, options_);
      for (int p = 1; p < most; p *= 2) candidates.push_back(p);
      candidates.push_back(most);
      tuned_recall_ =
          TuneBreadth(vectors, candidates, [ivf](int p) { ivf->nprobe = static_cast<size_t>(p); });
    }
  }
  DropIfBelowRecall();
}

void VectorIndex::DropIfBelowRecall() {
  if (!(hnsw_ || ivf_) || options_.min_recall <= 0 || tuned_recall_ < 0 ||
      tuned_recall_ >= options_.min_recall) {
    return;
  }
  off_reason_ = absl::StrFormat("%s reached recall@10 %.2f < %.2f on its sample", describe(),
                                tuned_recall_, options_.min_recall);
  trained_on_ = ids_.size();
  hnsw_ = ivf_ = false;
  off_ = true;
  index_ = std::make_unique<faiss::IndexFlatIP>(dim_);  // empty: the vectors are not kept
}

int VectorIndex::MaxProbes(size_t lists, const VectorIndexOptions& o) {
  const double share = std::clamp(o.ivf_max_probe_share, 0.0, 1.0);
  const size_t most = std::max<size_t>(16, static_cast<size_t>(std::ceil(share * lists)));
  return static_cast<int>(std::min(lists, most));
}

double VectorIndex::TuneBreadth(const std::vector<float>& vectors,
                                const std::vector<int>& candidates,
                                const std::function<void(int)>& set) {
  const size_t n = ids_.size();
  const size_t nq = std::min<size_t>(400, n);
  double reached = 0;
  const idx_t k = 10;
  std::mt19937 rng(42);
  std::vector<float> queries(nq * dim_);
  std::normal_distribution<float> gauss;
  for (size_t i = 0; i < nq; ++i) {
    float* q = &queries[i * dim_];
    const size_t a = rng() % n, b = rng() % n;
    for (int d = 0; d < dim_; ++d) {
      q[d] = (i % 2 == 0) ? vectors[a * dim_ + d] + 0.05f * gauss(rng)
                          : vectors[a * dim_ + d] + vectors[b * dim_ + d];
    }
    double norm = 0;
    for (int d = 0; d < dim_; ++d) norm += double(q[d]) * q[d];
    for (int d = 0; d < dim_; ++d) q[d] = static_cast<float>(q[d] / std::sqrt(norm));
  }
  // Exact answers by brute force over the same vectors (no copy of them).
  std::vector<float> dist(nq * k);
  std::vector<idx_t> truth(nq * k), got(nq * k);
  faiss::knn_inner_product(queries.data(), vectors.data(), static_cast<size_t>(dim_), nq, n,
                           static_cast<size_t>(k), dist.data(), truth.data());
  for (int c : candidates) {
    set(c);
    index_->search(static_cast<idx_t>(nq), queries.data(), k, dist.data(), got.data());
    // Each kind of query (noisy copies, mixtures) must reach the bar on its own.
    size_t hits[2] = {0, 0}, asked[2] = {0, 0};
    for (size_t q = 0; q < nq; ++q) {
      asked[q % 2] += k;
      for (idx_t a = 0; a < k; ++a) {
        for (idx_t b = 0; b < k; ++b) {
          if (got[q * k + a] == truth[q * k + b] && truth[q * k + b] >= 0) {
            ++hits[q % 2];
            break;
          }
        }
      }
    }
    ef_search_ = c;
    reached = std::min(static_cast<double>(hits[0]) / std::max<size_t>(1, asked[0]),
                       static_cast<double>(hits[1]) / std::max<size_t>(1, asked[1]));
    // A margin over the 0.95 promise: the sample is not the queries to come.
    if (hits[0] >= 0.98 * asked[0] && hits[1] >= 0.98 * asked[1]) break;
  }
  return reached;
}

void VectorIndex::TuneEfSearch(const std::vector<float>& vectors) {
  auto* h = static_cast<faiss::IndexHNSWFlat*>(index_.get());
  if (options_.ef_search > 0) {
    ef_search_ = h->hnsw.efSearch = options_.ef_search;
    return;
  }
  tuned_recall_ = TuneBreadth(vectors, {16, 32, 64, 128, 256, 512, 1024},
                              [h](int ef) { h->hnsw.efSearch = ef; });
}

void VectorIndex::SearchBoth(const float* query, size_t k, float* dist, int64_t* labels) const {
  index_->search(1, query, static_cast<idx_t>(k), dist, labels);
  if (!tier_ || tier_->ntotal == 0) return;
  std::vector<float> tier_dist(k);
  std::vector<idx_t> tier_labels(k);
  tier_->search(1, query, static_cast<idx_t>(k), tier_dist.data(), tier_labels.data());
  // Inner product: the larger first; -1 labels (fewer than k found) last.
  std::vector<std::pair<float, idx_t>> all;
  all.reserve(2 * k);
  for (size_t i = 0; i < k; ++i) {
    if (labels[i] >= 0) all.emplace_back(dist[i], labels[i]);
    if (tier_labels[i] >= 0) all.emplace_back(tier_dist[i], tier_labels[i]);
  }
  const size_t n = std::min(k, all.size());
  std::partial_sort(all.begin(), all.begin() + n, all.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  for (size_t i = 0; i < k; ++i) {
    dist[i] = i < n ? all[i].first : 0;
    labels[i] = i < n ? all[i].second : -1;
  }
}

std::vector<std::pair<uint32_t, float>> VectorIndex::Search(
    const float* query, size_t k, const std::function<bool(uint32_t)>& accept) const {
  std::vector<std::pair<uint32_t, float>> out;
  const size_t total = ids_.size();
  if (total == 0 || k == 0 || off_) return out;
  size_t want = std::min(total, k + dead_.size() + (accept ? 3 * k : 0));
  while (true) {
    std::vector<float> dist(want);
    std::vector<idx_t> labels(want);
    SearchBoth(query, want, dist.data(), labels.data());
    out.clear();
    for (size_t i = 0; i < want && out.size() < k; ++i) {
      if (labels[i] < 0) break;
      uint32_t p = static_cast<uint32_t>(labels[i]);
      if (dead_.count(p)) continue;
      uint32_t id = ids_[p];
      if (accept && !accept(id)) continue;
      out.emplace_back(id, dist[i]);
    }
    if (out.size() >= k || want >= total) break;
    want = std::min(total, want * 4);
  }
  return out;
}

namespace {
constexpr char kMetaMagic[8] = {'F', 'W', 'V', 'E', 'C', 'v', '1', '\0'};

absl::Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  FILE* fp = std::fopen(tmp.c_str(), "rb");
  if (fp) {
    fsync(fileno(fp));
    std::fclose(fp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}
}  // namespace

absl::Status VectorIndex::Save(const std::string& path, uint64_t generation) const {
  auto image = Capture(generation);
  if (!image.ok()) return image.status();
  return WriteImage(*image, path);
}

absl::StatusOr<VectorIndex::Image> VectorIndex::Capture(uint64_t generation) const {
  Image image;
  try {
    faiss::VectorIOWriter w;
    w.data.reserve(memory_bytes() + (1 << 20));
    faiss::write_index(index_.get(), &w);
    image.faiss = std::move(w.data);
    if (tier_ && tier_->ntotal > 0) {
      faiss::VectorIOWriter t;
      faiss::write_index(tier_.get(), &t);
      image.tier = std::move(t.data);
    }
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot serialize the vector index: ", e.what()));
  }
  std::string& meta = image.meta;
  meta.assign(kMetaMagic, sizeof(kMetaMagic));
  auto put = [&meta](const void* p, size_t n) { meta.append(static_cast<const char*>(p), n); };
  put(&generation, 8);
  int32_t dim = dim_, hnsw = hnsw_ ? 1 : ivf_ ? 2 : off_ ? 3 : 0, ef = ef_search_;
  put(&dim, 4);
  put(&hnsw, 4);
  put(&ef, 4);
  uint64_t n = ids_.size(), nd = dead_.size();
  put(&n, 8);
  put(ids_.data(), n * 4);
  put(&nd, 8);
  for (uint32_t d : dead_) put(&d, 4);
  image.trained_on = trained_on_;
  image.off_reason = off_reason_;
  return image;
}

absl::Status VectorIndex::WriteImage(const Image& image, const std::string& path) {
  const std::string tmp = path + ".faiss.tmp";
  if (!image.tier.empty()) {
    // One index: the added part's entries (labelled by position) merged into the rest.
    try {
      faiss::VectorIOReader r, t;
      r.data = image.faiss;
      t.data = image.tier;
      std::unique_ptr<faiss::Index> merged(faiss::read_index(&r));
      std::unique_ptr<faiss::Index> tier(faiss::read_index(&t));
      merged->merge_from(*tier, 0);
      faiss::write_index(merged.get(), tmp.c_str());
    } catch (const std::exception& e) {
      std::remove(tmp.c_str());
      return absl::InternalError(absl::StrCat("cannot write vector index ", tmp, ": ", e.what()));
    }
  } else {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (f == nullptr) {
      return absl::InternalError(
          absl::StrCat("cannot write vector index ", tmp, ": ", std::strerror(errno)));
    }
    bool ok = std::fwrite(image.faiss.data(), 1, image.faiss.size(), f) == image.faiss.size();
    ok = std::fclose(f) == 0 && ok;
    if (!ok) {
      std::remove(tmp.c_str());
      return absl::InternalError(
          absl::StrCat("cannot write vector index ", tmp, ": ", std::strerror(errno)));
    }
  }
  std::error_code ec;
  const uint64_t faiss_size = std::filesystem::file_size(tmp, ec);
  if (ec)
    return absl::InternalError(absl::StrCat("cannot write vector index ", tmp, ": ", ec.message()));
  std::filesystem::rename(tmp, path + ".faiss", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename vector index: ", ec.message()));
  std::string meta = image.meta;
  meta.append(reinterpret_cast<const char*>(&faiss_size), 8);
  meta.append(reinterpret_cast<const char*>(&image.trained_on), 8);
  const uint32_t reason_size = static_cast<uint32_t>(image.off_reason.size());
  meta.append(reinterpret_cast<const char*>(&reason_size), 4);
  meta.append(image.off_reason);
  return WriteFileAtomically(path + ".meta", meta);
}

absl::StatusOr<std::unique_ptr<VectorIndex>> VectorIndex::Load(const std::string& path,
                                                               uint64_t generation, int dimension,
                                                               VectorIndexOptions options) {
  std::ifstream f(path + ".meta", std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat(path, ".meta: no saved vector index"));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string meta = ss.str();
  size_t off = 0;
  auto get = [&](void* p, size_t n) {
    if (meta.size() - off < n) return false;
    std::memcpy(p, meta.data() + off, n);
    off += n;
    return true;
  };
  char magic[8];
  uint64_t gen = 0, n = 0, nd = 0, faiss_size = 0;
  int32_t dim = 0, hnsw = 0, ef = 0;
  if (!get(magic, 8) || std::memcmp(magic, kMetaMagic, 8) != 0 || !get(&gen, 8) || !get(&dim, 4) ||
      !get(&hnsw, 4) || !get(&ef, 4) || !get(&n, 8)) {
    return absl::DataLossError(absl::StrCat(path, ".meta: damaged"));
  }
  if (gen != generation) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": generation ", gen, " but the store is at ", generation));
  }
  if (dim != dimension)
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": dimension ", dim, " != ", dimension));
  auto idx = std::make_unique<VectorIndex>(dimension, options);
  idx->ids_.resize(n);
  if (!get(idx->ids_.data(), n * 4) || !get(&nd, 8))
    return absl::DataLossError(absl::StrCat(path, ".meta: truncated"));
  for (uint64_t i = 0; i < nd; ++i) {
    uint32_t d;
    if (!get(&d, 4)) return absl::DataLossError(absl::StrCat(path, ".meta: truncated"));
    idx->dead_.insert(d);
  }
  if (!get(&faiss_size, 8)) return absl::DataLossError(absl::StrCat(path, ".meta: truncated"));
  std::error_code ec;
  if (std::filesystem::file_size(path + ".faiss", ec) != faiss_size || ec) {
    return absl::DataLossError(absl::StrCat(path, ".faiss: missing or not the size recorded"));
  }
  try {
    idx->index_.reset(faiss::read_index((path + ".faiss").c_str()));
  } catch (const std::exception& e) {
    return absl::DataLossError(absl::StrCat(path, ".faiss: ", e.what()));
  }
  const idx_t held = hnsw == 3 ? 0 : static_cast<idx_t>(n);  // off: ids without vectors
  if (idx->index_->ntotal != held || idx->index_->d != dimension) {
    return absl::DataLossError(absl::StrCat(path, ".faiss: does not match its metadata"));
  }
  idx->hnsw_ = hnsw == 1;
  idx->ivf_ = hnsw == 2;
  idx->off_ = hnsw == 3;
  idx->ef_search_ = ef;
  uint64_t trained = 0;
  if (get(&trained, 8)) idx->trained_on_ = trained;  // absent in files from before IVF
  uint32_t reason_size = 0;
  if (get(&reason_size, 4)) {  // absent in files from before an index could be off
    if (meta.size() - off < reason_size)
      return absl::DataLossError(absl::StrCat(path, ".meta: truncated"));
    idx->off_reason_ = meta.substr(off, reason_size);
    off += reason_size;
  }
  if (idx->off_ && idx->off_reason_.empty())
    return absl::DataLossError(absl::StrCat(path, ".meta: an index that is off without a reason"));
  if (idx->hnsw_) {
    auto* h = dynamic_cast<faiss::IndexHNSWFlat*>(idx->index_.get());
    if (h == nullptr)
      return absl::DataLossError(
          absl::StrCat(path, ".faiss: not the HNSW index its metadata names"));
    h->hnsw.efSearch = ef;
  }
  if (idx->ivf_) {
    auto* ivf = dynamic_cast<faiss::IndexIVF*>(idx->index_.get());
    if (ivf == nullptr)
      return absl::DataLossError(
          absl::StrCat(path, ".faiss: not the IVF index its metadata names"));
    // An index saved with a wider breadth than the cap allows (tuned before
    // the cap, or under a larger one) searches within the cap; a breadth the
    // configuration names is used as it is.
    int probes = std::max(1, ef);
    if (options.ivf_nprobe > 0) {
      probes = options.ivf_nprobe;
    } else {
      probes = std::min(probes, MaxProbes(ivf->nlist, options));
    }
    idx->ef_search_ = probes;
    ivf->nprobe = static_cast<size_t>(probes);
    idx->epoch_ = next_epoch++;
  }
  for (uint32_t p = 0; p < n; ++p) {
    if (!idx->dead_.count(p)) idx->pos_[idx->ids_[p]] = p;
  }
  return idx;
}

}  // namespace fwai
