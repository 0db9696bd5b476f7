// knowledge: documents and their chunks (RocksDB, the record of truth), the
// lexical (BM25) and vector (FAISS) indexes derived from them, and hybrid
// search with reranking.
//
// Each document is ingested atomically: one synced RocksDB batch holds the
// document, all its chunks (text, metadata, vector) and the new generation.
// Indexes are saved atomically with that generation; at open a missing,
// stale or damaged index is rebuilt from RocksDB.
//
// Thread-safe: ingests are serialized; searches run concurrently.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/knowledge/chunker.h"
#include "server/knowledge/retrieval_log.h"

namespace fwai {

class Storage;
class Embedder;
class Reranker;

struct KnowledgeOptions {
  ChunkOptions chunking;
  int64_t max_document_bytes = 50ll << 20;
  float bm25_k1 = 1.2f;
  float bm25_b = 0.75f;
  // Weighted reciprocal rank fusion: w / (k + rank). Chosen by measurement on
  // the development set: the built-in embedder adds little, so its leg is
  // light; the named-documents leg only feeds the rerank pool.
  double rrf_k = 60;
  double lexical_weight = 1.0;
  double vector_weight = 0.1;
  double doc_weight = 0.0;       // the leg of chunks from documents the query names
  double doc_text_weight = 0.5;  // the leg of chunks from documents whose whole text matches best
  int doc_text_candidates = 10;
  double doc_text_b = 0.3;  // BM25 length normalization at document level
  // Query expansion on the lexical legs (synonyms, part-number families).
  double synonym_weight = 0.35;
  double family_weight = 0.8;
  int doc_candidates = 5;
  int chunks_per_doc = 10;
  int candidates = 100;  // per leg
  int rerank_top = 100;
  size_t exact_below = 20000;  // vectors; approximate above
  // The approximate vector index: "ivf" (IVF, 8-bit scalar quantized; the
  // default: measured at a million chunks it builds in minutes and holds a
  // quarter of HNSW's memory) or "hnsw".
  std::string vector_index = "ivf";
  int ivf_lists = 0;                      // 0: about 4 * sqrt(n)
  int ivf_nprobe = 0;                     // 0: chosen for recall@10 >= 0.95
  double ivf_max_probe_share = 1.0 / 32;  // the chosen nprobe's cap (share of the lists)
  // An approximate index (IVF or HNSW) whose breadth, chosen within its cap,
  // reaches a recall@10 below this against exact search on its sample is
  // not kept: vector search is off (logged, shown by Stats) and searches
  // use the lexical legs alone, until the collection has grown fourfold and
  // a new build measures again. The built-in embedder's hashed vectors have
  // little cluster structure (recall 0.36-0.42 at a million chunks within
  // the cap), so the cost buys little there; a model embedder keeps its
  // index (the daemon passes 0 for `embedder: openai`). 0: keep any index.
  double vector_min_recall = 0.9;
  int hnsw_m = 32;
  int hnsw_ef_construction = 80;
  int hnsw_ef_search = 0;  // 0: chosen by measured recall
  // Query rewriting: given a short or vague query, up to 3 variants to search
  // as well (null: off). Called outside locks; may be slow (an LLM call).
  std::function<std::vector<std::string>(const std::string&)> rewrite;
  double variant_weight = 0.5;  // RRF weight of each variant's legs
  // Hypothetical answer (HyDE): for a question asked in other words than a
  // document's, a passage the model writes as an answer; its terms and
  // vector are searched as one more variant (null: off).
  std::function<std::string(const std::string&)> hyde;
  double hyde_weight = 0.5;
  int save_debounce_ms = 2000;
  // Passages: the best `passage_pool` reranked chunks are widened into
  // passages and ranked again by stage 1's score plus these weights times
  // the passage's query coverage and its best sentence's (0 weights: stage
  // 1's order). Chosen by cross-validation on the development set.
  int passage_tokens = 512;  // what a request that does not say gets
  int passage_pool = 30;
  double passage_coverage_weight = 0.0;
  double passage_sentence_weight = 0.0;
  // A hit on a heading or a lead-in line ("To flash the target:") grows
  // forward through its section (PassageGrowth::kForwardFromLeadIn).
  bool passage_forward = false;
  // Within-document ranking (stage 2): at weight w a passage's score moves
  // toward its document's best passage score, scaled by how much of the
  // query (with expansions) the passage and its best sentence cover:
  // (1 - w) s + w best(doc) (0.8 + 0.1 coverage + 0.1 best sentence). So
  // the document-level signal orders the documents and, within one, the
  // passage that covers the question leads. 0: off.
  double passage_within_doc = 0.0;
  // Window evidence (windows.h): the top `window_docs` documents of the
  // ranking cut into 300-word windows scored by BM25; the passages
  // overlapping the best windows (grown around a window no passage
  // overlaps) are fused into the ranking by weighted reciprocal rank
  // (weight `window_weight`, constant `window_k`). For questions without an
  // identifier unless `window_identifiers`. Off by default until its
  // settings are cross-validated (fwai_tune_retrieval --stages windows).
  bool windows = false;
  int window_docs = 3;
  double window_weight = 0.8;
  double window_k = 10;
  bool window_identifiers = false;
  // With a model reranker (HTTP service or the chat model): the built-in
  // reranker orders the chunks (stage 1) and `reranker` orders the
  // passages (stage 2). Null: `reranker` does stage 1.
  Reranker* first_stage_reranker = nullptr;
  // The retrieval log and how its corrections weigh.
  RetrievalLogOptions log;
  // A document's chunk records are stored in unsynced writes of about this
  // many bytes each before the one synced write that makes the document
  // exist (its record, the old version's removal, the counters); 0: all in
  // one write. A session's event append queued meanwhile waits for one
  // slice, not for the whole document.
  int64_t commit_slice_bytes = 64 << 10;
  // Tests: called after each slice of chunk records is written; an error
  // ends the ingest there, as a crash would.
  std::function<absl::Status(int slice)> after_slice_for_test;
  // Tests: called by a save after it copied what it writes and released the
  // index lock, before it writes the files.
  std::function<void()> while_saving_for_test;
  // Tests: called on the training thread when a document's update made a
  // build of the vector index due, before the build (no index lock held).
  std::function<void()> while_building_vectors_for_test;
};

struct IngestRequest {
  std::string name;        // shown in results; relative path for files
  std::string collection;  // default "default"
  std::map<std::string, std::string> tags;
  std::string kind;  // "" | "doc" | "code"
  std::string bytes;
  int64_t modified_us = 0;
};

struct IngestResult {
  std::string doc_id;
  int chunks = 0;
  int pages = 0;
  bool unchanged = false;
  std::string replaced_doc_id;  // a previous version that was replaced
  std::string duplicate_of;     // same content already stored under this name
  // Where the update of the in-memory indexes went, in ms: waiting for the
  // index lock, removing a replaced version, the lexical index, the vector
  // index, the document tables.
  double lock_ms = 0, remove_ms = 0, lexical_ms = 0, vectors_ms = 0, tables_ms = 0;
};

struct DocumentInfo {
  std::string id, name, collection, format, title, content_hash, kind;
  std::map<std::string, std::string> tags;
  int64_t bytes = 0, indexed_us = 0, modified_us = 0;
  int chunks = 0, pages = 0;
};

enum class SearchMode { kHybrid, kLexical, kVector };

// Per-request overrides of the fusion settings (tuning and evaluation).
struct FusionOverrides {
  double lexical_weight = -1, vector_weight = -1, doc_weight = -1, rrf_k = -1, doc_text_weight = -1;
  // Passage stage (negative: the options').
  double passage_coverage_weight = -1, passage_sentence_weight = -1;
  int passage_pool = -1;
  int passage_forward = -1;  // 0 / 1
  double passage_within_doc = -1;
  int window_docs = -1, window_identifiers = -1;  // 0 docs: off, more: on; 0 / 1
  double window_weight = -1, window_k = -1;
};

struct KbSearchRequest {
  std::string query;
  int max_results = 10;
  double threshold = 0;
  std::string collection;  // "" = all
  // When set, only documents of collections it accepts (others' personal ones are hidden).
  std::function<bool(const std::string& collection)> collection_visible;
  std::vector<std::string> docs;  // names or ids
  std::vector<std::string> content_types;
  std::map<std::string, std::string> tags;
  bool rerank = true;
  SearchMode mode = SearchMode::kHybrid;
  const FusionOverrides* overrides = nullptr;
  // Tuning: this reranker instead of the configured one (not owned).
  Reranker* reranker = nullptr;
  bool allow_rewrite = true;
  // Passage budget in tokens (1..512): each hit is its chunk widened within
  // its section up to this size. 0: chunks as stored; -1: the options'.
  int passage_tokens = -1;
  // Tuning: every fused candidate widened into its passage, in fused order,
  // neither reranked nor merged (max_results does not apply).
  bool all_candidates = false;
  // Recorded in the retrieval log (with who asked), unless `log` is false.
  bool log = true;
  SearchOrigin origin;
};

// What else a search did: its id in the retrieval log, the rewritten
// queries and hypothetical answer it searched too.
struct KbSearchInfo {
  std::string search_id;
  std::vector<std::string> rewrites;
  double took_ms = 0;
  // Where the time went, in the order the stages ran: "query" (embedding,
  // tokens), "model" (rewrites, hypothetical answer), "lock" (waiting for
  // the indexes), "legs" (lexical and vector), "document views", "fusion",
  // "fetch" (the pool's records read), "rerank", then "results" (chunks) or
  // "passages", "rescore", "window evidence" and "merge". Milliseconds.
  std::vector<std::pair<std::string, double>> stages_ms;
};

struct KbSearchHit {
  int rank = 0;
  double score = 0;
  // `text` is the passage; `chunk_id` the chunk it grew from, `chunk_ids`
  // every chunk it draws on (hits whose chunks it covers were merged in).
  std::string doc, doc_id, title_path, content_type, text, chunk_id;
  std::vector<std::string> chunk_ids;
  int page = 0, end_page = 0, start_line = 0, end_line = 0, tokens = 0;
  // The best-matching lines or sentences: [begin, end) byte ranges of `text`.
  std::vector<std::pair<int, int>> highlights;
  double coverage = 0, best_sentence = 0, first_stage_score = 0;
  // The passage's span in document coordinates (chunk index, offset in the
  // chunk's own text), [begin, end).
  uint32_t begin_chunk = 0, begin_offset = 0, end_chunk = 0, end_offset = 0;
  std::string chunk_text;  // with all_candidates: the chunk the passage grew from
  std::string search_id;   // the search's id in the retrieval log ("" when not logged)
  // Signals behind the score (for tuning and explanation).
  std::string context;
  double fused_norm = 0, lexical_norm = 0, vector_sim = 0, doc_match = 0, doc_text = 0, named = 0;
};

struct KbStats {
  int64_t documents = 0, chunks = 0, bytes = 0;
  RetrievalLogCounts log;
  std::vector<std::string> index_kinds;
  std::string embedder;
  int dimension = 0;
};

class KnowledgeBase {
 public:
  // `index_dir` holds the derived index files. `embedder` and `reranker`
  // must outlive the knowledge base.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<KnowledgeBase>> Open(
      Storage& storage, const std::string& index_dir, KnowledgeOptions options, Embedder& embedder,
      Reranker& reranker);
  ~KnowledgeBase();

  // INVALID_ARGUMENT names the document and the reason (too big, binary,
  // encrypted PDF, ...). `progress` gets stage names as work proceeds.
  [[nodiscard]] absl::StatusOr<IngestResult> Ingest(
      IngestRequest request,
      const std::function<void(const std::string& stage)>& progress = nullptr);
  [[nodiscard]] absl::StatusOr<std::vector<DocumentInfo>> List(const std::string& collection);
  // By id or name (within `collection` when given). Returns chunks removed.
  [[nodiscard]] absl::StatusOr<int> Delete(const std::string& doc, const std::string& collection);
  [[nodiscard]] absl::StatusOr<std::vector<KbSearchHit>> Search(const KbSearchRequest& request,
                                                                KbSearchInfo* info = nullptr);
  // The searches and their corrections.
  RetrievalLog& retrieval_log();
  [[nodiscard]] absl::StatusOr<KbStats> Stats(const std::string& collection);

  // Writes the indexes if they changed since the last save.
  [[nodiscard]] absl::Status SaveIndexes();
  // How the indexes were obtained at open: "loaded" or "rebuilt: <why>".
  const std::string& open_report() const;

  struct Impl;

 private:
  explicit KnowledgeBase(std::unique_ptr<Impl> impl);
  absl::StatusOr<std::vector<KbSearchHit>> SearchImpl(const KbSearchRequest& request,
                                                      KbSearchInfo* info);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fwai
