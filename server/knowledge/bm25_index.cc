#include "server/knowledge/bm25_index.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace fwai {

// Image layout (little-endian), version 3:
//   "FWBM25v3" | u64 generation | f32 k1 | f32 b | u32 ndocs | u32 doc_len[ndocs]
//   | u32 nterms | u32 flags (1: group postings) | u64 postings_size | u64 skips_size
//   | u64 groups_size | u64 entry_offset[nterms + 1] (relative to the entries)
//   | entries: (u32 df, u64 postings_offset, u32 postings_bytes, u32 nblocks,
//     u64 skips_offset, u32 groups_df, u64 groups_offset, u32 groups_bytes, u16 term_len,
//     term) sorted by term
//   | postings: per term, (varint doc delta, varint tf) pairs by ascending doc
//   | skips: per term, per block of kBlock postings (u32 last doc, u32 end offset in the
//     term's postings, u32 largest tf, u32 shortest doc length)
//   | groups: per term, (varint group key delta, varint summed tf) by ascending key
//   | u64 checksum of everything before it
// Version 2 (read, never written) has 18-byte entries (df, offset, bytes, term_len,
// term), no flags, sizes, skips or groups: it is searched exhaustively.
namespace {

constexpr char kMagicV2[8] = {'F', 'W', 'B', 'M', '2', '5', 'v', '2'};
constexpr char kMagic[8] = {'F', 'W', 'B', 'M', '2', '5', 'v', '3'};
constexpr uint32_t kBlock = 128;
constexpr size_t kEntryV2 = 18, kEntryV3 = 46;
constexpr uint32_t kEnd = 0xffffffffu;
// Upper bounds are widened by this share so float rounding never prunes a
// doc whose exact score reaches the k-th.
constexpr double kSlack = 1e-4;

// One term's BM25 contribution to a doc; every path computes it with this.
inline float TermScore(float weight, float idf, uint32_t tf_count, uint32_t len_terms, float k1,
                       float b, float avg_len) {
  const float len = static_cast<float>(len_terms);
  const float tf = static_cast<float>(tf_count);
  return weight * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len));
}

inline float Idf(size_t num_docs, size_t df_count) {
  const float df = static_cast<float>(df_count);
  return std::log(1.0f + (num_docs - df + 0.5f) / (df + 0.5f));
}

// A 64-bit hash of 8-byte words (the tail zero-padded), fast enough to check
// a mapped image of hundreds of megabytes when it is opened.
class Hasher {
 public:
  void Update(const char* p, size_t n) {
    while (n > 0) {
      const size_t take = std::min(n, 8 - fill_);
      std::memcpy(buf_ + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 8) Mix();
    }
  }
  uint64_t Final() {
    if (fill_ > 0) {
      std::memset(buf_ + fill_, 0, 8 - fill_);
      Mix();
    }
    uint64_t h = h_ ^ (h_ >> 31);
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29) ^ count_;
  }

 private:
  void Mix() {
    uint64_t w;
    std::memcpy(&w, buf_, 8);
    h_ = (h_ ^ w) * 0x100000001b3ull;
    h_ ^= h_ >> 27;
    count_ += 8;
    fill_ = 0;
  }
  uint64_t h_ = 0xcbf29ce484222325ull, count_ = 0;
  char buf_[8];
  size_t fill_ = 0;
};

void PutVarint(std::string* s, uint32_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

inline const uint8_t* GetVarint(const uint8_t* p, const uint8_t* end, uint32_t* v) {
  uint32_t r = 0;
  for (int shift = 0; p < end && shift <= 28; shift += 7) {
    const uint8_t b = *p++;
    r |= static_cast<uint32_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *v = r;
      return p;
    }
  }
  return nullptr;
}

// Calls f(id, tf) for each (delta-coded id, tf) pair of a saved postings run
// whose id is still live; a malformed run ends the walk.
template <typename F>
void ForEachLivePosting(const char* data, uint32_t bytes, const std::vector<bool>& live, F&& f) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(data);
  const uint8_t* end = p + bytes;
  uint32_t id = 0;
  while (p != nullptr && p < end) {
    uint32_t delta = 0, tf = 0;
    p = GetVarint(p, end, &delta);
    if (p == nullptr) break;
    p = GetVarint(p, end, &tf);
    if (p == nullptr) break;
    id += delta;
    if (id < live.size() && live[id]) f(id, tf);
  }
}

template <typename T>
T Read(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Adds one query term's group-level BM25 to the groups it touched (`gseen`,
// summed tf in `gtf`, cleared here).
void ScoreGroups(float weight, float k1, const Bm25Index::Groups& groups,
                 const std::vector<uint32_t>& gseen, std::vector<uint32_t>& gtf,
                 std::vector<float>& gscore, std::vector<uint32_t>& gtouched) {
  if (gseen.empty()) return;
  const float gdf = static_cast<float>(gseen.size());
  const float n = static_cast<float>(groups.present);
  const float gidf = std::log(1.0f + std::max(0.0f, n - gdf + 0.5f) / (gdf + 0.5f));
  const float gb = groups.b;
  for (uint32_t g : gseen) {
    const float t = static_cast<float>(gtf[g]);
    const float glen = static_cast<float>((*groups.group_len)[g]);
    if (gscore[g] == 0.0f) gtouched.push_back(g);
    gscore[g] += weight * gidf * t * (k1 + 1) / (t + k1 * (1 - gb + gb * glen / groups.avg_len));
    gtf[g] = 0;
  }
}

}  // namespace

// A saved image: bytes owned (a string) or mapped (a file).
struct Bm25Index::Image {
  std::string owned;
  const char* data = nullptr;
  size_t size = 0;
  void* map = nullptr;
  uint64_t generation = 0;
  Bm25Params params;
  int version = 3;
  bool has_groups = false;
  uint32_t ndocs = 0, nterms = 0;
  const char* doc_len = nullptr;
  const char* offsets = nullptr;
  const char* entries = nullptr;
  const char* postings = nullptr;
  const char* skips = nullptr;
  const char* groups = nullptr;
  size_t postings_size = 0, skips_size = 0, groups_size = 0;

  ~Image() {
    if (map != nullptr) munmap(map, size);
  }
  struct Entry {
    uint32_t df = 0;
    uint64_t off = 0;
    uint32_t bytes = 0;
    uint32_t nblocks = 0;
    uint64_t skip_off = 0;
    uint32_t gdf = 0;
    uint64_t goff = 0;
    uint32_t gbytes = 0;
    std::string_view term;
  };
  size_t entry_size() const { return version == 2 ? kEntryV2 : kEntryV3; }
  Entry EntryAt(uint32_t i) const {
    const char* e = entries + Read<uint64_t>(offsets + 8 * size_t{i});
    Entry x;
    x.df = Read<uint32_t>(e);
    x.off = Read<uint64_t>(e + 4);
    x.bytes = Read<uint32_t>(e + 12);
    if (version == 2) {
      x.term = std::string_view(e + 18, Read<uint16_t>(e + 16));
      return x;
    }
    x.nblocks = Read<uint32_t>(e + 16);
    x.skip_off = Read<uint64_t>(e + 20);
    x.gdf = Read<uint32_t>(e + 28);
    x.goff = Read<uint64_t>(e + 32);
    x.gbytes = Read<uint32_t>(e + 40);
    x.term = std::string_view(e + 46, Read<uint16_t>(e + 44));
    return x;
  }
  // Binary search over the sorted entries.
  bool Find(std::string_view term, Entry* out) const {
    uint32_t lo = 0, hi = nterms;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      Entry e = EntryAt(mid);
      const int c = e.term.compare(term);
      if (c == 0) {
        *out = e;
        return true;
      }
      if (c < 0) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return false;
  }
  // Parses and checks the layout; DATA_LOSS names what is wrong.
  absl::Status Parse() {
    auto damaged = [](const std::string& what) {
      return absl::DataLossError(absl::StrCat("lexical index image is damaged: ", what));
    };
    if (size < sizeof(kMagic) + 8 + 8) return damaged("bad header");
    if (std::memcmp(data, kMagic, sizeof(kMagic)) == 0) {
      version = 3;
    } else if (std::memcmp(data, kMagicV2, sizeof(kMagicV2)) == 0) {
      version = 2;
    } else {
      return damaged("bad header");
    }
    Hasher h;
    h.Update(data, size - 8);
    if (h.Final() != Read<uint64_t>(data + size - 8)) return damaged("checksum mismatch");
    const char* p = data + sizeof(kMagic);
    const char* end = data + size - 8;
    if (end - p < 20) return damaged("truncated");
    generation = Read<uint64_t>(p);
    params.k1 = Read<float>(p + 8);
    params.b = Read<float>(p + 12);
    ndocs = Read<uint32_t>(p + 16);
    p += 20;
    if (static_cast<size_t>(end - p) < size_t{ndocs} * 4 + 4)
      return damaged("truncated doc lengths");
    doc_len = p;
    p += size_t{ndocs} * 4;
    nterms = Read<uint32_t>(p);
    p += 4;
    uint64_t sizes[3] = {0, 0, 0};
    if (version == 3) {
      if (end - p < 28) return damaged("truncated sizes");
      has_groups = (Read<uint32_t>(p) & 1u) != 0;
      for (int i = 0; i < 3; ++i) sizes[i] = Read<uint64_t>(p + 4 + 8 * i);
      p += 28;
    }
    if (static_cast<size_t>(end - p) < (size_t{nterms} + 1) * 8)
      return damaged("truncated term offsets");
    offsets = p;
    p += (size_t{nterms} + 1) * 8;
    entries = p;
    const uint64_t entries_size = Read<uint64_t>(offsets + 8 * size_t{nterms});
    if (static_cast<uint64_t>(end - p) < entries_size) return damaged("truncated terms");
    postings = p + entries_size;
    const uint64_t rest = static_cast<uint64_t>(end - postings);
    if (version == 2) {
      postings_size = static_cast<size_t>(rest);
    } else {
      if (sizes[0] > rest || sizes[1] > rest - sizes[0] || sizes[2] != rest - sizes[0] - sizes[1])
        return damaged("bad section sizes");
      postings_size = sizes[0];
      skips_size = sizes[1];
      groups_size = sizes[2];
      skips = postings + postings_size;
      groups = skips + skips_size;
    }
    const size_t fixed = entry_size();
    for (uint32_t i = 0; i < nterms; ++i) {
      const uint64_t a = Read<uint64_t>(offsets + 8 * size_t{i}),
                     b = Read<uint64_t>(offsets + 8 * (size_t{i} + 1));
      if (a > b || b > entries_size || b - a < fixed) return damaged("bad term offsets");
      Entry e = EntryAt(i);
      if (fixed + e.term.size() > b - a || e.off + e.bytes > postings_size)
        return damaged("bad term entry");
      if (version == 3 &&
          (e.nblocks != (e.df + kBlock - 1) / kBlock ||
           e.skip_off + uint64_t{e.nblocks} * 16 > skips_size || e.goff + e.gbytes > groups_size))
        return damaged("bad term entry");
    }
    return absl::OkStatus();
  }
};

// One query term's postings in doc order: the base image's (by skip
// blocks, hidden docs left out) merged with the mutable tier's.
struct Bm25Index::Cursor {
  const std::vector<bool>* live = nullptr;
  const uint8_t* post = nullptr;
  const char* skips = nullptr;
  uint32_t nblocks = 0, block = 0;
  uint32_t bdoc[kBlock], btf[kBlock];
  uint32_t bn = 0, bi = 0;
  const std::vector<Posting>* list = nullptr;
  size_t mi = 0;
  uint32_t doc = kEnd, tf = 0;
  bool from_base = false;

  uint32_t SkipAt(uint32_t blk, int field) const {
    return Read<uint32_t>(skips + 16 * size_t{blk} + 4 * field);
  }
  void Open() {
    LoadBlock(0);
    if (list) mi = 0;
    Settle();
  }
  void LoadBlock(uint32_t blk) {
    block = blk;
    bn = bi = 0;
    if (blk >= nblocks) {
      block = nblocks;
      return;
    }
    const uint32_t start = blk == 0 ? 0 : SkipAt(blk - 1, 1);
    uint32_t d = blk == 0 ? 0 : SkipAt(blk - 1, 0);
    const uint8_t* p = post + start;
    const uint8_t* end = post + SkipAt(blk, 1);
    while (p != nullptr && p < end && bn < kBlock) {
      uint32_t delta = 0, t = 0;
      p = GetVarint(p, end, &delta);
      if (p == nullptr) break;
      p = GetVarint(p, end, &t);
      if (p == nullptr) break;
      d += delta;
      bdoc[bn] = d;
      btf[bn] = t;
      ++bn;
    }
  }
  void Settle() {
    uint32_t bd = kEnd, bt = 0;
    while (block < nblocks) {
      if (bi < bn) {
        const uint32_t x = bdoc[bi];
        if (x < live->size() && (*live)[x]) {
          bd = x;
          bt = btf[bi];
          break;
        }
        ++bi;
        continue;
      }
      LoadBlock(block + 1);
    }
    const uint32_t md = list && mi < list->size() ? (*list)[mi].doc : kEnd;
    if (md < bd) {
      doc = md;
      tf = (*list)[mi].tf;
      from_base = false;
    } else {
      doc = bd;
      tf = bt;
      from_base = true;
    }
  }
  void Next() {
    if (doc == kEnd) return;
    if (from_base) {
      ++bi;
    } else {
      ++mi;
    }
    Settle();
  }
  void SkipTo(uint32_t target) {
    if (doc >= target) return;
    if (block < nblocks) {
      if (SkipAt(block, 0) < target) {
        uint32_t lo = block + 1, hi = nblocks;
        while (lo < hi) {
          const uint32_t mid = lo + (hi - lo) / 2;
          if (SkipAt(mid, 0) < target) {
            lo = mid + 1;
          } else {
            hi = mid;
          }
        }
        LoadBlock(lo);
      }
      while (bi < bn && bdoc[bi] < target) ++bi;
    }
    if (list && mi < list->size() && (*list)[mi].doc < target) {
      mi = static_cast<size_t>(
          std::lower_bound(list->begin() + static_cast<std::ptrdiff_t>(mi), list->end(), target,
                           [](const Posting& a, uint32_t d) { return a.doc < d; }) -
          list->begin());
    }
    Settle();
  }
};

uint32_t Bm25Index::TermId(const std::string& term) {
  auto [it, inserted] = terms_.try_emplace(term, static_cast<uint32_t>(postings_.size()));
  if (inserted) postings_.emplace_back();
  return it->second;
}

size_t Bm25Index::num_terms() const {
  size_t n = base_ ? base_->nterms : 0;
  for (const auto& [term, id] : terms_) {
    Image::Entry e;
    if (!postings_[id].empty() && !(base_ && base_->Find(term, &e))) ++n;
  }
  return n;
}

size_t Bm25Index::DocFreq(const std::string& term) const {
  size_t df = 0;
  Image::Entry e;
  if (base_ && base_->Find(term, &e)) df += e.df;
  auto it = terms_.find(term);
  if (it != terms_.end()) df += postings_[it->second].size();
  return df;
}

void Bm25Index::Add(uint32_t doc, const std::vector<std::string>& terms) {
  if (Contains(doc)) Remove(doc);
  // Term frequencies by sorting the doc's term ids: no allocation per
  // distinct term (a hash map's nodes were most of an add's time).
  std::vector<uint32_t> ids;
  ids.reserve(terms.size());
  for (const auto& t : terms) ids.push_back(TermId(t));
  std::sort(ids.begin(), ids.end());
  if (doc >= doc_len_.size()) doc_len_.resize(doc + 1, 0);
  doc_len_[doc] = static_cast<uint32_t>(terms.size()) + 1;
  size_t distinct = 0;
  for (size_t i = 0; i < ids.size();) {
    const uint32_t term = ids[i];
    size_t j = i + 1;
    while (j < ids.size() && ids[j] == term) ++j;
    auto& list = postings_[term];
    Posting p{doc, static_cast<uint32_t>(j - i)};
    if (list.empty() || list.back().doc < doc) {
      list.push_back(p);
    } else {
      auto pos = std::lower_bound(list.begin(), list.end(), doc,
                                  [](const Posting& a, uint32_t d) { return a.doc < d; });
      list.insert(pos, p);
    }
    ids[distinct++] = term;
    i = j;
  }
  ids.resize(distinct);
  ids.shrink_to_fit();
  doc_terms_[doc] = std::move(ids);
  ++num_docs_;
  total_len_ += terms.size();
}

void Bm25Index::Remove(uint32_t doc) {
  if (!Contains(doc)) return;
  if (doc < base_live_.size() && base_live_[doc]) {
    base_live_[doc] = false;  // its postings stay in the image until the next save
  } else if (auto it = doc_terms_.find(doc); it != doc_terms_.end()) {
    for (uint32_t term : it->second) {
      auto& list = postings_[term];
      auto pos = std::lower_bound(list.begin(), list.end(), doc,
                                  [](const Posting& a, uint32_t d) { return a.doc < d; });
      if (pos != list.end() && pos->doc == doc) list.erase(pos);
    }
    doc_terms_.erase(it);
  }
  total_len_ -= doc_len_[doc] - 1;
  doc_len_[doc] = 0;
  --num_docs_;
}

bool Bm25Index::CatchUp(const Bm25Index& newer) {
  const uint32_t n = static_cast<uint32_t>(std::max(doc_len_.size(), newer.doc_len_.size()));
  std::vector<uint32_t> to_add;
  for (uint32_t d = 0; d < n; ++d) {
    const bool here = Contains(d), there = newer.Contains(d);
    if (here && !there) Remove(d);
    if (!here && there) {
      const auto it = newer.doc_terms_.find(d);
      const bool has_terms = it != newer.doc_terms_.end() && !it->second.empty();
      if (!has_terms && newer.Length(d) > 0)
        return false;  // in newer's base tier: not here to copy
      to_add.push_back(d);
    }
  }
  if (to_add.empty()) return true;
  std::unordered_map<uint32_t, const std::string*> names;  // newer's term id -> term
  for (uint32_t d : to_add) {
    if (auto it = newer.doc_terms_.find(d); it != newer.doc_terms_.end()) {
      for (uint32_t t : it->second) names.emplace(t, nullptr);
    }
  }
  for (const auto& [term, id] : newer.terms_) {
    if (auto it = names.find(id); it != names.end()) it->second = &term;
  }
  std::vector<std::string> terms;
  for (uint32_t d : to_add) {
    terms.clear();
    const auto it = newer.doc_terms_.find(d);
    if (it == newer.doc_terms_.end()) {
      Add(d, terms);
      continue;
    }
    for (uint32_t t : it->second) {
      const auto& list = newer.postings_[t];
      auto pos = std::lower_bound(list.begin(), list.end(), d,
                                  [](const Posting& a, uint32_t doc) { return a.doc < doc; });
      if (pos == list.end() || pos->doc != d || names[t] == nullptr) return false;
      terms.insert(terms.end(), pos->tf, *names[t]);
    }
    Add(d, terms);
  }
  return true;
}

std::vector<std::pair<uint32_t, float>> Bm25Index::Search(
    const std::vector<std::string>& query, size_t k,
    const std::function<bool(uint32_t)>& accept) const {
  std::vector<std::pair<std::string, float>> weighted;
  weighted.reserve(query.size());
  for (const auto& q : query) weighted.emplace_back(q, 1.0f);
  return Search(weighted, k, accept);
}

std::vector<std::pair<uint32_t, float>> Bm25Index::Search(
    const std::vector<std::pair<std::string, float>>& query, size_t k,
    const std::function<bool(uint32_t)>& accept, std::vector<std::pair<uint32_t, float>>* all,
    Groups* groups) const {
  std::vector<std::pair<uint32_t, float>> out;
  if (all == nullptr && groups == nullptr && pruning_) {
    auto pruned = SearchPruned(query, k, accept, nullptr);
    if (pruned) return *std::move(pruned);
  }
  if (groups) groups->scores.clear();
  if (num_docs_ == 0 || k == 0) return out;
  const float avg_len = static_cast<float>(total_len_) / num_docs_;
  const float k1 = params_.k1, b = params_.b;
  // Per-doc and per-group accumulators are kept per thread and cleared where
  // they were touched: at a million chunks a fresh 4 MB array per search cost
  // more in page faults than the scoring itself.
  struct Scratch {
    std::vector<float> score, gscore;
    std::vector<uint32_t> gtf, touched, gseen, gtouched;
  };
  thread_local Scratch scratch;
  std::vector<float>& score = scratch.score;
  std::vector<uint32_t>& touched = scratch.touched;
  if (score.size() < doc_len_.size()) score.resize(doc_len_.size(), 0.0f);
  touched.clear();
  // Group state: summed tf of the current term, groups it touched, totals.
  const bool grouped = groups && groups->group_of && groups->group_len && groups->present > 0;
  const size_t num_groups = grouped ? groups->group_len->size() : 0;
  std::vector<uint32_t>& gtf = scratch.gtf;
  std::vector<uint32_t>& gseen = scratch.gseen;
  std::vector<uint32_t>& gtouched = scratch.gtouched;
  std::vector<float>& gscore = scratch.gscore;
  if (gtf.size() < num_groups) gtf.resize(num_groups, 0);
  if (gscore.size() < num_groups) gscore.resize(num_groups, 0.0f);
  gseen.clear();
  gtouched.clear();
  for (const auto& [q, term_weight] : query) {
    const float weight = term_weight;  // (a lambda below uses it)
    Image::Entry entry{};
    const bool in_base = base_ && base_->Find(q, &entry);
    auto it = terms_.find(q);
    const std::vector<Posting>* list = it == terms_.end() ? nullptr : &postings_[it->second];
    const size_t df_count = (in_base ? entry.df : 0) + (list ? list->size() : 0);
    if (df_count == 0) continue;
    const float idf = Idf(num_docs_, df_count);
    gseen.clear();
    auto visit = [&](uint32_t doc, uint32_t tf_count) {
      const float s = TermScore(weight, idf, tf_count, doc_len_[doc] - 1, k1, b, avg_len);
      if (score[doc] == 0.0f) touched.push_back(doc);
      score[doc] += s;
      if (grouped && doc < groups->group_of->size()) {
        const uint32_t g = (*groups->group_of)[doc];
        if (g < num_groups) {
          if (gtf[g] == 0) gseen.push_back(g);
          gtf[g] += tf_count;
        }
      }
    };
    if (in_base) ForEachLivePosting(base_->postings + entry.off, entry.bytes, base_live_, visit);
    if (list) {
      for (const Posting& p : *list) visit(p.doc, p.tf);
    }
    if (grouped) ScoreGroups(weight, k1, *groups, gseen, gtf, gscore, gtouched);
  }
  if (grouped) {
    groups->scores.reserve(gtouched.size());
    for (uint32_t g : gtouched) {
      groups->scores.emplace_back(g, gscore[g]);
      gscore[g] = 0.0f;
    }
  }
  out.reserve(touched.size());
  for (uint32_t d : touched) {
    const float s = score[d];
    score[d] = 0.0f;
    if (accept && !accept(d)) continue;
    out.emplace_back(d, s);
  }
  if (all) *all = out;
  auto better = [](const auto& a, const auto& c) {
    return a.second > c.second || (a.second == c.second && a.first < c.first);
  };
  if (out.size() > k) {
    std::partial_sort(out.begin(), out.begin() + k, out.end(), better);
    out.resize(k);
  } else {
    std::sort(out.begin(), out.end(), better);
  }
  return out;
}

struct Bm25Index::PrunedTerm {
  float weight = 0, idf = 0;
  double ub = 0;
  Cursor cur;
};

// MaxScore: terms by ascending bound; once the k-th best score exceeds the
// bounds of the weakest terms together, a doc holding only those cannot
// enter, so only the others' postings are walked and the weak ones are
// probed (by skip blocks) for the docs found there.
std::vector<std::pair<uint32_t, float>> Bm25Index::MaxScoreTopK(
    std::vector<std::unique_ptr<PrunedTerm>>& terms, size_t k,
    const std::function<bool(uint32_t)>& accept, float avg_len) const {
  using Term = PrunedTerm;
  const float k1 = params_.k1, b = params_.b;
  const size_t nt = terms.size();
  std::vector<size_t> ord(nt);
  for (size_t i = 0; i < nt; ++i) ord[i] = i;
  std::stable_sort(ord.begin(), ord.end(),
                   [&](size_t a, size_t c) { return terms[a]->ub < terms[c]->ub; });
  std::vector<double> prefix(nt + 1, 0.0);  // prefix[i]: bound of ord[0..i-1]
  for (size_t i = 0; i < nt; ++i) prefix[i + 1] = prefix[i] + terms[ord[i]]->ub;
  auto better = [](const std::pair<uint32_t, float>& a, const std::pair<uint32_t, float>& c) {
    return a.second > c.second || (a.second == c.second && a.first < c.first);
  };
  std::vector<std::pair<uint32_t, float>> heap;  // the worst of the best k on top
  heap.reserve(k + 1);
  double theta = -1;  // the k-th best score once there are k
  size_t first_essential = 0;
  std::vector<uint32_t> tf_at(nt, 0);
  std::vector<size_t> at_doc;
  at_doc.reserve(nt);
  for (;;) {
    uint32_t d = kEnd;
    for (size_t i = first_essential; i < nt; ++i) d = std::min(d, terms[ord[i]]->cur.doc);
    if (d == kEnd) break;
    at_doc.clear();
    double est = 0;
    for (size_t i = first_essential; i < nt; ++i) {
      Term& t = *terms[ord[i]];
      if (t.cur.doc != d) continue;
      at_doc.push_back(ord[i]);
      tf_at[ord[i]] = t.cur.tf;
      est += TermScore(t.weight, t.idf, t.cur.tf, doc_len_[d] - 1, k1, b, avg_len);
    }
    const bool full = heap.size() >= k;
    bool pruned = full && (est + prefix[first_essential]) * (1 + kSlack) < theta;
    for (size_t j = first_essential; j-- > 0 && !pruned;) {
      Term& t = *terms[ord[j]];
      t.cur.SkipTo(d);
      if (t.cur.doc == d) {
        at_doc.push_back(ord[j]);
        tf_at[ord[j]] = t.cur.tf;
        est += TermScore(t.weight, t.idf, t.cur.tf, doc_len_[d] - 1, k1, b, avg_len);
      }
      pruned = full && (est + prefix[j]) * (1 + kSlack) < theta;
    }
    if (!pruned) {
      // The exact score, summed in query order as Search() sums it.
      float score = 0.0f;
      for (size_t i = 0; i < nt; ++i) {
        if (tf_at[i] == 0) continue;
        const Term& t = *terms[i];
        score += TermScore(t.weight, t.idf, tf_at[i], doc_len_[d] - 1, k1, b, avg_len);
      }
      const std::pair<uint32_t, float> cand{d, score};
      if ((!full || better(cand, heap.front())) && (!accept || accept(d))) {
        heap.push_back(cand);
        std::push_heap(heap.begin(), heap.end(), better);
        if (heap.size() > k) {
          std::pop_heap(heap.begin(), heap.end(), better);
          heap.pop_back();
        }
        if (heap.size() >= k) {
          theta = heap.front().second;
          while (first_essential < nt && prefix[first_essential + 1] * (1 + kSlack) < theta)
            ++first_essential;
        }
      }
    }
    for (size_t i : at_doc) tf_at[i] = 0;
    for (size_t i = first_essential; i < nt; ++i) {
      Term& t = *terms[ord[i]];
      if (t.cur.doc == d) t.cur.Next();
    }
  }
  std::sort(heap.begin(), heap.end(), better);
  return heap;
}

std::optional<std::vector<std::pair<uint32_t, float>>> Bm25Index::SearchPruned(
    const std::vector<std::pair<std::string, float>>& query, size_t k,
    const std::function<bool(uint32_t)>& accept, Groups* groups) const {
  if (!base_ || base_->version < 3) return std::nullopt;
  const bool grouped = groups && groups->group_of && groups->group_len && groups->present > 0;
  if (grouped && (!groups->by_member || !base_->has_groups)) return std::nullopt;
  for (const auto& [q, weight] : query) {
    if (!(weight > 0)) return std::nullopt;  // bounds assume positive contributions
  }
  std::vector<std::pair<uint32_t, float>> out;
  if (groups) groups->scores.clear();
  if (num_docs_ == 0 || k == 0) return out;
  const float avg_len = static_cast<float>(total_len_) / num_docs_;
  const float k1 = params_.k1, b = params_.b;
  using Term = PrunedTerm;
  std::vector<std::unique_ptr<Term>> terms;
  terms.reserve(query.size());
  // Group scores: one pass over each term's group postings (and the mutable
  // tier's docs), in query order as Search() adds them.
  struct Scratch {
    std::vector<float> gscore;
    std::vector<uint32_t> gtf, gseen, gtouched;
  };
  thread_local Scratch scratch;
  const size_t num_groups = grouped ? groups->group_len->size() : 0;
  if (scratch.gtf.size() < num_groups) scratch.gtf.resize(num_groups, 0);
  if (scratch.gscore.size() < num_groups) scratch.gscore.resize(num_groups, 0.0f);
  scratch.gtouched.clear();
  for (const auto& [q, weight] : query) {
    Image::Entry entry{};
    const bool in_base = base_->Find(q, &entry);
    auto it = terms_.find(q);
    const std::vector<Posting>* list = it == terms_.end() ? nullptr : &postings_[it->second];
    const size_t df_count = (in_base ? entry.df : 0) + (list ? list->size() : 0);
    if (df_count == 0) continue;
    auto t = std::make_unique<Term>();
    t->weight = weight;
    t->idf = Idf(num_docs_, df_count);
    Cursor& c = t->cur;
    c.live = &base_live_;
    if (in_base) {
      c.post = reinterpret_cast<const uint8_t*>(base_->postings + entry.off);
      c.skips = base_->skips + entry.skip_off;
      c.nblocks = entry.nblocks;
    }
    c.list = list;
    // The term's largest possible contribution: over its blocks (largest tf
    // with the shortest doc bounds every posting of the block) and the
    // mutable tier's postings.
    float unit = 0;
    for (uint32_t blk = 0; blk < c.nblocks; ++blk) {
      unit = std::max(unit, TermScore(1, 1, c.SkipAt(blk, 2), c.SkipAt(blk, 3), k1, b, avg_len));
    }
    if (list) {
      for (const Posting& p : *list) {
        unit = std::max(unit, TermScore(1, 1, p.tf, doc_len_[p.doc] - 1, k1, b, avg_len));
      }
    }
    t->ub = static_cast<double>(weight) * t->idf * unit * (1 + kSlack) + 1e-30;
    c.Open();
    if (grouped) {
      auto& gseen = scratch.gseen;
      gseen.clear();
      const auto& group_of = *groups->group_of;
      auto add = [&](uint32_t member, uint32_t tf) {
        if (member >= group_of.size()) return;
        const uint32_t g = group_of[member];
        if (g >= num_groups) return;
        if (scratch.gtf[g] == 0) gseen.push_back(g);
        scratch.gtf[g] += tf;
      };
      if (in_base && entry.gdf == 0) {
        // Not saved by group: this term's own postings are few.
        ForEachLivePosting(base_->postings + entry.off, entry.bytes, base_live_, add);
      } else if (in_base) {
        ForEachLivePosting(base_->groups + entry.goff, entry.gbytes, base_live_, add);
      }
      if (list) {
        for (const Posting& p : *list) add(p.doc, p.tf);
      }
      ScoreGroups(weight, k1, *groups, gseen, scratch.gtf, scratch.gscore, scratch.gtouched);
    }
    terms.push_back(std::move(t));
  }
  if (grouped) {
    groups->scores.reserve(scratch.gtouched.size());
    for (uint32_t g : scratch.gtouched) {
      groups->scores.emplace_back(g, scratch.gscore[g]);
      scratch.gscore[g] = 0.0f;
    }
  }
  if (terms.empty()) return out;
  return MaxScoreTopK(terms, k, accept, avg_len);
}

std::vector<std::pair<uint32_t, float>> Bm25Index::ScoreDocs(
    const std::vector<std::pair<std::string, float>>& query, const std::vector<uint32_t>& docs,
    const std::function<bool(uint32_t)>& accept) const {
  std::vector<std::pair<uint32_t, float>> out;
  if (num_docs_ == 0 || docs.empty()) return out;
  if (base_ && base_->version < 3) {
    // No skip blocks: every posting is read anyway.
    std::vector<std::pair<uint32_t, float>> all;
    (void)Search(query, 1, accept, &all, nullptr);
    std::unordered_map<uint32_t, float> by_doc(all.begin(), all.end());
    for (uint32_t d : docs) {
      auto it = by_doc.find(d);
      if (it != by_doc.end()) out.emplace_back(d, it->second);
    }
    return out;
  }
  const float avg_len = static_cast<float>(total_len_) / num_docs_;
  const float k1 = params_.k1, b = params_.b;
  std::vector<size_t> order(docs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t c) { return docs[a] < docs[c]; });
  std::vector<float> score(docs.size(), 0.0f);
  std::vector<bool> matched(docs.size(), false);
  auto cur = std::make_unique<Cursor>();
  for (const auto& [q, term_weight] : query) {
    const float weight = term_weight;  // (a lambda below uses it)
    Image::Entry entry{};
    const bool in_base = base_ && base_->Find(q, &entry);
    auto it = terms_.find(q);
    const std::vector<Posting>* list = it == terms_.end() ? nullptr : &postings_[it->second];
    const size_t df_count = (in_base ? entry.df : 0) + (list ? list->size() : 0);
    if (df_count == 0) continue;
    const float idf = Idf(num_docs_, df_count);
    *cur = Cursor{};
    cur->live = &base_live_;
    if (in_base) {
      cur->post = reinterpret_cast<const uint8_t*>(base_->postings + entry.off);
      cur->skips = base_->skips + entry.skip_off;
      cur->nblocks = entry.nblocks;
    }
    cur->list = list;
    cur->Open();
    for (size_t i : order) {
      const uint32_t d = docs[i];
      cur->SkipTo(d);
      if (cur->doc == kEnd) break;
      if (cur->doc != d) continue;
      score[i] += TermScore(weight, idf, cur->tf, doc_len_[d] - 1, k1, b, avg_len);
      matched[i] = true;
    }
  }
  for (size_t i = 0; i < docs.size(); ++i) {
    if (matched[i] && (!accept || accept(docs[i]))) out.emplace_back(docs[i], score[i]);
  }
  return out;
}

size_t Bm25Index::mutable_bytes() const {
  size_t n = 0;
  for (const auto& l : postings_) n += l.capacity() * sizeof(Posting);
  return n;
}

size_t Bm25Index::base_bytes() const { return base_ ? base_->size : 0; }

int Bm25Index::image_version() const { return base_ ? base_->version : 3; }

namespace {

using DocTf = std::pair<uint32_t, uint32_t>;

// An image being written: the dictionary and the three blobs its entries
// point into.
struct ImageParts {
  struct Term {
    std::string_view term;
    uint32_t df;
    uint64_t off;
    uint32_t bytes;
    uint32_t nblocks;
    uint64_t skip_off;
    uint32_t gdf;
    uint64_t goff;
    uint32_t gbytes;
  };
  std::vector<Term> dict;
  std::string blob, skips, gblob;
};

void Put32(std::string* to, uint32_t v) { to->append(reinterpret_cast<const char*>(&v), 4); }

// A term's postings (ascending doc) as varints, with a skip entry (last doc,
// end offset, max tf, min length) per block.
void PutPostings(const std::vector<DocTf>& merged, const std::vector<uint32_t>& doc_len,
                 ImageParts& img) {
  const uint64_t off = img.blob.size();
  uint32_t prev = 0, max_tf = 0, min_len = kEnd;
  for (size_t i = 0; i < merged.size(); ++i) {
    const auto [doc, tf] = merged[i];
    PutVarint(&img.blob, doc - prev);
    PutVarint(&img.blob, tf);
    prev = doc;
    max_tf = std::max(max_tf, tf);
    min_len = std::min(min_len, doc < doc_len.size() && doc_len[doc] > 0 ? doc_len[doc] - 1 : 0);
    if ((i + 1) % kBlock == 0 || i + 1 == merged.size()) {
      Put32(&img.skips, doc);
      Put32(&img.skips, static_cast<uint32_t>(img.blob.size() - off));
      Put32(&img.skips, max_tf);
      Put32(&img.skips, min_len);
      max_tf = 0;
      min_len = kEnd;
    }
  }
}

// A term's postings summed by group (document); returns how many groups were
// written, 0 when grouping would not save most of the reading.
uint32_t PutGroups(const std::vector<DocTf>& merged,
                   const std::function<uint32_t(uint32_t)>& group_key, std::vector<DocTf>& grouped,
                   std::string* gblob) {
  grouped.clear();
  for (const auto& [doc, tf] : merged) {
    const uint32_t key = group_key(doc);
    if (key == Bm25Index::kNoGroup) continue;
    if (!grouped.empty() && grouped.back().first == key) {
      grouped.back().second += tf;
    } else {
      grouped.emplace_back(key, tf);
    }
  }
  std::sort(grouped.begin(), grouped.end());
  size_t w = 0;  // summed by key
  for (size_t i = 0; i < grouped.size(); ++i) {
    if (w > 0 && grouped[w - 1].first == grouped[i].first) {
      grouped[w - 1].second += grouped[i].second;
    } else {
      grouped[w++] = grouped[i];
    }
  }
  grouped.resize(w);
  // Only where they save most of the reading: a term found in about one
  // chunk of each document holding it is grouped from its postings
  // (groups_df 0).
  if (grouped.size() * 2 > merged.size()) return 0;
  uint32_t gprev = 0, gdf = 0;
  for (const auto& [key, sum] : grouped) {
    PutVarint(gblob, key - gprev);
    PutVarint(gblob, sum);
    gprev = key;
    ++gdf;
  }
  return gdf;
}

// Header, dictionary offsets, dictionary, blobs, then the checksum of all.
void WriteImageParts(const ImageParts& img, uint64_t generation, const Bm25Params& params,
                     const std::vector<uint32_t>& doc_len, bool grouped,
                     const std::function<void(const char*, size_t)>& out) {
  Hasher h;
  auto put = [&](const void* p, size_t n) {
    h.Update(static_cast<const char*>(p), n);
    out(static_cast<const char*>(p), n);
  };
  put(kMagic, sizeof(kMagic));
  put(&generation, 8);
  put(&params.k1, 4);
  put(&params.b, 4);
  const uint32_t ndocs = static_cast<uint32_t>(doc_len.size());
  put(&ndocs, 4);
  if (ndocs > 0) put(doc_len.data(), size_t{ndocs} * 4);
  const uint32_t nterms = static_cast<uint32_t>(img.dict.size());
  put(&nterms, 4);
  const uint32_t flags = grouped ? 1u : 0u;
  put(&flags, 4);
  const uint64_t sizes[3] = {img.blob.size(), img.skips.size(), img.gblob.size()};
  put(sizes, sizeof(sizes));
  uint64_t at = 0;
  for (const auto& t : img.dict) {
    put(&at, 8);
    at += kEntryV3 + std::min<size_t>(t.term.size(), 0xffff);
  }
  put(&at, 8);
  for (const auto& t : img.dict) {
    const uint16_t len = static_cast<uint16_t>(std::min<size_t>(t.term.size(), 0xffff));
    put(&t.df, 4);
    put(&t.off, 8);
    put(&t.bytes, 4);
    put(&t.nblocks, 4);
    put(&t.skip_off, 8);
    put(&t.gdf, 4);
    put(&t.goff, 8);
    put(&t.gbytes, 4);
    put(&len, 2);
    put(t.term.data(), len);
  }
  put(img.blob.data(), img.blob.size());
  put(img.skips.data(), img.skips.size());
  put(img.gblob.data(), img.gblob.size());
  const uint64_t sum = h.Final();
  out(reinterpret_cast<const char*>(&sum), 8);
}

}  // namespace

void Bm25Index::Write(const std::function<void(const char*, size_t)>& out, uint64_t generation,
                      const std::function<uint32_t(uint32_t)>& group_key) const {
  // The merged term list: the base's (already sorted) and the mutable tier's.
  std::vector<std::string_view> mutable_terms;
  mutable_terms.reserve(terms_.size());
  for (const auto& [term, id] : terms_) {
    if (!postings_[id].empty()) mutable_terms.push_back(term);
  }
  std::sort(mutable_terms.begin(), mutable_terms.end());
  // Encode postings term by term (base postings of live docs, then the
  // mutable tier's, by ascending doc: a doc is in one tier only).
  ImageParts img;
  std::vector<DocTf> merged, grouped;
  auto encode = [&](std::string_view term, const Image::Entry* be, const std::vector<Posting>* ml) {
    merged.clear();
    if (be != nullptr) {
      ForEachLivePosting(base_->postings + be->off, be->bytes, base_live_,
                         [&](uint32_t doc, uint32_t tf) { merged.emplace_back(doc, tf); });
    }
    if (ml != nullptr) {
      const size_t mid = merged.size();
      for (const Posting& x : *ml) merged.emplace_back(x.doc, x.tf);
      std::inplace_merge(merged.begin(), merged.begin() + static_cast<std::ptrdiff_t>(mid),
                         merged.end());
    }
    if (merged.empty()) return;
    const uint64_t off = img.blob.size();
    const uint64_t skip_off = img.skips.size();
    PutPostings(merged, doc_len_, img);
    const uint64_t goff = img.gblob.size();
    const uint32_t gdf = group_key ? PutGroups(merged, group_key, grouped, &img.gblob) : 0;
    img.dict.push_back({term, static_cast<uint32_t>(merged.size()), off,
                        static_cast<uint32_t>(img.blob.size() - off),
                        static_cast<uint32_t>((merged.size() + kBlock - 1) / kBlock), skip_off, gdf,
                        goff, static_cast<uint32_t>(img.gblob.size() - goff)});
  };
  size_t mi = 0;
  const uint32_t base_terms = base_ ? base_->nterms : 0;
  for (uint32_t bi = 0; bi < base_terms || mi < mutable_terms.size();) {
    Image::Entry be{};
    if (bi < base_terms) be = base_->EntryAt(bi);
    if (bi < base_terms && (mi >= mutable_terms.size() || be.term < mutable_terms[mi])) {
      encode(be.term, &be, nullptr);
      ++bi;
    } else if (bi >= base_terms || mutable_terms[mi] < be.term) {
      encode(mutable_terms[mi], nullptr, &postings_[terms_.at(std::string(mutable_terms[mi]))]);
      ++mi;
    } else {
      encode(be.term, &be, &postings_[terms_.at(std::string(mutable_terms[mi]))]);
      ++bi;
      ++mi;
    }
  }
  WriteImageParts(img, generation, params_, doc_len_, static_cast<bool>(group_key), out);
}

std::string Bm25Index::Serialize() const {
  std::string s;
  Write([&s](const char* p, size_t n) { s.append(p, n); }, 0, nullptr);
  return s;
}

absl::Status Bm25Index::Save(const std::string& path, uint64_t generation,
                             const std::function<uint32_t(uint32_t)>& group_key) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  bool ok = true;
  std::vector<char> buf(1 << 20);
  std::setvbuf(f, buf.data(), _IOFBF, buf.size());
  Write([&](const char* p, size_t n) { ok = ok && std::fwrite(p, 1, n, f) == n; }, generation,
        group_key);
  ok = ok && std::fflush(f) == 0 && fsync(fileno(f)) == 0;
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::StatusOr<Bm25Index> Bm25Index::FromImage(std::shared_ptr<const Image> image) {
  Bm25Index idx(image->params);
  idx.doc_len_.resize(image->ndocs);
  if (image->ndocs > 0) std::memcpy(idx.doc_len_.data(), image->doc_len, size_t{image->ndocs} * 4);
  idx.base_live_.assign(image->ndocs, false);
  for (uint32_t d = 0; d < image->ndocs; ++d) {
    if (idx.doc_len_[d] > 0) {
      idx.base_live_[d] = true;
      ++idx.num_docs_;
      idx.total_len_ += idx.doc_len_[d] - 1;
    }
  }
  idx.base_ = std::move(image);
  return idx;
}

absl::StatusOr<Bm25Index> Bm25Index::Deserialize(std::string_view bytes) {
  auto image = std::make_shared<Image>();
  image->owned.assign(bytes.data(), bytes.size());
  image->data = image->owned.data();
  image->size = image->owned.size();
  if (auto s = image->Parse(); !s.ok()) return s;
  return FromImage(std::move(image));
}

absl::StatusOr<std::unique_ptr<Bm25Index>> Bm25Index::Load(const std::string& path,
                                                           uint64_t generation) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no saved lexical index"));
    return absl::InternalError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  auto image = std::make_shared<Image>();
  image->size = static_cast<size_t>(st.st_size);
  if (image->size > 0) {
    image->map = mmap(nullptr, image->size, PROT_READ, MAP_SHARED, fd, 0);
    if (image->map == MAP_FAILED) {
      image->map = nullptr;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(errno)));
    }
    image->data = static_cast<const char*>(image->map);
  }
  close(fd);
  if (auto s = image->Parse(); !s.ok())
    return absl::DataLossError(absl::StrCat(path, ": ", s.message()));
  if (image->generation != generation) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": lexical index is at generation ", image->generation, ", store at ", generation));
  }
  auto idx = FromImage(std::move(image));
  if (!idx.ok()) return idx.status();
  return std::make_unique<Bm25Index>(*std::move(idx));
}

}  // namespace fwai
