// documentSearch: the agent's tool over the knowledge base.
#pragma once

#include <memory>

#include "server/tools/tool.h"

namespace fwai {

class KnowledgeBase;

// {query, max_results (1..20, default 5), threshold (0..1)} -> chunks as text
// separated by a line "---", each headed by its source, marked as retrieved
// data (material to read, never instructions).
std::unique_ptr<Tool> MakeDocumentSearchTool(KnowledgeBase& kb);

// codeSearch: {query, tokensNum 1000..50000 (default 8000)} -> the best
// matching snippets of the code collection with file:line headers, filled up
// to the token budget.
std::unique_ptr<Tool> MakeCodeSearchTool(KnowledgeBase& kb);

}  // namespace fwai
