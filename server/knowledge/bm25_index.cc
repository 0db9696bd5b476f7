#include "server/knowledge/bm25_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace fwai {

uint32_t Bm25Index::TermId(const std::string& term) {
  auto [it, inserted] = terms_.try_emplace(term, static_cast<uint32_t>(postings_.size()));
  if (inserted) postings_.emplace_back();
  return it->second;
}

void Bm25Index::EnsureDocTerms() {
  if (doc_terms_ready_) return;
  doc_terms_.assign(doc_len_.size(), {});
  for (uint32_t t = 0; t < postings_.size(); ++t) {
    for (const Posting& p : postings_[t]) doc_terms_[p.doc].push_back(t);
  }
  doc_terms_ready_ = true;
}

void Bm25Index::Add(uint32_t doc, const std::vector<std::string>& terms) {
  if (Contains(doc)) Remove(doc);
  EnsureDocTerms();
  std::unordered_map<uint32_t, uint32_t> tf;
  for (const auto& t : terms) ++tf[TermId(t)];
  if (doc >= doc_len_.size()) {
    doc_len_.resize(doc + 1, 0);
    doc_terms_.resize(doc + 1);
  }
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
  EnsureDocTerms();
  for (uint32_t term : doc_terms_[doc]) {
    auto& list = postings_[term];
    auto pos = std::lower_bound(list.begin(), list.end(), doc,
                                [](const Posting& a, uint32_t d) { return a.doc < d; });
    if (pos != list.end() && pos->doc == doc) list.erase(pos);
  }
  total_len_ -= doc_len_[doc] - 1;
  doc_len_[doc] = 0;
  doc_terms_[doc].clear();
  doc_terms_[doc].shrink_to_fit();
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
  std::vector<float> score(doc_len_.size(), 0.0f);
  std::vector<uint32_t> touched;
  // Group state: summed tf of the current term, groups it touched, totals.
  const bool grouped = groups && groups->group_of && groups->group_len && groups->present > 0;
  const size_t num_groups = grouped ? groups->group_len->size() : 0;
  std::vector<uint32_t> gtf(num_groups, 0), gseen, gtouched;
  std::vector<float> gscore(num_groups, 0.0f);
  for (const auto& [q, weight] : query) {
    auto it = terms_.find(q);
    if (it == terms_.end()) continue;
    const auto& list = postings_[it->second];
    if (list.empty()) continue;
    const float df = static_cast<float>(list.size());
    const float idf = std::log(1.0f + (num_docs_ - df + 0.5f) / (df + 0.5f));
    gseen.clear();
    for (const Posting& p : list) {
      const float len = static_cast<float>(doc_len_[p.doc] - 1);
      const float tf = static_cast<float>(p.tf);
      const float s = weight * idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avg_len));
      if (score[p.doc] == 0.0f) touched.push_back(p.doc);
      score[p.doc] += s;
      if (grouped && p.doc < groups->group_of->size()) {
        const uint32_t g = (*groups->group_of)[p.doc];
        if (g < num_groups) {
          if (gtf[g] == 0) gseen.push_back(g);
          gtf[g] += p.tf;
        }
      }
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
    for (uint32_t g : gtouched) groups->scores.emplace_back(g, gscore[g]);
  }
  out.reserve(touched.size());
  for (uint32_t d : touched) {
    if (accept && !accept(d)) continue;
    out.emplace_back(d, score[d]);
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

namespace {

constexpr char kMagic[8] = {'F', 'W', 'B', 'M', '2', '5', 'v', '1'};

void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }

uint64_t Fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool U32(uint32_t* v) { return Raw(v, 4); }
  bool U64(uint64_t* v) { return Raw(v, 8); }
  bool F32(float* v) { return Raw(v, 4); }
  bool Str(std::string* out, uint32_t n) {
    if (s_.size() - pos_ < n) return false;
    out->assign(s_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  bool Raw(void* v, size_t n) {
    if (s_.size() - pos_ < n) return false;
    std::memcpy(v, s_.data() + pos_, n);
    pos_ += n;
    return true;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

std::string Bm25Index::Serialize() const {
  std::string s(kMagic, sizeof(kMagic));
  s.append(reinterpret_cast<const char*>(&params_.k1), 4);
  s.append(reinterpret_cast<const char*>(&params_.b), 4);
  PutU32(&s, static_cast<uint32_t>(doc_len_.size()));
  for (uint32_t l : doc_len_) PutU32(&s, l);
  PutU32(&s, static_cast<uint32_t>(terms_.size()));
  for (const auto& [term, id] : terms_) {
    PutU32(&s, static_cast<uint32_t>(term.size()));
    s.append(term);
    const auto& list = postings_[id];
    PutU32(&s, static_cast<uint32_t>(list.size()));
    for (const auto& p : list) {
      PutU32(&s, p.doc);
      PutU32(&s, p.tf);
    }
  }
  PutU64(&s, Fnv1a(s));
  return s;
}

absl::StatusOr<Bm25Index> Bm25Index::Deserialize(std::string_view bytes) {
  auto damaged = [](const std::string& what) {
    return absl::DataLossError(absl::StrCat("lexical index image is damaged: ", what));
  };
  if (bytes.size() < sizeof(kMagic) + 8 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return damaged("bad header");
  }
  uint64_t want;
  std::memcpy(&want, bytes.data() + bytes.size() - 8, 8);
  if (Fnv1a(bytes.substr(0, bytes.size() - 8)) != want) return damaged("checksum mismatch");
  Reader r(bytes.substr(sizeof(kMagic), bytes.size() - sizeof(kMagic) - 8));
  Bm25Params params;
  uint32_t ndocs = 0, nterms = 0;
  if (!r.F32(&params.k1) || !r.F32(&params.b) || !r.U32(&ndocs)) return damaged("truncated");
  Bm25Index idx(params);
  idx.doc_len_.resize(ndocs);
  idx.doc_terms_ready_ = false;
  for (uint32_t i = 0; i < ndocs; ++i) {
    if (!r.U32(&idx.doc_len_[i])) return damaged("truncated doc lengths");
    if (idx.doc_len_[i] > 0) {
      ++idx.num_docs_;
      idx.total_len_ += idx.doc_len_[i] - 1;
    }
  }
  if (!r.U32(&nterms)) return damaged("truncated");
  idx.postings_.resize(nterms);
  idx.terms_.reserve(nterms);
  static_assert(sizeof(Posting) == 8, "postings are stored as (doc, tf) u32 pairs");
  for (uint32_t t = 0; t < nterms; ++t) {
    uint32_t len = 0, n = 0;
    std::string term;
    if (!r.U32(&len) || !r.Str(&term, len) || !r.U32(&n)) return damaged("truncated term");
    idx.terms_.emplace(std::move(term), t);
    auto& list = idx.postings_[t];
    list.resize(n);
    if (!r.Raw(list.data(), size_t{n} * sizeof(Posting))) return damaged("truncated postings");
    for (const Posting& p : list) {
      if (p.doc >= ndocs) return damaged("posting names an unknown doc");
    }
  }
  return idx;
}

}  // namespace fwai
