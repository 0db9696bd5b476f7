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

// Image layout (little-endian):
//   "FWBM25v2" | u64 generation | f32 k1 | f32 b | u32 ndocs | u32 doc_len[ndocs]
//   | u32 nterms | u64 entry_offset[nterms + 1] (relative to the entries)
//   | entries: (u32 df, u64 postings_offset, u32 postings_bytes, u16 term_len, term) sorted by term
//   | postings: per term, (varint doc delta, varint tf) pairs by ascending doc
//   | u64 checksum of everything before it
namespace {

constexpr char kMagic[8] = {'F', 'W', 'B', 'M', '2', '5', 'v', '2'};

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

template <typename T>
T Read(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
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
  uint32_t ndocs = 0, nterms = 0;
  const char* doc_len = nullptr;
  const char* offsets = nullptr;
  const char* entries = nullptr;
  const char* postings = nullptr;
  size_t postings_size = 0;

  ~Image() {
    if (map != nullptr) munmap(map, size);
  }
  struct Entry {
    uint32_t df;
    uint64_t off;
    uint32_t bytes;
    std::string_view term;
  };
  Entry EntryAt(uint32_t i) const {
    const char* e = entries + Read<uint64_t>(offsets + 8 * size_t{i});
    return {Read<uint32_t>(e), Read<uint64_t>(e + 4), Read<uint32_t>(e + 12),
            std::string_view(e + 18, Read<uint16_t>(e + 16))};
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
    if (size < sizeof(kMagic) + 8 + 8 || std::memcmp(data, kMagic, sizeof(kMagic)) != 0)
      return damaged("bad header");
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
    if (static_cast<size_t>(end - p) < (size_t{nterms} + 1) * 8)
      return damaged("truncated term offsets");
    offsets = p;
    p += (size_t{nterms} + 1) * 8;
    entries = p;
    const uint64_t entries_size = Read<uint64_t>(offsets + 8 * size_t{nterms});
    if (static_cast<uint64_t>(end - p) < entries_size) return damaged("truncated terms");
    postings = p + entries_size;
    postings_size = static_cast<size_t>(end - postings);
    for (uint32_t i = 0; i < nterms; ++i) {
      const uint64_t a = Read<uint64_t>(offsets + 8 * size_t{i}),
                     b = Read<uint64_t>(offsets + 8 * (size_t{i} + 1));
      if (a > b || b > entries_size || b - a < 18) return damaged("bad term offsets");
      Entry e = EntryAt(i);
      if (18 + e.term.size() > b - a || e.off + e.bytes > postings_size)
        return damaged("bad term entry");
    }
    return absl::OkStatus();
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
  std::unordered_map<uint32_t, uint32_t> tf;
  for (const auto& t : terms) ++tf[TermId(t)];
  if (doc >= doc_len_.size()) doc_len_.resize(doc + 1, 0);
  if (doc >= doc_terms_.size()) doc_terms_.resize(doc + 1);
  doc_len_[doc] = static_cast<uint32_t>(terms.size()) + 1;
  auto& ids = doc_terms_[doc];
  ids.clear();
  ids.reserve(tf.size());
  for (const auto& [term, count] : tf) {
    auto& list = postings_[term];
    Posting p{doc, count};
    if (list.empty() || list.back().doc < doc) {
      list.push_back(p);
    } else {
      auto pos = std::lower_bound(list.begin(), list.end(), doc,
                                  [](const Posting& a, uint32_t d) { return a.doc < d; });
      list.insert(pos, p);
    }
    ids.push_back(term);
  }
  ++num_docs_;
  total_len_ += terms.size();
}

void Bm25Index::Remove(uint32_t doc) {
  if (!Contains(doc)) return;
  if (doc < base_live_.size() && base_live_[doc]) {
    base_live_[doc] = false;  // its postings stay in the image until the next save
  } else if (doc < doc_terms_.size()) {
    for (uint32_t term : doc_terms_[doc]) {
      auto& list = postings_[term];
      auto pos = std::lower_bound(list.begin(), list.end(), doc,
                                  [](const Posting& a, uint32_t d) { return a.doc < d; });
      if (pos != list.end() && pos->doc == doc) list.erase(pos);
    }
    doc_terms_[doc].clear();
    doc_terms_[doc].shrink_to_fit();
  }
  total_len_ -= doc_len_[doc] - 1;
  doc_len_[doc] = 0;
  --num_docs_;
}

std::vector<std::pair<uint32_t, float>> Bm25Index::Search(
    const std::vector<std::string>& query, size_t k, const std::function<bool(uint32_t)>& accept) const {
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
  for (const auto& [q, weight] : query) {
    Image::Entry entry{};
    const bool in_base = base_ && base_->Find(q, &entry);
    auto it = terms_.find(q);
    const std::vector<Posting>* list = it == terms_.end() ? nullptr : &postings_[it->second];
    const size_t df_count = (in_base ? entry.df : 0) + (list ? list->size() : 0);
    if (df_count == 0) continue;
    const float df = static_cast<float>(df_count);
    const float idf = std::log(1.0f + (num_docs_ - df + 0.5f) / (df + 0.5f));
    gseen.clear();
    auto visit = [&](uint32_t doc, uint32_t tf_count) {
      const float len = static_cast<float>(doc_len_[doc] - 1);
      const float tf = static_cast<float>(tf_count);
      const float s = weight * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len));
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
    if (in_base) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(base_->postings + entry.off);
      const uint8_t* end = p + entry.bytes;
      uint32_t doc = 0;
      while (p != nullptr && p < end) {
        uint32_t delta = 0, tf = 0;
        p = GetVarint(p, end, &delta);
        if (p == nullptr) break;
        p = GetVarint(p, end, &tf);
        if (p == nullptr) break;
        doc += delta;
        if (doc < base_live_.size() && base_live_[doc]) visit(doc, tf);
      }
    }
    if (list) {
      for (const Posting& p : *list) visit(p.doc, p.tf);
    }
    if (!gseen.empty()) {
      const float gdf = static_cast<float>(gseen.size());
      const float n = static_cast<float>(groups->present);
      const float gidf = std::log(1.0f + std::max(0.0f, n - gdf + 0.5f) / (gdf + 0.5f));
      const float gb = groups->b;
      for (uint32_t g : gseen) {
        const float t = static_cast<float>(gtf[g]);
        const float glen = static_cast<float>((*groups->group_len)[g]);
        if (gscore[g] == 0.0f) gtouched.push_back(g);
        gscore[g] += weight * gidf * t * (k1 + 1) / (t + k1 * (1 - gb + gb * glen / groups->avg_len));
        gtf[g] = 0;
      }
    }
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

size_t Bm25Index::mutable_bytes() const {
  size_t n = 0;
  for (const auto& l : postings_) n += l.capacity() * sizeof(Posting);
  return n;
}

size_t Bm25Index::base_bytes() const { return base_ ? base_->size : 0; }

void Bm25Index::Write(const std::function<void(const char*, size_t)>& out,
                      uint64_t generation) const {
  // The merged term list: the base's (already sorted) and the mutable tier's.
  std::vector<std::string_view> mutable_terms;
  mutable_terms.reserve(terms_.size());
  for (const auto& [term, id] : terms_) {
    if (!postings_[id].empty()) mutable_terms.push_back(term);
  }
  std::sort(mutable_terms.begin(), mutable_terms.end());
  // Encode postings term by term (base postings of live docs, then the
  // mutable tier's, by ascending doc: a doc is in one tier only).
  struct Term {
    std::string_view term;
    uint32_t df;
    uint64_t off;
    uint32_t bytes;
  };
  std::vector<Term> dict;
  std::string blob;
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  auto encode = [&](std::string_view term, const Image::Entry* be, const std::vector<Posting>* ml) {
    merged.clear();
    if (be != nullptr) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(base_->postings + be->off);
      const uint8_t* end = p + be->bytes;
      uint32_t doc = 0;
      while (p != nullptr && p < end) {
        uint32_t delta = 0, tf = 0;
        p = GetVarint(p, end, &delta);
        if (p == nullptr) break;
        p = GetVarint(p, end, &tf);
        if (p == nullptr) break;
        doc += delta;
        if (doc < base_live_.size() && base_live_[doc]) merged.emplace_back(doc, tf);
      }
    }
    if (ml != nullptr) {
      const size_t mid = merged.size();
      for (const Posting& x : *ml) merged.emplace_back(x.doc, x.tf);
      std::inplace_merge(merged.begin(), merged.begin() + static_cast<std::ptrdiff_t>(mid),
                         merged.end());
    }
    if (merged.empty()) return;
    const uint64_t off = blob.size();
    uint32_t prev = 0;
    for (const auto& [doc, tf] : merged) {
      PutVarint(&blob, doc - prev);
      PutVarint(&blob, tf);
      prev = doc;
    }
    dict.push_back({term, static_cast<uint32_t>(merged.size()), off,
                    static_cast<uint32_t>(blob.size() - off)});
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
  Hasher h;
  auto put = [&](const void* p, size_t n) {
    h.Update(static_cast<const char*>(p), n);
    out(static_cast<const char*>(p), n);
  };
  put(kMagic, sizeof(kMagic));
  put(&generation, 8);
  put(&params_.k1, 4);
  put(&params_.b, 4);
  const uint32_t ndocs = static_cast<uint32_t>(doc_len_.size());
  put(&ndocs, 4);
  if (ndocs > 0) put(doc_len_.data(), size_t{ndocs} * 4);
  const uint32_t nterms = static_cast<uint32_t>(dict.size());
  put(&nterms, 4);
  uint64_t at = 0;
  for (const auto& t : dict) {
    put(&at, 8);
    at += 18 + t.term.size();
  }
  put(&at, 8);
  for (const auto& t : dict) {
    const uint16_t len = static_cast<uint16_t>(std::min<size_t>(t.term.size(), 0xffff));
    put(&t.df, 4);
    put(&t.off, 8);
    put(&t.bytes, 4);
    put(&len, 2);
    put(t.term.data(), len);
  }
  put(blob.data(), blob.size());
  const uint64_t sum = h.Final();
  out(reinterpret_cast<const char*>(&sum), 8);
}

std::string Bm25Index::Serialize() const {
  std::string s;
  Write([&s](const char* p, size_t n) { s.append(p, n); }, 0);
  return s;
}

absl::Status Bm25Index::Save(const std::string& path, uint64_t generation) const {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr)
    return absl::InternalError(absl::StrCat("cannot write ", tmp, ": ", std::strerror(errno)));
  bool ok = true;
  std::vector<char> buf(1 << 20);
  std::setvbuf(f, buf.data(), _IOFBF, buf.size());
  Write([&](const char* p, size_t n) { ok = ok && std::fwrite(p, 1, n, f) == n; }, generation);
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
