// catalog: tool documents (RocksDB, by stable uuid) and retrieval over them.
//
// Each tool is cut into an overview slice (name + description) and one slice
// per argument (name + description + enum values), tagged with the tool's
// uuid; only slices are indexed (BM25 + vectors, rebuilt in memory at open).
// Search: top-N slices -> group by uuid (sum of 1/(rank+1), or RRF) -> M
// candidate tools -> rerank the whole documents -> top-K. With a model, the
// query may be widened by a hypothetical tool first (CatalogOptions::hyde).
//
// Thread-safe: writers are serialized; searches run concurrently.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/catalog/tool_document.h"
#include "server/knowledge/reranker.h"

namespace fwai {

class Storage;
class Embedder;
class Reranker;

struct CatalogOptions {
  int coarse_slices = 100;       // N
  int candidates = 30;           // M
  std::string grouping = "sum";  // "sum": sum 1/(rank+1); "rrf": sum 1/(k+rank)
  double rrf_k = 60;
  double vector_weight = 0.1;  // slice legs fused by weighted RRF
  // Coarse stage: the slice groups fused (RRF) with a whole-document BM25
  // ranking of this weight (0: slices only, as in the basic design).
  double whole_weight = 0.0;
  // Query expansion in the slice modes (whole-lexical stays plain).
  double synonym_weight = 0.35;
  double family_weight = 0.8;
  // A query naming a program (a ToolName namespace word: openocd, gdb, git,
  // github ...) adds that program's best matches to the rerank pool and
  // multiplies their reranked scores by 1 + this (0: off).
  double namespace_boost = 0.2;
  // The hypothetical tool (HyDE for tools): for a request that names no
  // command, the tool a model says an engineer would run, with a line of
  // what it does; its words join the query at `hyde_weight` (terms the query
  // has already are not counted twice) in the slice-and-rerank mode, its text
  // the query's vector, and the fine stage reads the query and the
  // hypothetical tool together. Called
  // outside locks, once per search (the maker caches); "" adds nothing.
  // Null or weight 0: off (not called). The weight and reading it in the
  // fine stage were chosen by cross-validation on the tool development set.
  std::function<std::string(const std::string&)> hyde;
  double hyde_weight = 1.0;
};

struct ToolRecord {
  std::string uuid;
  std::string name;
  std::string document_json;  // normalized {ToolName, ToolDescription, Args[]}
};

struct ToolHitRecord {
  int rank = 0;
  double score = 0;
  ToolRecord tool;
};

enum class CatalogMode { kSlicesRerank, kSlices, kWholeLexical };

class ToolCatalogStore {
 public:
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ToolCatalogStore>> Open(
      Storage& storage, CatalogOptions options, Embedder& embedder, Reranker& reranker);
  ~ToolCatalogStore();

  // Accepts {ToolName, ToolDescription, Args}, MCP tool JSON {name,
  // description, inputSchema}, OpenAI {type: function, function: {...}} or
  // {name, description, parameters}, Anthropic {name, description,
  // input_schema}. Registering a name again replaces it (same uuid).
  // INVALID_ARGUMENT names the entry and what is wrong; nothing is stored then.
  [[nodiscard]] absl::StatusOr<std::vector<std::string>> Register(
      const std::vector<std::string>& tool_json);
  // The checks Register makes, registering nothing; errors name "tool #N".
  [[nodiscard]] static absl::Status Validate(const std::vector<std::string>& tool_json);
  [[nodiscard]] absl::StatusOr<std::vector<ToolRecord>> List();
  [[nodiscard]] absl::Status Remove(const std::string& name);
  [[nodiscard]] absl::StatusOr<std::vector<ToolHitRecord>> Search(
      const std::string& query, int top_k, CatalogMode mode = CatalogMode::kSlicesRerank);
  size_t size() const;

  struct Impl;

 private:
  explicit ToolCatalogStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Keeps the catalog's MCP tools (named mcp_<server>_<tool> with source
// "mcp:<server>", as fwaid registers them) true to the servers:
// registers `listed` (server -> its tool documents, for the servers that
// answered now) and removes the tools those servers no longer list and those
// of servers no longer `configured`. A configured server that did not answer
// keeps its tools. Returns how many tools were removed.
[[nodiscard]] absl::StatusOr<int> SyncMcpTools(
    ToolCatalogStore& catalog, const std::set<std::string>& configured,
    const std::map<std::string, std::vector<std::string>>& listed);

// Built-in reranker weights for whole tool documents: the whole-document BM25
// score counts most (measured on the tool development set: MRR@10 0.68 with
// the document weights, 0.73 with these).
RerankWeights ToolCatalogRerankWeights();

// The stable uuid of a tool name (SHA-256 based, UUID text form).
std::string ToolUuid(const std::string& name);

}  // namespace fwai
