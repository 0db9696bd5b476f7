// The retrieval log: every knowledge-base search (query, the rewrites and
// hypothetical answer searched with it, method, top-k, the results with
// their scores, latency, and the turn it served) kept in RocksDB, and the
// corrections made to it: a user marking a result good or bad, the agent
// citing a result or discarding it. Corrections are used: a result marked
// bad for a query is demoted for queries like it, a good one raised.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

class Storage;

// Who asked: "cli" / "api" (a client of the Knowledge service) or "agent"
// (documentSearch in a turn; then the session, turn and tool call).
struct SearchOrigin {
  std::string source;
  std::string session_id, turn_id, call_id;
  std::string owner;  // the principal who asked (a session's owner for the agent)
};

struct LoggedResult {
  int rank = 0;
  double score = 0;
  std::string doc, title_path, chunk_id;
  std::vector<std::string> chunk_ids;  // every chunk the passage draws on
};

struct SearchFeedback {
  std::string search_id;
  int rank = 0;
  std::string chunk_id;
  bool good = false;
  std::string source;  // user | cited | discarded
  std::string note;
  int64_t time_us = 0;
};

struct LoggedSearch {
  std::string id;  // "q<number>"
  int64_t time_us = 0;
  std::string query;
  std::vector<std::string> rewrites;  // variants and the hypothetical answer, as searched
  std::string method;                 // e.g. "hybrid+rerank(builtin)+passages(400)"
  int top_k = 0;
  double took_ms = 0;
  SearchOrigin origin;
  std::vector<LoggedResult> results;
  std::vector<SearchFeedback> feedback;  // filled by List / Get
};

struct RetrievalLogOptions {
  int64_t max_entries = 100000;  // oldest searches are dropped past this (their feedback stays)
  // A correction counts for a query whose terms overlap the corrected
  // query's by at least `min_similarity` (IDF-weighted Jaccard); a bad
  // result's score is multiplied by 1 - weight * similarity, a good one's
  // moved up by weight * similarity / 2 of what it lacks to 1. The agent's
  // own citations and discards count half as much as a person's word.
  double min_similarity = 0.5;
  double weight = 0.8;
};

struct RetrievalLogCounts {
  int64_t searches = 0, good = 0, bad = 0, cited = 0, discarded = 0;
};

class RetrievalLog {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<RetrievalLog>> Open(
      Storage& storage, RetrievalLogOptions options = {});
  ~RetrievalLog();

  // Assigns the search its id and stores it (not synced: a log).
  [[nodiscard]] absl::StatusOr<std::string> Record(LoggedSearch search);
  // Newest first; `before` (an id) pages back; `limit` 1..1000.
  [[nodiscard]] absl::StatusOr<std::vector<LoggedSearch>> List(int limit,
                                                               const std::string& before = "");
  // NOT_FOUND names the id.
  [[nodiscard]] absl::StatusOr<LoggedSearch> Get(const std::string& id);
  // `result`: a rank of that search (1-based) or one of its chunk ids.
  // INVALID_ARGUMENT when the search has no such result; written with sync.
  [[nodiscard]] absl::StatusOr<SearchFeedback> AddFeedback(const std::string& search_id,
                                                           const std::string& result, bool good,
                                                           const std::string& source,
                                                           const std::string& note = "");
  // The score of a candidate whose passage draws on `chunk_ids`, after the
  // corrections made for queries like one with `query_terms` (distinct
  // index terms); `idf` weighs terms.
  double Adjust(double score, const std::vector<std::string>& query_terms,
                const std::vector<std::string>& chunk_ids,
                const std::function<double(const std::string&)>& idf) const;
  bool has_feedback() const;
  RetrievalLogCounts counts() const;

  struct Impl;

 private:
  explicit RetrievalLog(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fwai
