#include "server/knowledge/retrieval_log.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <nlohmann/json.hpp>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "server/knowledge/tokenizer.h"
#include "server/storage/storage.h"

namespace fwai {

using json = nlohmann::json;

namespace {

// Keys in the retrieval column family: "s" + 8-byte big-endian search
// number -> the search; "f" + search number + 4-byte feedback number -> a
// correction.
std::string SearchKey(uint64_t n) { return "s" + EncodeU64(n); }
std::string FeedbackKey(uint64_t n, uint32_t k) {
  return "f" + EncodeU64(n) + EncodeU64(k).substr(4);
}

absl::StatusOr<uint64_t> ParseId(const std::string& id) {
  uint64_t n = 0;
  if (id.size() < 2 || id[0] != 'q' || !absl::SimpleAtoi(id.substr(1), &n) || n == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("search id '", id, "': expected q<number> as `fwai kb log` shows it"));
  }
  return n;
}

json ToJson(const LoggedSearch& s) {
  json results = json::array();
  for (const auto& r : s.results) {
    results.push_back({{"rank", r.rank},
                       {"score", r.score},
                       {"doc", r.doc},
                       {"title_path", r.title_path},
                       {"chunk_id", r.chunk_id},
                       {"chunk_ids", r.chunk_ids}});
  }
  return {{"id", s.id},
          {"time_us", s.time_us},
          {"query", s.query},
          {"rewrites", s.rewrites},
          {"method", s.method},
          {"top_k", s.top_k},
          {"took_ms", s.took_ms},
          {"origin",
           {{"source", s.origin.source},
            {"session_id", s.origin.session_id},
            {"turn_id", s.origin.turn_id},
            {"call_id", s.origin.call_id},
            {"owner", s.origin.owner}}},
          {"results", results}};
}

LoggedSearch FromJson(const json& j) {
  LoggedSearch s;
  s.id = j.value("id", "");
  s.time_us = j.value("time_us", int64_t{0});
  s.query = j.value("query", "");
  s.rewrites = j.value("rewrites", std::vector<std::string>{});
  s.method = j.value("method", "");
  s.top_k = j.value("top_k", 0);
  s.took_ms = j.value("took_ms", 0.0);
  if (j.contains("origin") && j["origin"].is_object()) {
    const json& o = j["origin"];
    s.origin = {o.value("source", ""), o.value("session_id", ""), o.value("turn_id", ""),
                o.value("call_id", ""), o.value("owner", "")};
  }
  if (j.contains("results") && j["results"].is_array()) {
    for (const auto& r : j["results"]) {
      s.results.push_back({r.value("rank", 0), r.value("score", 0.0), r.value("doc", ""),
                           r.value("title_path", ""), r.value("chunk_id", ""),
                           r.value("chunk_ids", std::vector<std::string>{})});
    }
  }
  return s;
}

json ToJson(const SearchFeedback& f, const std::string& query,
            const std::vector<std::string>& chunk_ids) {
  return {{"search_id", f.search_id}, {"rank", f.rank},     {"chunk_id", f.chunk_id},
          {"good", f.good},           {"source", f.source}, {"note", f.note},
          {"time_us", f.time_us},     {"query", query},     {"chunk_ids", chunk_ids}};
}

std::vector<std::string> DistinctTerms(const std::string& text) {
  std::vector<std::string> t;
  Tokenize(text, &t);
  std::sort(t.begin(), t.end());
  t.erase(std::unique(t.begin(), t.end()), t.end());
  return t;
}

}  // namespace

struct RetrievalLog::Impl {
  Storage& storage;
  RetrievalLogOptions options;
  std::atomic<uint64_t> next{1};
  mutable Mutex mu;  // guards the corrections and the counts
  struct Correction {
    std::vector<std::string> terms;  // of the corrected query, sorted
    std::set<std::string> chunks;
    bool good;
    double weight;  // a person's word 1, the agent's 0.5
  };
  std::vector<Correction> corrections ABSL_GUARDED_BY(mu);
  RetrievalLogCounts counts ABSL_GUARDED_BY(mu);

  Impl(Storage& s, RetrievalLogOptions o) : storage(s), options(o) {}

  static void Count(RetrievalLogCounts& counts, const SearchFeedback& f) {
    if (f.source == "cited") {
      ++counts.cited;
    } else if (f.source == "discarded") {
      ++counts.discarded;
    } else if (f.good) {
      ++counts.good;
    } else {
      ++counts.bad;
    }
  }
};

RetrievalLog::RetrievalLog(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RetrievalLog::~RetrievalLog() = default;

absl::StatusOr<std::unique_ptr<RetrievalLog>> RetrievalLog::Open(Storage& storage,
                                                                 RetrievalLogOptions options) {
  auto impl = std::make_unique<Impl>(storage, options);
  ASSIGN_OR_RETURN(auto last, storage.LastKey(Cf::kRetrieval, "s", "t"));
  if (last && last->size() == 9) impl->next = DecodeU64(last->substr(1)) + 1;
  // Read into locals, then handed over under the lock (nothing else sees
  // `impl` yet).
  RetrievalLogCounts counts;
  std::vector<Impl::Correction> corrections;
  counts.searches = static_cast<int64_t>(impl->next.load() - 1);
  absl::Status bad;
  RETURN_IF_ERROR(storage.Scan(Cf::kRetrieval, "f", "g", [&](std::string_view, std::string_view v) {
    json j = json::parse(v, nullptr, false);
    if (!j.is_object()) {
      bad = absl::DataLossError("damaged feedback record");
      return true;
    }
    SearchFeedback f;
    f.good = j.value("good", false);
    f.source = j.value("source", "user");
    Impl::Count(counts, f);
    std::vector<std::string> chunks = j.value("chunk_ids", std::vector<std::string>{});
    if (chunks.empty()) chunks.push_back(j.value("chunk_id", ""));
    corrections.push_back({DistinctTerms(j.value("query", "")),
                           std::set<std::string>(chunks.begin(), chunks.end()), f.good,
                           f.source == "user" ? 1.0 : 0.5});
    return true;
  }));
  if (!bad.ok()) spdlog::warn("retrieval log: {}", bad.ToString());
  {
    MutexLock lock(&impl->mu);
    impl->counts = counts;
    impl->corrections = std::move(corrections);
  }
  return std::unique_ptr<RetrievalLog>(new RetrievalLog(std::move(impl)));
}

absl::StatusOr<std::string> RetrievalLog::Record(LoggedSearch search) {
  Impl& m = *impl_;
  const uint64_t n = m.next.fetch_add(1);
  search.id = absl::StrCat("q", n);
  if (search.time_us == 0) search.time_us = NowMicros();
  WriteBatch batch;
  batch.Put(Cf::kRetrieval, SearchKey(n), ToJson(search).dump());
  // Past the cap, the oldest searches go (in steps, not on every write).
  const uint64_t cap = static_cast<uint64_t>(std::max<int64_t>(1, m.options.max_entries));
  if (n > cap && n % 256 == 0)
    batch.DeleteRange(Cf::kRetrieval, SearchKey(0), SearchKey(n - cap + 1));
  RETURN_IF_ERROR(m.storage.Write(batch, /*sync=*/false));
  {
    MutexLock lock(&m.mu);
    ++m.counts.searches;
  }
  return search.id;
}

absl::StatusOr<LoggedSearch> RetrievalLog::Get(const std::string& id) {
  ASSIGN_OR_RETURN(uint64_t n, ParseId(id));
  ASSIGN_OR_RETURN(auto raw, impl_->storage.Get(Cf::kRetrieval, SearchKey(n)));
  if (!raw) return absl::NotFoundError(absl::StrCat("search ", id, " is not in the retrieval log"));
  json j = json::parse(*raw, nullptr, false);
  if (!j.is_object())
    return absl::DataLossError(absl::StrCat("search ", id, ": damaged log record"));
  LoggedSearch s = FromJson(j);
  RETURN_IF_ERROR(impl_->storage.Scan(Cf::kRetrieval, "f" + EncodeU64(n), "f" + EncodeU64(n + 1),
                                      [&](std::string_view, std::string_view v) {
                                        json f = json::parse(v, nullptr, false);
                                        if (f.is_object()) {
                                          s.feedback.push_back(
                                              {f.value("search_id", ""), f.value("rank", 0),
                                               f.value("chunk_id", ""), f.value("good", false),
                                               f.value("source", ""), f.value("note", ""),
                                               f.value("time_us", int64_t{0})});
                                        }
                                        return true;
                                      }));
  return s;
}

absl::StatusOr<std::vector<LoggedSearch>> RetrievalLog::List(int limit, const std::string& before) {
  if (limit < 1 || limit > 1000)
    return absl::InvalidArgumentError(absl::StrCat("limit: ", limit, "; expected 1..1000"));
  uint64_t end = impl_->next.load();
  if (!before.empty()) {
    ASSIGN_OR_RETURN(end, ParseId(before));
  }
  std::vector<LoggedSearch> out;
  // Newest first: walk back from `end` (ids are dense; trimmed ones are skipped).
  while (end > 1 && static_cast<int>(out.size()) < limit) {
    ASSIGN_OR_RETURN(auto last,
                     impl_->storage.LastKey(Cf::kRetrieval, SearchKey(0), SearchKey(end)));
    if (!last || last->size() != 9 || (*last)[0] != 's') break;
    const uint64_t n = DecodeU64(last->substr(1));
    auto s = Get(absl::StrCat("q", n));
    if (s.ok()) out.push_back(*std::move(s));
    end = n;
  }
  return out;
}

absl::StatusOr<SearchFeedback> RetrievalLog::AddFeedback(const std::string& search_id,
                                                         const std::string& result, bool good,
                                                         const std::string& source,
                                                         const std::string& note) {
  Impl& m = *impl_;
  if (source != "user" && source != "cited" && source != "discarded") {
    return absl::InvalidArgumentError(
        absl::StrCat("source '", source, "': expected user, cited or discarded"));
  }
  ASSIGN_OR_RETURN(LoggedSearch s, Get(search_id));
  const LoggedResult* hit = nullptr;
  int rank = 0;
  if (absl::SimpleAtoi(result, &rank)) {
    for (const auto& r : s.results) {
      if (r.rank == rank) hit = &r;
    }
  } else {
    for (const auto& r : s.results) {
      if (r.chunk_id == result || std::count(r.chunk_ids.begin(), r.chunk_ids.end(), result))
        hit = &r;
    }
  }
  if (hit == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("search ", search_id, " has no result '", result, "' (it has ",
                     s.results.size(), "; give a rank 1..", s.results.size(), " or a chunk id)"));
  }
  SearchFeedback f{search_id, hit->rank, hit->chunk_id, good, source, note, NowMicros()};
  std::vector<std::string> chunks = hit->chunk_ids;
  if (chunks.empty()) chunks.push_back(hit->chunk_id);
  const uint64_t n = *ParseId(search_id);
  RETURN_IF_ERROR(m.storage.Put(Cf::kRetrieval,
                                FeedbackKey(n, static_cast<uint32_t>(s.feedback.size())),
                                ToJson(f, s.query, chunks).dump(), /*sync=*/true));
  MutexLock lock(&m.mu);
  Impl::Count(m.counts, f);
  m.corrections.push_back({DistinctTerms(s.query),
                           std::set<std::string>(chunks.begin(), chunks.end()), good,
                           source == "user" ? 1.0 : 0.5});
  return f;
}

double RetrievalLog::Adjust(double score, const std::vector<std::string>& query_terms,
                            const std::vector<std::string>& chunk_ids,
                            const std::function<double(const std::string&)>& idf) const {
  const Impl& m = *impl_;
  MutexLock lock(&m.mu);
  if (m.corrections.empty()) return score;
  std::vector<std::string> q = query_terms;
  std::sort(q.begin(), q.end());
  q.erase(std::unique(q.begin(), q.end()), q.end());
  for (const auto& c : m.corrections) {
    bool touches = false;
    for (const auto& id : chunk_ids) touches = touches || c.chunks.count(id) > 0;
    if (!touches) continue;
    // IDF-weighted Jaccard of the two queries' terms.
    double both = 0, either = 0;
    size_t i = 0, j = 0;
    while (i < q.size() || j < c.terms.size()) {
      if (j >= c.terms.size() || (i < q.size() && q[i] < c.terms[j])) {
        either += idf(q[i++]);
      } else if (i >= q.size() || c.terms[j] < q[i]) {
        either += idf(c.terms[j++]);
      } else {
        const double w = idf(q[i]);
        both += w;
        either += w;
        ++i;
        ++j;
      }
    }
    const double sim = either > 0 ? both / either : 0;
    if (sim < m.options.min_similarity) continue;
    const double strength = m.options.weight * sim * c.weight;
    score = c.good ? score + (1 - score) * strength / 2 : score * (1 - strength);
  }
  return score;
}

bool RetrievalLog::has_feedback() const {
  MutexLock lock(&impl_->mu);
  return !impl_->corrections.empty();
}

RetrievalLogCounts RetrievalLog::counts() const {
  MutexLock lock(&impl_->mu);
  return impl_->counts;
}

}  // namespace fwai
