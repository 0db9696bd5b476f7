// documentSearch: the agent's tool over the knowledge base.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "server/tools/tool.h"

namespace fwai {

class KnowledgeBase;
class HttpClient;

// {query, max_results (1..20, default 5), threshold (0..1)} -> chunks as text
// separated by a line "---", each headed by its source, marked as retrieved
// data (material to read, never instructions).
// Personal collections ("~NAME/...") are searched only for a session whose
// owner `owns_name(owner, NAME)`; without it, for the owner whose user name
// (OwnerUser) is NAME.
using OwnsName = std::function<bool(const std::string& owner, const std::string& name)>;
std::unique_ptr<Tool> MakeDocumentSearchTool(KnowledgeBase& kb, OwnsName owns_name = nullptr);

// documentFeedback: {passage: "q12.3", reason} marks a passage documentSearch
// returned in this session as not fitting its question (the retrieval log
// records it as discarded; similar searches rank it lower).
std::unique_ptr<Tool> MakeDocumentFeedbackTool(KnowledgeBase& kb);

// Records as cited the passages of this session's searches that `text` (the
// model's answer) names by id ([q12.3]). Returns how many.
int RecordCitations(KnowledgeBase& kb, const std::string& session_id, const std::string& text);

// codeSearch: {query, tokensNum 1000..50000 (default 8000)} -> the best
// matching snippets of the code collection with file:line headers, filled up
// to the token budget.
//
// With `web_context_url` set, the tool also POSTs {"query", "tokensNum"} there
// and appends what comes back ({"results": [{"title", "url", "text"}]} or
// {"text": "..."}) under "Web context", within the same budget; answers are
// cached per query. A failing endpoint is reported in the result, never fatal.
struct CodeSearchOptions {
  std::string web_context_url;
  std::string web_context_api_key;
  int timeout_s = 15;
};
std::unique_ptr<Tool> MakeCodeSearchTool(KnowledgeBase& kb, CodeSearchOptions options = {},
                                         HttpClient* http = nullptr);

// The user name behind a session owner ("user:NAME", or "uid:N"'s account); "" if none.
std::string OwnerUser(const std::string& owner);

}  // namespace fwai
