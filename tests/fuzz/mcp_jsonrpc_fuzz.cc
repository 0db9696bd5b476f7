// MCP JSON-RPC: a server's answers to initialize, tools/list and tools/call
// (the input, three parts separated by a "\n--\n" line), each a JSON body or
// an SSE stream split anywhere, read by a real McpClient over streamable
// HTTP; and the same bytes as a server's stdio output, framed into messages
// and read the way the stdio transport reads them. Whatever the server sends,
// the client returns errors or results and never throws or crashes.
#include <string>
#include <vector>

#include "server/llm/http_client.h"
#include "server/llm/line_splitter.h"
#include "server/mcp/mcp_client.h"
#include "server/mcp/mcp_messages.h"
#include "tests/fuzz/fuzz_support.h"

namespace fwai::fuzz {
namespace {

using json = nlohmann::json;

class ScriptedMcpServer final : public HttpClient {
 public:
  explicit ScriptedMcpServer(std::string_view input) : rng_(input) {
    for (int i = 0; i < 2; ++i) {
      const size_t sep = input.find("\n--\n");
      if (sep == std::string_view::npos) break;
      answers_.push_back(input.substr(0, sep));
      input.remove_prefix(sep + 4);
    }
    answers_.push_back(input);
    answers_.resize(3);
  }
  absl::StatusOr<HttpResponse> PostStream(const HttpRequest& request,
                                          const std::function<void(std::string_view)>& on_data,
                                          CancelToken& cancel, bool* partial) override {
    HttpResponse resp;
    if (request.method == "GET") {  // no stream of the server's own
      resp.status = 405;
      return resp;
    }
    if (request.method != "POST") {
      resp.status = 200;
      return resp;
    }
    const json msg = json::parse(request.body, nullptr, false);
    const std::string method = msg.is_object() ? msg.value("method", "") : "";
    int which = method == "initialize"   ? 0
                : method == "tools/list" ? 1
                : method == "tools/call" ? 2
                                         : -1;
    if (which < 0) {
      resp.status = 202;
      return resp;
    }
    resp.status = 200;
    FeedInPieces(answers_[which], rng_, 256, on_data);
    return resp;
  }

 private:
  std::vector<std::string_view> answers_;
  Rng rng_;
};

// The stdio transport's reading: lines, messages, and what answers mean.
void ReadAsStdio(std::string_view output) {
  LineSplitter lines;
  Rng rng(output);
  FeedInPieces(output, rng, 256, [&](std::string_view piece) {
    lines.Feed(piece, [&](std::string_view line) {
      auto m = ParseJsonRpcMessage(line);
      if (!m.ok()) {
        FUZZ_CHECK(m.status().code() == absl::StatusCode::kInvalidArgument);
        return;
      }
      if (m->kind != JsonRpcMessage::Kind::kResponse || m->is_error) return;
      (void)ServerInfoFromInitialize(m->result).dump();
      json cursor;
      (void)ToolsFromListResult("fuzz", m->result, &cursor);
      (void)CallResultFromJson("fuzz", m->result);
    });
  });
}

}  // namespace
}  // namespace fwai::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fwai;
  using namespace fwai::fuzz;
  ReadAsStdio(AsText(data, size));
  ScriptedMcpServer server(AsText(data, size));
  McpServerConfig config;
  config.name = "fuzz";
  config.url = "http://127.0.0.1:9/mcp";
  config.init_timeout_ms = 1000;
  auto client = McpClient::Start(config, &server);
  if (!client.ok()) {
    FUZZ_CHECK(!client.status().message().empty());
    return 0;
  }
  (void)(*client)->server_info();
  auto tools = (*client)->ListTools(1000);
  if (!tools.ok()) FUZZ_CHECK(!tools.status().message().empty());
  auto call = (*client)->CallTool("t", json::object(), nullptr, 1000);
  if (!call.ok()) FUZZ_CHECK(!call.status().message().empty());
  return 0;
}
