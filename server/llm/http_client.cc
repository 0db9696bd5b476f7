#include "server/llm/http_client.h"

#include <curl/curl.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>  // std::call_once
#include <thread>

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

// One thread moves every transfer (libcurl's multi interface on epoll): a
// chunk arriving on any stream wakes this thread, not a thread per stream,
// and chunks of many streams ready at once are read in one wake-up. The
// transfers' callbacks (headers, body bytes, progress) run on this thread;
// the caller of Perform waits until its transfer is done.
class CurlLoop {
 public:
  CurlLoop() {
    multi_ = curl_multi_init();
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (multi_ == nullptr || epoll_ < 0 || wake_ < 0) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = wake_;
    if (epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev) != 0) return;
    curl_multi_setopt(multi_, CURLMOPT_SOCKETFUNCTION, SocketCb);
    curl_multi_setopt(multi_, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(multi_, CURLMOPT_TIMERFUNCTION, TimerCb);
    curl_multi_setopt(multi_, CURLMOPT_TIMERDATA, this);
    // A connection per transfer, as each had before: no HTTP/2 streams of
    // different turns sharing one connection to a provider.
    curl_multi_setopt(multi_, CURLMOPT_PIPELINING, long{CURLPIPE_NOTHING});
    thread_ = std::thread([this] { Run(); });
  }
  ~CurlLoop() {
    if (thread_.joinable()) {
      {
        MutexLock lock(&mu_);
        stop_ = true;
      }
      Wake();
      thread_.join();
    }
    if (multi_ != nullptr) curl_multi_cleanup(multi_);
    if (epoll_ >= 0) close(epoll_);
    if (wake_ >= 0) close(wake_);
  }
  bool ok() const { return thread_.joinable(); }
  // True on the loop's own thread: inside a transfer's callback.
  bool OnLoopThread() const { return std::this_thread::get_id() == thread_.get_id(); }

  // Runs `easy` (set up, its callbacks' user data `t`) to its end; returns
  // libcurl's result. A cancel of `t->cancel` or no byte for the idle
  // timeout ends it with CURLE_ABORTED_BY_CALLBACK.
  CURLcode Perform(CURL* easy, Transfer* t) {
    auto job = std::make_shared<Job>();
    job->easy = easy;
    job->t = t;
    {
      MutexLock lock(&mu_);
      if (stop_) return CURLE_ABORTED_BY_CALLBACK;
      added_.push_back(job);
    }
    std::weak_ptr<Job> weak = job;
    t->cancel->OnCancel([this, weak] {
      if (auto j = weak.lock()) {
        j->cancel_seen.store(true);
        Wake();
      }
    });
    Wake();
    MutexLock lock(&job->mu);
    while (!job->done) job->done_cv.Wait(&job->mu);
    return job->result;
  }

 private:
  struct Job {
    CURL* easy = nullptr;
    Transfer* t = nullptr;
    std::atomic<bool> cancel_seen{false};
    Mutex mu;
    CondVar done_cv;
    bool done ABSL_GUARDED_BY(mu) = false;
    CURLcode result ABSL_GUARDED_BY(mu) = CURLE_OK;
  };

  void Wake() {
    const uint64_t one = 1;
    (void)!write(wake_, &one, sizeof one);
  }

  static int SocketCb(CURL*, curl_socket_t s, int what, void* userp, void* socketp) {
    auto* self = static_cast<CurlLoop*>(userp);
    if (what == CURL_POLL_REMOVE) {
      epoll_ctl(self->epoll_, EPOLL_CTL_DEL, s, nullptr);
      curl_multi_assign(self->multi_, s, nullptr);
      return 0;
    }
    epoll_event ev{};
    ev.events = ((what & CURL_POLL_IN) ? EPOLLIN : 0u) | ((what & CURL_POLL_OUT) ? EPOLLOUT : 0u);
    ev.data.fd = s;
    if (socketp == nullptr) {
      if (epoll_ctl(self->epoll_, EPOLL_CTL_ADD, s, &ev) != 0 && errno == EEXIST) {
        epoll_ctl(self->epoll_, EPOLL_CTL_MOD, s, &ev);
      }
      curl_multi_assign(self->multi_, s, self);  // known from now on
    } else {
      epoll_ctl(self->epoll_, EPOLL_CTL_MOD, s, &ev);
    }
    return 0;
  }

  static int TimerCb(CURLM*, long timeout_ms, void* userp) {
    auto* self = static_cast<CurlLoop*>(userp);
    self->timer_due_ns_ =
        timeout_ms < 0 ? -1 : MonotonicNanos() + static_cast<int64_t>(timeout_ms) * 1000000;
    return 0;
  }

  void Run() {
    constexpr int64_t kSweepNs = 1000000000;  // cancels and idle transfers, at least this often
    int64_t next_sweep = MonotonicNanos() + kSweepNs;
    epoll_event events[64];
    while (true) {
      const int64_t now = MonotonicNanos();
      int64_t wait_ns = jobs_.empty() ? -1 : std::max<int64_t>(0, next_sweep - now);
      if (timer_due_ns_ >= 0) {
        const int64_t t = std::max<int64_t>(0, timer_due_ns_ - now);
        wait_ns = wait_ns < 0 ? t : std::min(wait_ns, t);
      }
      const int timeout_ms = wait_ns < 0 ? -1 : static_cast<int>((wait_ns + 999999) / 1000000);
      const int n = epoll_wait(epoll_, events, 64, timeout_ms);
      bool woken = false;
      int running = 0;
      for (int i = 0; i < n; ++i) {
        const int fd = events[i].data.fd;
        if (fd == wake_) {
          uint64_t v;
          (void)!read(wake_, &v, sizeof v);
          woken = true;
          continue;
        }
        int mask = 0;
        if (events[i].events & EPOLLIN) mask |= CURL_CSELECT_IN;
        if (events[i].events & EPOLLOUT) mask |= CURL_CSELECT_OUT;
        if (events[i].events & (EPOLLERR | EPOLLHUP)) mask |= CURL_CSELECT_ERR;
        curl_multi_socket_action(multi_, fd, mask, &running);
      }
      if (timer_due_ns_ >= 0 && MonotonicNanos() >= timer_due_ns_) {
        timer_due_ns_ = -1;
        curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
      }
      if (woken && TakeAdded()) {
        // Added transfers start through the timer libcurl set for them.
        if (timer_due_ns_ >= 0 && MonotonicNanos() >= timer_due_ns_) {
          timer_due_ns_ = -1;
          curl_multi_socket_action(multi_, CURL_SOCKET_TIMEOUT, 0, &running);
        }
      }
      if (woken || MonotonicNanos() >= next_sweep) {
        Sweep();
        next_sweep = MonotonicNanos() + kSweepNs;
      }
      Reap();
      if (Stopping()) {
        // Shutting down: what is still running ends as aborted.
        for (auto& [easy, job] : jobs_) {
          curl_multi_remove_handle(multi_, easy);
          Complete(job, CURLE_ABORTED_BY_CALLBACK);
        }
        jobs_.clear();
        return;
      }
    }
  }

  bool Stopping() {
    MutexLock lock(&mu_);
    return stop_ && added_.empty();
  }

  // Adds the transfers queued by Perform; returns whether there were any.
  bool TakeAdded() {
    std::deque<std::shared_ptr<Job>> added;
    {
      MutexLock lock(&mu_);
      added.swap(added_);
    }
    for (auto& job : added) {
      if (curl_multi_add_handle(multi_, job->easy) != CURLM_OK) {
        Complete(job, CURLE_FAILED_INIT);
        continue;
      }
      jobs_[job->easy] = job;
    }
    return !added.empty();
  }

  // Ends transfers that were cancelled or got no byte for their idle timeout
  // (libcurl asks for progress only while a transfer moves).
  void Sweep() {
    const int64_t now = MonotonicNanos();
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      Transfer* t = it->second->t;
      const bool cancelled = it->second->cancel_seen.load() || t->cancel->cancelled();
      if (!cancelled && now - t->last_byte_ns <= int64_t{t->idle_timeout_s} * 1000000000) {
        ++it;
        continue;
      }
      if (!cancelled) t->idle_expired = true;
      curl_multi_remove_handle(multi_, it->first);
      Complete(it->second, CURLE_ABORTED_BY_CALLBACK);
      it = jobs_.erase(it);
    }
  }

  // Hands finished transfers back to their callers.
  void Reap() {
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi_, &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      CURL* easy = msg->easy_handle;
      const CURLcode rc = msg->data.result;
      curl_multi_remove_handle(multi_, easy);
      auto it = jobs_.find(easy);
      if (it == jobs_.end()) continue;
      Complete(it->second, rc);
      jobs_.erase(it);
    }
  }

  static void Complete(const std::shared_ptr<Job>& job, CURLcode rc) {
    MutexLock lock(&job->mu);
    job->result = rc;
    job->done = true;
    job->done_cv.Signal();
  }

  CURLM* multi_ = nullptr;
  int epoll_ = -1;
  int wake_ = -1;
  std::thread thread_;
  // The loop thread's own: the transfers it moves and libcurl's timer.
  std::map<CURL*, std::shared_ptr<Job>> jobs_;
  int64_t timer_due_ns_ = -1;  // -1: no timer
  Mutex mu_;
  std::deque<std::shared_ptr<Job>> added_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

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
    // A request made from a transfer's callback (an MCP server's request
    // answered from its stream) cannot wait for the loop it runs on: it runs
    // by itself, holding the other transfers up while it does.
    const bool own = !loop_.ok() || loop_.OnLoopThread();
    CURLcode rc = own ? curl_easy_perform(curl) : loop_.Perform(curl, &t);
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
  // Declared last: stopped (its transfers ended) before the idle handles go.
  CurlLoop loop_;
};

}  // namespace

std::unique_ptr<HttpClient> MakeCurlHttpClient() { return std::make_unique<CurlHttpClient>(); }

}  // namespace fwai
