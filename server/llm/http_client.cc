#include "server/llm/http_client.h"

#include <curl/curl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>  // std::call_once

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/start_gate.h"

namespace fwai {
namespace {

struct Transfer {
  const std::function<void(std::string_view)>* on_data;
  const std::function<void(int)>* on_headers;
  HttpResponse* response;
  CancelToken* cancel;
  int64_t last_byte_ns;
  int idle_timeout_s;
  bool idle_expired = false;
};

size_t HeaderCb(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  absl::string_view line(data, size * n);
  if (absl::StartsWith(line, "HTTP/")) {
    // A new response (e.g. after 100-continue or a proxy CONNECT).
    t->response->headers.clear();
    auto sp = line.find(' ');
    if (sp != absl::string_view::npos && line.size() >= sp + 4) {
      t->response->status = std::atoi(std::string(line.substr(sp + 1, 3)).c_str());
    }
    return size * n;
  }
  if (absl::StripAsciiWhitespace(line).empty()) {  // end of a header block
    if (*t->on_headers && t->response->status >= 200) (*t->on_headers)(t->response->status);
    return size * n;
  }
  auto colon = line.find(':');
  if (colon != absl::string_view::npos) {
    std::string name = absl::AsciiStrToLower(line.substr(0, colon));
    std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    t->response->headers[name] = value;
  }
  return size * n;
}

size_t WriteCb(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  t->last_byte_ns = MonotonicNanos();
  if (t->response->status >= 200 && t->response->status < 300) {
    t->response->body_started = true;
    (*t->on_data)(std::string_view(data, size * n));
  } else {
    if (t->response->body.size() < (1 << 20)) t->response->body.append(data, size * n);
  }
  return size * n;
}

int ProgressCb(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* t = static_cast<Transfer*>(user);
  if (t->cancel->cancelled()) return 1;
  if (MonotonicNanos() - t->last_byte_ns > int64_t{t->idle_timeout_s} * 1000000000) {
    t->idle_expired = true;
    return 1;
  }
  return 0;
}

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient() {
    static std::once_flag once;
    std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  }
  ~CurlHttpClient() override {
    for (CURL* c : idle_) curl_easy_cleanup(c);
  }

  // Easy handles are reused so their connections (and TLS sessions) stay
  // open between model calls of a turn.
  CURL* Take() {
    {
      MutexLock lock(&mu_);
      if (!idle_.empty()) {
        CURL* c = idle_.back();
        idle_.pop_back();
        curl_easy_reset(c);
        return c;
      }
    }
    return curl_easy_init();
  }
  void Give(CURL* c, bool reusable) {
    if (!reusable) {
      curl_easy_cleanup(c);
      return;
    }
    MutexLock lock(&mu_);
    if (idle_.size() >= 16) {
      curl_easy_cleanup(c);
      return;
    }
    idle_.push_back(c);
  }

  absl::StatusOr<HttpResponse> PostStream(const HttpRequest& req,
                                          const std::function<void(std::string_view)>& on_data,
                                          CancelToken& cancel, bool* partial) override {
    if (partial) *partial = false;
    if (cancel.cancelled()) return absl::CancelledError("cancelled");
    CURL* curl = Take();
    if (!curl) return absl::InternalError("curl_easy_init failed");
    HttpResponse response;
    Transfer t{&on_data, &req.on_headers, &response, &cancel, MonotonicNanos(), req.idle_timeout_s};
    struct curl_slist* headers = nullptr;
    for (const auto& h : req.headers) headers = curl_slist_append(headers, h.c_str());
    headers = curl_slist_append(headers, "Expect:");
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl, CURLOPT_URL, req.url.c_str());
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    if (req.method == "GET") {
      curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
    } else if (req.method == "DELETE") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
    } else {
      curl_easy_setopt(curl, CURLOPT_POST, 1L);
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, req.body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body.size()));
    }
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT, static_cast<long>(req.connect_timeout_s));
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, HeaderCb);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, WriteCb);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, ProgressCb);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &t);
    curl_easy_setopt(curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(curl, CURLOPT_ACCEPT_ENCODING, "");
    StartGate::LeaveHeld();  // waiting on the network is not start work
    CURLcode rc = curl_easy_perform(curl);
    curl_slist_free_all(headers);
    Give(curl, rc == CURLE_OK);
    if (partial) *partial = response.body_started;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      if (t.idle_expired) {
        return absl::DeadlineExceededError(
            absl::StrCat("no data from ", req.url, " for ", req.idle_timeout_s, " s; gave up"));
      }
      return absl::CancelledError("cancelled");
    }
    if (rc != CURLE_OK) {
      std::string detail = errbuf[0] ? errbuf : curl_easy_strerror(rc);
      return absl::UnavailableError(absl::StrCat("cannot reach ", req.url, ": ", detail));
    }
    return response;
  }

 private:
  Mutex mu_;
  std::vector<CURL*> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<HttpClient> MakeCurlHttpClient() { return std::make_unique<CurlHttpClient>(); }

}  // namespace fwai
