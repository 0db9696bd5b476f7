// HTTP with streaming response bodies (libcurl behind a seam). Honours
// HTTPS_PROXY / NO_PROXY and uses the system CA store.
//
// The curl client moves every transfer on one thread of its own (libcurl's
// multi interface on epoll): the caller of PostStream waits while its
// `on_data` and `on_headers` run on that thread, so they must not block for
// long (every other stream waits meanwhile). A PostStream made from inside
// a callback runs by itself on that thread.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cancel.h"

namespace fwai {

struct HttpRequest {
  std::string method = "POST";  // POST (with `body`), GET or DELETE
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
  int connect_timeout_s = 15;
  int idle_timeout_s = 120;  // fail if no byte arrives for this long
  // Called with the status once the response's headers are in (before any
  // body byte): a long-lived stream is known to be open then.
  std::function<void(int status)> on_headers;
};

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;                            // the body when it was not streamed (non-2xx)
  bool body_started = false;                   // some 2xx body bytes reached on_data
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // Sends the request (a POST unless `method` says otherwise); for 2xx
  // responses the body goes to `on_data` as it arrives, else
  // it is collected in HttpResponse::body. A transport failure is UNAVAILABLE
  // (DEADLINE_EXCEEDED for the idle timeout), cancellation is CANCELLED; in
  // both cases `partial` (if not null) says whether body bytes were delivered.
  [[nodiscard]] virtual absl::StatusOr<HttpResponse> PostStream(
      const HttpRequest& request, const std::function<void(std::string_view)>& on_data,
      CancelToken& cancel, bool* partial) = 0;
};

std::unique_ptr<HttpClient> MakeCurlHttpClient();

}  // namespace fwai
