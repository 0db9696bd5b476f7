// A provider's stream decoder (FWAI_FUZZ_PROVIDER: anthropic, openai, gemini,
// ollama): the input is the body of a 200 answer, split anywhere. Whatever
// the server sends, Stream returns an error or a message the agent can use:
// content blocks that are objects with a string type, text blocks with
// their text, tool calls with a string id and name and an object input, all
// of it serializable (the history stores it).
#include <string>

#include "server/llm/http_client.h"
#include "server/llm/provider.h"
#include "tests/fuzz/fuzz_support.h"

#ifndef FWAI_FUZZ_PROVIDER
#error "FWAI_FUZZ_PROVIDER names the provider kind"
#endif

namespace fwai::fuzz {
namespace {

using json = nlohmann::json;

// The provider's service, answering every request with the fuzz input.
class CannedHttpClient final : public HttpClient {
 public:
  explicit CannedHttpClient(std::string_view body) : body_(body), rng_(body) {}
  absl::StatusOr<HttpResponse> PostStream(const HttpRequest& request,
                                          const std::function<void(std::string_view)>& on_data,
                                          CancelToken& cancel, bool* partial) override {
    HttpResponse resp;
    resp.status = 200;
    FeedInPieces(body_, rng_, 512, on_data);
    resp.body_started = !body_.empty();
    if (partial != nullptr) *partial = !body_.empty();
    return resp;
  }

 private:
  std::string_view body_;
  Rng rng_;
};

class NullObserver final : public StreamObserver {
 public:
  void OnText(std::string_view text) override {}
};

bool IsString(const json& block, const char* key) {
  auto it = block.find(key);
  return it != block.end() && it->is_string();
}

void CheckMessage(const ChatResult& r) {
  FUZZ_CHECK(r.content.is_array());
  for (const auto& b : r.content) {
    FUZZ_CHECK(b.is_object());
    FUZZ_CHECK(IsString(b, "type"));
    const std::string type = b["type"].get<std::string>();
    if (type == "text") FUZZ_CHECK(IsString(b, "text"));
    if (type == "thinking") FUZZ_CHECK(IsString(b, "thinking"));
    if (type == "tool_use") {
      FUZZ_CHECK(IsString(b, "id"));
      FUZZ_CHECK(IsString(b, "name"));
      FUZZ_CHECK(b.contains("input") && b["input"].is_object());
    }
  }
  (void)r.content.dump();
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  CannedHttpClient http(AsText(data, size));
  ProviderConfig pc;
  pc.name = FWAI_FUZZ_PROVIDER;
  pc.kind = FWAI_FUZZ_PROVIDER;
  pc.api_key = "k";
  pc.base_url = "http://127.0.0.1:9";
  pc.model = "m";
  RetryConfig rc;
  rc.max_attempts = 1;
  auto provider = MakeProvider(pc, rc, http);
  ChatRequest req;
  req.model = "m";
  req.messages.push_back({"user", json::array({{{"type", "text"}, {"text", "hi"}}})});
  req.tools.push_back(MakeToolSpec("read_file", "read a file", {{"type", "object"}}));
  NullObserver observer;
  CancelToken cancel;
  auto result = provider->Stream(req, observer, cancel);
  if (result.ok()) {
    CheckMessage(*result);
  } else {
    FUZZ_CHECK(!result.status().message().empty());
  }
  return 0;
}
