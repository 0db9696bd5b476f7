#include "server/knowledge/embedder.h"

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "server/knowledge/tokenizer.h"
#include "server/llm/http_client.h"

namespace fwai {
namespace {

uint64_t Hash64(std::string_view s, uint64_t seed) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

class BuiltinEmbedder final : public Embedder {
 public:
  explicit BuiltinEmbedder(int dim) : dim_(dim) {}
  std::string name() const override { return absl::StrCat("builtin-hash-v1/", dim_); }
  int dimension() const override { return dim_; }

  absl::StatusOr<std::vector<std::vector<float>>> Embed(const std::vector<std::string>& texts,
                                                        bool) override {
    std::vector<std::vector<float>> out;
    out.reserve(texts.size());
    std::vector<std::string> terms;
    std::unordered_map<std::string, float> tf;
    for (const auto& t : texts) {
      terms.clear();
      tf.clear();
      Tokenize(t, &terms);
      for (const auto& term : terms) {
        tf[term] += 1.0f;
        // Character 4-grams of longer terms tie together spelling variants
        // (MODER / GPIOx_MODER, interrupt / interrupts).
        if (term.size() >= 5) {
          std::string padded = "^" + term + "$";
          for (size_t i = 0; i + 4 <= padded.size(); ++i) tf["#" + padded.substr(i, 4)] += 0.25f;
        }
      }
      std::vector<float> v(dim_, 0.0f);
      for (const auto& [feature, count] : tf) {
        const uint64_t h = Hash64(feature, 0x9e3779b97f4a7c15ull);
        const float w = (1.0f + std::log(count)) * (feature[0] == '#' ? 0.5f : 1.0f);
        const int a = static_cast<int>(h % dim_);
        const int b = static_cast<int>((h >> 32) % dim_);
        v[a] += (h & (1ull << 20)) ? w : -w;
        v[b] += (h & (1ull << 21)) ? 0.5f * w : -0.5f * w;
      }
      double norm = 0;
      for (float x : v) norm += double(x) * x;
      if (norm > 0) {
        const float inv = static_cast<float>(1.0 / std::sqrt(norm));
        for (float& x : v) x *= inv;
      }
      out.push_back(std::move(v));
    }
    return out;
  }

 private:
  const int dim_;
};

class HttpEmbedder final : public Embedder {
 public:
  HttpEmbedder(HttpEmbedderConfig c, HttpClient& http) : c_(std::move(c)), http_(http) {
    while (!c_.base_url.empty() && c_.base_url.back() == '/') c_.base_url.pop_back();
  }
  std::string name() const override { return absl::StrCat("openai-compatible:", c_.model); }
  int dimension() const override { return c_.dimension; }

  absl::StatusOr<std::vector<std::vector<float>>> Embed(const std::vector<std::string>& texts,
                                                        bool) override {
    std::vector<std::vector<float>> out;
    for (size_t i = 0; i < texts.size(); i += c_.batch_size) {
      std::vector<std::string> batch(texts.begin() + i,
                                     texts.begin() + std::min(texts.size(), i + c_.batch_size));
      auto vecs = EmbedBatch(batch);
      if (!vecs.ok()) return vecs.status();
      for (auto& v : *vecs) out.push_back(std::move(v));
    }
    return out;
  }

 private:
  absl::StatusOr<std::vector<std::vector<float>>> EmbedBatch(
      const std::vector<std::string>& batch) {
    HttpRequest req;
    req.url = c_.base_url + "/embeddings";
    req.headers = {"Content-Type: application/json"};
    if (!c_.api_key.empty()) req.headers.push_back("Authorization: Bearer " + c_.api_key);
    req.body = nlohmann::json({{"model", c_.model}, {"input", batch}}).dump();
    req.idle_timeout_s = c_.timeout_s;
    absl::Status last;
    for (int attempt = 1; attempt <= c_.max_attempts; ++attempt) {
      std::string body;
      CancelToken never;
      auto resp = http_.PostStream(
          req, [&](std::string_view d) { body.append(d); }, never, nullptr);
      if (!resp.ok()) {
        last = absl::UnavailableError(
            absl::StrCat("embeddings at ", req.url, ": ", resp.status().message()));
      } else if (resp->status >= 200 && resp->status < 300) {
        return Parse(body, batch.size());
      } else {
        last = absl::UnavailableError(absl::StrCat("embeddings at ", req.url, ": HTTP ",
                                                   resp->status, ": ", resp->body.substr(0, 300)));
        if (resp->status != 429 && resp->status < 500)
          return absl::InvalidArgumentError(last.message());
      }
      if (attempt < c_.max_attempts)
        std::this_thread::sleep_for(std::chrono::milliseconds(200 << attempt));
    }
    return last;
  }

  absl::StatusOr<std::vector<std::vector<float>>> Parse(const std::string& body, size_t n) {
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (!j.is_object() || !j.contains("data") || !j["data"].is_array() || j["data"].size() != n) {
      return absl::DataLossError(
          absl::StrCat("embeddings: unexpected response: ", body.substr(0, 200)));
    }
    std::vector<std::vector<float>> out(n);
    for (const auto& item : j["data"]) {
      size_t idx = item.value("index", size_t{0});
      if (idx >= n || !item.contains("embedding") || !item["embedding"].is_array()) {
        return absl::DataLossError("embeddings: an item has no embedding");
      }
      std::vector<float> v = item["embedding"].get<std::vector<float>>();
      if (c_.dimension == 0) c_.dimension = static_cast<int>(v.size());
      if (static_cast<int>(v.size()) != c_.dimension) {
        return absl::DataLossError(absl::StrCat("embeddings: dimension ", v.size(),
                                                " but the collection uses ", c_.dimension));
      }
      double norm = 0;
      for (float x : v) norm += double(x) * x;
      if (norm > 0) {
        const float inv = static_cast<float>(1.0 / std::sqrt(norm));
        for (float& x : v) x *= inv;
      }
      out[idx] = std::move(v);
    }
    return out;
  }

  HttpEmbedderConfig c_;
  HttpClient& http_;
};

}  // namespace

std::unique_ptr<Embedder> MakeBuiltinEmbedder(int dimension) {
  return std::make_unique<BuiltinEmbedder>(dimension);
}

std::unique_ptr<Embedder> MakeHttpEmbedder(HttpEmbedderConfig config, HttpClient& http) {
  return std::make_unique<HttpEmbedder>(std::move(config), http);
}

}  // namespace fwai
