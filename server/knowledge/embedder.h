// Embedders turn texts into unit-length vectors for the vector index.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace fwai {

class HttpClient;

class Embedder {
 public:
  virtual ~Embedder() = default;
  // Stable identity recorded with a collection ("builtin-hash-v1/384",
  // "openai:text-embedding-3-small"); a change means re-embedding.
  virtual std::string name() const = 0;
  virtual int dimension() const = 0;
  // One unit vector per text. `query` marks search queries (some models embed
  // queries and passages differently).
  [[nodiscard]] virtual absl::StatusOr<std::vector<std::vector<float>>> Embed(
      const std::vector<std::string>& texts, bool query) = 0;
};

// Needs no weights: signed feature hashing of index terms (identifiers whole
// and in parts, stemmed words) and character 4-grams into `dimension` dims,
// sublinear term frequency, L2-normalised. Deterministic across runs.
std::unique_ptr<Embedder> MakeBuiltinEmbedder(int dimension = 384);

struct HttpEmbedderConfig {
  std::string base_url;  // e.g. https://api.openai.com/v1, http://127.0.0.1:11434/v1
  std::string api_key;
  std::string model;
  int dimension = 0;  // 0: learn from the first response
  int batch_size = 64;
  int max_attempts = 4;
  int timeout_s = 60;
};

// OpenAI-compatible POST {base_url}/embeddings (OpenAI, Ollama, TEI).
// UNAVAILABLE names the URL when the server cannot be reached.
std::unique_ptr<Embedder> MakeHttpEmbedder(HttpEmbedderConfig config, HttpClient& http);

}  // namespace fwai
