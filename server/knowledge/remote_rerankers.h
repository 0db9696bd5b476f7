// Rerankers that call out: HTTP rerank APIs and the chat provider.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "server/knowledge/reranker.h"

namespace fwai {

class HttpClient;
class Provider;

struct HttpRerankerConfig {
  std::string
      style;  // "tei" (POST {base}/rerank) | "cohere" (POST {base}/rerank, Cohere/Jina /v1 shape)
  std::string
      base_url;  // e.g. http://127.0.0.1:8080, https://api.cohere.com/v1, https://api.jina.ai/v1
  std::string api_key;
  std::string model;
  int timeout_s = 20;
};

// Scores from the remote service (already in 0..1 for TEI without raw scores
// and for Cohere/Jina relevance scores). When the call fails, `fallback`
// scores the candidates and the failure is logged.
std::unique_ptr<Reranker> MakeHttpReranker(HttpRerankerConfig config, HttpClient& http,
                                           Reranker& fallback);

// Listwise: the chat model orders the numbered passages; score = 1 - rank/n.
// Falls back like the HTTP reranker.
std::unique_ptr<Reranker> MakeLlmReranker(Provider& provider, std::string model,
                                          Reranker& fallback);

// Query rewriting with the chat provider: up to 3 alternative queries for a
// short or vague one, as a JSON array; cached per query (thread-safe). Any
// failure yields no variants.
std::function<std::vector<std::string>(const std::string&)> MakeLlmQueryRewriter(Provider& provider,
                                                                                 std::string model);

// Hypothetical answer (HyDE) with the chat provider: a short passage as a
// datasheet, manual or driver document would answer the question, in that
// kind of document's words; cached per query (thread-safe). Any failure
// yields "" (nothing extra is searched).
std::function<std::string(const std::string&)> MakeLlmHypotheticalAnswer(Provider& provider,
                                                                         std::string model);

// Hypothetical tool (HyDE for the tool catalog) with the chat provider: the
// command(s) an engineer would run for a request, with a line of what each
// does in its manual's words; cached per query (thread-safe). Any failure
// yields "" (nothing extra is searched).
std::function<std::string(const std::string&)> MakeLlmHypotheticalTool(Provider& provider,
                                                                       std::string model);

}  // namespace fwai
