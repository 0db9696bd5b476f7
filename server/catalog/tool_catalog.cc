#include "server/catalog/tool_catalog.h"

#include <openssl/sha.h>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "server/knowledge/bm25_index.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/query_expansion.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/tokenizer.h"
#include "server/knowledge/vector_index.h"
#include "server/storage/storage.h"

namespace fwai {

using json = nlohmann::json;

RerankWeights ToolCatalogRerankWeights() {
  RerankWeights w;
  w.identifier = 0.3;
  w.coverage = 0.3;
  w.proximity = 0.1;
  w.context = 0.3;
  w.vector = 0.0;
  w.lexical = 0.8;  // whole-document BM25 of the candidate
  w.fused = 0.3;    // slice-group score
  w.doc = 0.0;
  // Spelled out: the document reranker's defaults are chosen separately.
  w.doc_text = 0.80;
  w.named = 0.50;
  return w;
}

std::string ToolUuid(const std::string& name) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(name.data()), name.size(), md);
  static const char* hex = "0123456789abcdef";
  std::string h;
  for (int i = 0; i < 16; ++i) {
    h.push_back(hex[md[i] >> 4]);
    h.push_back(hex[md[i] & 15]);
  }
  h[12] = '5';  // a name-based UUID
  return absl::StrCat(h.substr(0, 8), "-", h.substr(8, 4), "-", h.substr(12, 4), "-",
                      h.substr(16, 4), "-", h.substr(20, 12));
}

namespace {

// "openocd.flash_erase_sector", "createIssue" -> "... openocd flash erase sector", "create issue".
std::string NameWords(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    if (c == '.' || c == '_' || c == '-' || c == '/') {
      out.push_back(' ');
      continue;
    }
    if (i > 0 && std::isupper(static_cast<unsigned char>(c)) &&
        std::islower(static_cast<unsigned char>(name[i - 1]))) {
      out.push_back(' ');
    }
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return name + " " + out;
}

std::string WholeText(const json& d) {
  std::string t = NameWords(d.value("ToolName", "")) + "\n" + d.value("ToolDescription", "");
  for (const auto& a : d["Args"]) {
    absl::StrAppend(&t, "\n", NameWords(a.value("ArgName", "")), ": ",
                    a.value("ArgDescription", ""));
    if (a.contains("enum")) {
      for (const auto& e : a["enum"]) absl::StrAppend(&t, " ", e.get<std::string>());
    }
  }
  return t;
}

}  // namespace

struct ToolCatalogStore::Impl {
  Storage& storage;
  CatalogOptions options;
  Embedder& embedder;
  Reranker& reranker;
  Mutex writer;  // serializes writers (held across the storage write, then mu)
  mutable SharedMutex mu;
  std::vector<ToolRecord> tools ABSL_GUARDED_BY(mu);   // by slot; empty uuid = removed
  std::vector<std::string> whole ABSL_GUARDED_BY(mu);  // whole-document text by slot
  // The program a tool belongs to: its ToolName's namespace words (openocd,
  // gdb, git, github ...; "mcp" left out), by slot.
  std::vector<std::vector<std::string>> tool_ns ABSL_GUARDED_BY(mu);
  std::set<std::string> all_ns ABSL_GUARDED_BY(mu);  // every namespace word seen
  std::unordered_map<std::string, uint32_t> by_name ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> slice_tool ABSL_GUARDED_BY(mu);                // slice id -> slot
  std::vector<std::vector<uint32_t>> tool_slices ABSL_GUARDED_BY(mu);  // slot -> slice ids
  Bm25Index slices ABSL_GUARDED_BY(mu);
  Bm25Index docs ABSL_GUARDED_BY(mu);
  // Set in Open(); the index it points to is guarded by mu.
  std::unique_ptr<VectorIndex> vectors ABSL_PT_GUARDED_BY(mu);

  Impl(Storage& s, CatalogOptions o, Embedder& e, Reranker& r)
      : storage(s), options(o), embedder(e), reranker(r) {}

  absl::Status AddLocked(const ToolRecord& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    json d = json::parse(rec.document_json);
    auto it = by_name.find(rec.name);
    if (it != by_name.end()) RemoveLocked(it->second);
    uint32_t slot = static_cast<uint32_t>(tools.size());
    tools.push_back(rec);
    whole.push_back(WholeText(d));
    {
      std::vector<std::string> ns;
      if (const size_t dot = rec.name.rfind('.'); dot != std::string::npos)
        Tokenize(NameWords(rec.name.substr(0, dot)), &ns);
      std::erase(ns, std::string("mcp"));
      all_ns.insert(ns.begin(), ns.end());
      tool_ns.push_back(std::move(ns));
    }
    tool_slices.emplace_back();
    by_name[rec.name] = slot;
    std::vector<std::string> texts;
    texts.push_back(NameWords(rec.name) + "\n" + d.value("ToolDescription", ""));
    for (const auto& a : d["Args"]) {
      std::string t = NameWords(a.value("ArgName", "")) + "\n" + a.value("ArgDescription", "");
      if (a.contains("enum")) {
        for (const auto& e : a["enum"]) absl::StrAppend(&t, " ", e.get<std::string>());
      }
      texts.push_back(t);
    }
    ASSIGN_OR_RETURN(auto vecs, embedder.Embed(texts, false));
    std::vector<uint32_t> ids;
    std::vector<float> flat;
    for (size_t i = 0; i < texts.size(); ++i) {
      uint32_t sid = static_cast<uint32_t>(slice_tool.size());
      slice_tool.push_back(slot);
      tool_slices[slot].push_back(sid);
      std::vector<std::string> terms;
      Tokenize(texts[i], &terms);
      slices.Add(sid, terms);
      ids.push_back(sid);
      flat.insert(flat.end(), vecs[i].begin(), vecs[i].end());
    }
    vectors->Add(ids, flat);
    std::vector<std::string> dterms;
    Tokenize(whole.back(), &dterms);
    docs.Add(slot, dterms);
    return absl::OkStatus();
  }

  void RemoveLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    for (uint32_t sid : tool_slices[slot]) {
      slices.Remove(sid);
      vectors->Remove(sid);
    }
    tool_slices[slot].clear();
    docs.Remove(slot);
    by_name.erase(tools[slot].name);
    tools[slot] = ToolRecord{};
    if (slot < tool_ns.size()) tool_ns[slot].clear();
  }
};

ToolCatalogStore::ToolCatalogStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ToolCatalogStore::~ToolCatalogStore() = default;

absl::StatusOr<std::unique_ptr<ToolCatalogStore>> ToolCatalogStore::Open(Storage& storage,
                                                                         CatalogOptions options,
                                                                         Embedder& embedder,
                                                                         Reranker& reranker) {
  auto impl = std::make_unique<Impl>(storage, options, embedder, reranker);
  VectorIndexOptions vo;
  vo.exact_below = 200000;  // slices stay exact: thousands of tools, not millions
  impl->vectors = std::make_unique<VectorIndex>(embedder.dimension(), vo);
  std::vector<ToolRecord> recs;
  RETURN_IF_ERROR(storage.Scan(Cf::kTools, "", "", [&](std::string_view k, std::string_view v) {
    json d = json::parse(v, nullptr, false);
    if (d.is_object() && d.contains("ToolName"))
      recs.push_back({std::string(k), d["ToolName"], std::string(v)});
    return true;
  }));
  std::sort(recs.begin(), recs.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  {
    WriterMutexLock lock(&impl->mu);  // nothing else sees `impl` yet
    for (const auto& r : recs) RETURN_IF_ERROR(impl->AddLocked(r));
  }
  return std::unique_ptr<ToolCatalogStore>(new ToolCatalogStore(std::move(impl)));
}

size_t ToolCatalogStore::size() const {
  ReaderMutexLock lock(&impl_->mu);
  return impl_->by_name.size();
}

namespace {

absl::StatusOr<std::vector<ToolRecord>> ToolRecords(const std::vector<std::string>& tool_json) {
  std::vector<ToolRecord> recs;
  for (size_t i = 0; i < tool_json.size(); ++i) {
    auto d = NormalizeToolJson(tool_json[i]);
    if (!d.ok())
      return absl::InvalidArgumentError(absl::StrCat("tool #", i + 1, ": ", d.status().message()));
    std::string name = json::parse(*d)["ToolName"];
    recs.push_back({ToolUuid(name), name, *d});
  }
  return recs;
}

}  // namespace

absl::Status ToolCatalogStore::Validate(const std::vector<std::string>& tool_json) {
  return ToolRecords(tool_json).status();
}

absl::StatusOr<std::vector<std::string>> ToolCatalogStore::Register(
    const std::vector<std::string>& tool_json) {
  ASSIGN_OR_RETURN(std::vector<ToolRecord> recs, ToolRecords(tool_json));
  MutexLock w(&impl_->writer);
  WriteBatch batch;
  for (const auto& r : recs) batch.Put(Cf::kTools, r.uuid, r.document_json);
  RETURN_IF_ERROR(impl_->storage.Write(batch, /*sync=*/true));
  WriterMutexLock lock(&impl_->mu);
  std::vector<std::string> uuids;
  for (const auto& r : recs) {
    RETURN_IF_ERROR(impl_->AddLocked(r));
    uuids.push_back(r.uuid);
  }
  return uuids;
}

absl::StatusOr<std::vector<ToolRecord>> ToolCatalogStore::List() {
  ReaderMutexLock lock(&impl_->mu);
  std::vector<ToolRecord> out;
  for (const auto& t : impl_->tools) {
    if (!t.uuid.empty()) out.push_back(t);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  return out;
}

absl::Status ToolCatalogStore::Remove(const std::string& name) {
  MutexLock w(&impl_->writer);
  uint32_t slot;
  {
    ReaderMutexLock lock(&impl_->mu);
    auto it = impl_->by_name.find(name);
    if (it == impl_->by_name.end())
      return absl::NotFoundError(absl::StrCat("tool '", name, "' is not in the catalog"));
    slot = it->second;
  }
  RETURN_IF_ERROR(impl_->storage.Delete(Cf::kTools, ToolUuid(name), /*sync=*/true));
  WriterMutexLock lock(&impl_->mu);
  impl_->RemoveLocked(slot);
  return absl::OkStatus();
}

namespace {

// The query as the lexical legs search it: its own terms (weight 1), the
// expansions, and the hypothetical tool's new terms at `hyde_weight`.
struct CatalogQuery {
  std::vector<std::string> terms;  // the query's own
  std::vector<std::pair<std::string, float>> weighted;
  // What the vector leg embeds and the fine stage reads: the query and the
  // hypothetical tool.
  std::string text;
};

CatalogQuery MakeCatalogQuery(const std::string& query, const std::string& hypothetical,
                              const CatalogOptions& o) {
  CatalogQuery cq;
  const std::string words = NameWords(query);
  Tokenize(words, &cq.terms);
  ExpansionWeights ew;
  ew.synonym = static_cast<float>(o.synonym_weight);
  ew.family = static_cast<float>(o.family_weight);
  cq.weighted = WeightedQuery(words, cq.terms, ew);
  cq.text = query;
  if (hypothetical.empty() || o.hyde_weight <= 0) return cq;
  std::set<std::string> seen;
  for (const auto& [t, w] : cq.weighted) seen.insert(t);
  std::vector<std::string> hterms;
  Tokenize(NameWords(hypothetical), &hterms);
  if (hterms.empty()) return cq;  // no words (punctuation only): nothing to add
  for (auto& t : hterms) {
    if (seen.insert(t).second) cq.weighted.emplace_back(std::move(t), o.hyde_weight);
  }
  absl::StrAppend(&cq.text, "\n", hypothetical);
  return cq;
}

using Ranked = std::vector<std::pair<uint32_t, double>>;  // slot, score

void SortByScore(Ranked& r) {
  std::sort(r.begin(), r.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
}

}  // namespace

// The coarse stage: slices (BM25 and vectors, fused) grouped by tool, fused
// with the whole-document ranking when whole_weight > 0; best first.
static Ranked CoarseRank(ToolCatalogStore::Impl& m, const CatalogQuery& cq,
                         const std::vector<float>& qv, CatalogMode mode)
    ABSL_SHARED_LOCKS_REQUIRED(m.mu) {
  const size_t n = static_cast<size_t>(m.options.coarse_slices);
  auto lex = m.slices.Search(cq.weighted, n);
  auto vec = m.vectors->Search(qv.data(), n);
  std::unordered_map<uint32_t, double> fused;
  for (size_t i = 0; i < lex.size(); ++i) fused[lex[i].first] += 1.0 / (m.options.rrf_k + i + 1);
  for (size_t i = 0; i < vec.size(); ++i)
    fused[vec[i].first] += m.options.vector_weight / (m.options.rrf_k + i + 1);
  Ranked slice_order(fused.begin(), fused.end());
  SortByScore(slice_order);
  if (slice_order.size() > n) slice_order.resize(n);
  std::unordered_map<uint32_t, double> group;  // slices grouped by tool
  for (size_t r = 0; r < slice_order.size(); ++r) {
    const double g = m.options.grouping == "rrf" ? 1.0 / (m.options.rrf_k + r + 1) : 1.0 / (r + 1);
    group[m.slice_tool[slice_order[r].first]] += g;
  }
  Ranked ranked(group.begin(), group.end());
  SortByScore(ranked);
  if (m.options.whole_weight > 0 && mode == CatalogMode::kSlicesRerank) {
    std::unordered_map<uint32_t, double> fused_tools;
    for (size_t i = 0; i < ranked.size(); ++i)
      fused_tools[ranked[i].first] += 1.0 / (m.options.rrf_k + i + 1);
    auto whole_hits = m.docs.Search(cq.weighted, n);
    for (size_t i = 0; i < whole_hits.size(); ++i)
      fused_tools[whole_hits[i].first] += m.options.whole_weight / (m.options.rrf_k + i + 1);
    ranked.assign(fused_tools.begin(), fused_tools.end());
    SortByScore(ranked);
  }
  return ranked;
}

// The fine stage over the pool: the reranker scores each candidate's whole
// document (with its whole-document BM25 score and its coarse score), a
// named program's tools raised; reorders `ranked`.
static absl::Status Rerank(ToolCatalogStore::Impl& m, const CatalogQuery& cq,
                           const std::function<bool(uint32_t)>& names_program, Ranked& ranked)
    ABSL_SHARED_LOCKS_REQUIRED(m.mu) {
  std::unordered_map<uint32_t, double> in_pool;
  for (const auto& [slot, s] : ranked) in_pool[slot] = 0;
  auto whole_scores = m.docs.Search(cq.weighted, in_pool.size(),
                                    [&](uint32_t slot) { return in_pool.count(slot) > 0; });
  const double best_whole =
      whole_scores.empty() ? 1.0 : std::max<double>(whole_scores[0].second, 1e-9);
  for (const auto& [slot, sc] : whole_scores) in_pool[slot] = sc / best_whole;
  std::vector<RerankCandidate> cands;
  for (const auto& [slot, s] : ranked) {
    RerankCandidate c;
    c.text = m.whole[slot];
    c.context = NameWords(m.tools[slot].name);
    c.lexical_norm = in_pool[slot];
    c.fused_norm = s;
    cands.push_back(std::move(c));
  }
  ASSIGN_OR_RETURN(auto scores, m.reranker.Score(cq.text, cands));
  // A query that names the program ("with OpenOCD", "in gdb", "on GitHub")
  // prefers that program's tools: the namespace of the ToolName.
  if (m.options.namespace_boost > 0) {
    for (size_t i = 0; i < ranked.size(); ++i) {
      if (names_program(ranked[i].first)) scores[i] *= 1.0 + m.options.namespace_boost;
    }
  }
  for (size_t i = 0; i < ranked.size(); ++i) ranked[i].second = scores[i];
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ToolHitRecord>> ToolCatalogStore::Search(const std::string& query,
                                                                    int top_k, CatalogMode mode) {
  Impl& m = *impl_;
  if (query.find_first_not_of(" \t\r\n") == std::string::npos)
    return absl::InvalidArgumentError("query: empty");
  if (query.size() > 4096) return absl::InvalidArgumentError("query: at most 4096 characters");
  if (top_k < 1 || top_k > 100)
    return absl::InvalidArgumentError(absl::StrCat("top_k: ", top_k, "; expected 1..100"));
  // The hypothetical tool (a model call, cached by its maker): outside locks.
  std::string hypothetical;
  if (mode == CatalogMode::kSlicesRerank && m.options.hyde && m.options.hyde_weight > 0) {
    try {
      hypothetical = std::string(Utf8Prefix(m.options.hyde(query), 4096));
    } catch (const std::exception&) {
      hypothetical.clear();  // the request alone, as when the model fails
    }
  }
  const CatalogQuery cq = MakeCatalogQuery(query, hypothetical, m.options);
  std::vector<float> qv;
  if (mode != CatalogMode::kWholeLexical) {
    ASSIGN_OR_RETURN(auto v, m.embedder.Embed({cq.text}, true));
    qv = std::move(v[0]);
  }
  ReaderMutexLock lock(&m.mu);
  // Programs the query names ("with OpenOCD", "in gdb", "on GitHub").
  std::set<std::string> named_ns;
  for (const auto& w : cq.terms) {
    if (m.all_ns.count(w)) named_ns.insert(w);
  }
  auto names_program = [&](uint32_t slot) ABSL_SHARED_LOCKS_REQUIRED(m.mu) {
    if (slot >= m.tool_ns.size()) return false;
    for (const auto& w : m.tool_ns[slot]) {
      if (named_ns.count(w)) return true;
    }
    return false;
  };
  Ranked ranked;
  if (mode == CatalogMode::kWholeLexical) {
    for (const auto& [slot, s] : m.docs.Search(cq.terms, top_k)) ranked.emplace_back(slot, s);
    const double best = ranked.empty() ? 1.0 : std::max(ranked[0].second, 1e-9);
    for (auto& r : ranked) r.second /= best;
  } else {
    ranked = CoarseRank(m, cq, qv, mode);
    const bool rerank = mode == CatalogMode::kSlicesRerank;
    const size_t keep = rerank ? std::max<size_t>(m.options.candidates, top_k) : top_k;
    if (ranked.size() > keep) ranked.resize(keep);
    if (rerank && m.options.namespace_boost > 0 && !named_ns.empty()) {
      // The best whole-document matches within the named program join the pool.
      std::unordered_set<uint32_t> in_pool;
      for (const auto& r : ranked) in_pool.insert(r.first);
      const double floor = ranked.empty() ? 0.0 : ranked.back().second;
      for (const auto& [slot, sc] :
           m.docs.Search(cq.weighted, 5, [&](uint32_t slot) ABSL_SHARED_LOCKS_REQUIRED(m.mu) {
             return names_program(slot) && !in_pool.count(slot);
           })) {
        ranked.emplace_back(slot, floor);
      }
    }
    const double best = ranked.empty() ? 1.0 : std::max(ranked[0].second, 1e-12);
    for (auto& r : ranked) r.second /= best;
    if (rerank && !ranked.empty()) RETURN_IF_ERROR(Rerank(m, cq, names_program, ranked));
  }
  std::vector<ToolHitRecord> out;
  for (const auto& [slot, s] : ranked) {
    if (static_cast<int>(out.size()) >= top_k) break;
    out.push_back({static_cast<int>(out.size()) + 1, s, m.tools[slot]});
  }
  return out;
}

absl::StatusOr<int> SyncMcpTools(ToolCatalogStore& catalog, const std::set<std::string>& configured,
                                 const std::map<std::string, std::vector<std::string>>& listed) {
  std::set<std::string> keep;
  for (const auto& [server, docs] : listed) {
    if (docs.empty()) continue;
    ASSIGN_OR_RETURN(auto uuids, catalog.Register(docs));
    for (const auto& u : uuids) keep.insert(u);
  }
  ASSIGN_OR_RETURN(auto all, catalog.List());
  int removed = 0;
  for (const auto& t : all) {
    const json d = json::parse(t.document_json, nullptr, false);
    const std::string source = d.is_object() ? d.value("source", "") : "";
    // The daemon's own: source mcp:<server> and an agent tool name
    // (mcp_<server>_<tool>); documents added by hand are left alone.
    if (source.rfind("mcp:", 0) != 0 || t.name.rfind("mcp_", 0) != 0 || keep.count(t.uuid))
      continue;
    const std::string server = source.substr(4);
    if (configured.count(server) && !listed.count(server))
      continue;  // did not answer: keep its tools
    RETURN_IF_ERROR(catalog.Remove(t.name));
    ++removed;
  }
  return removed;
}

}  // namespace fwai
