// fwai_fake_llm: the fake LLM service as a program, for tests written in other
// languages (the VS Code extension's node tests and e2e suite).
//
//   fwai_fake_llm [--script FILE]
//
// Serves on 127.0.0.1 (a free port), prints "PORT\n" on standard output once
// it listens, and runs until SIGTERM/SIGINT (or, when standard input is a
// pipe, until it closes). FILE is
// a JSON array of replies (FakeReplyFromJson); more can be queued at any time
// with POST /_fake/replies. Anthropic base URL: http://127.0.0.1:PORT.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/fakes/fake_llm_server.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void OnSignal(int) { g_stop = 1; }

int Usage() {
  std::fprintf(stderr, "usage: fwai_fake_llm [--script FILE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string script;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--script" && i + 1 < argc) {
      script = argv[++i];
    } else {
      return Usage();
    }
  }
  fwai::testing::FakeLlmServer server;
  if (!script.empty()) {
    std::ifstream in(script);
    if (!in) {
      std::fprintf(stderr, "fwai_fake_llm: cannot read %s\n", script.c_str());
      return 1;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_array()) {
      std::fprintf(stderr, "fwai_fake_llm: %s: expected a JSON array of replies\n", script.c_str());
      return 1;
    }
    for (size_t i = 0; i < j.size(); ++i) {
      fwai::testing::FakeReply r;
      std::string error;
      if (!fwai::testing::FakeReplyFromJson(j[i], &r, &error)) {
        std::fprintf(stderr, "fwai_fake_llm: %s: reply %zu: %s\n", script.c_str(), i,
                     error.c_str());
        return 1;
      }
      server.Enqueue(std::move(r));
    }
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const int port = server.Start();
  if (port <= 0) {
    std::fprintf(stderr, "fwai_fake_llm: cannot listen: %s\n", std::strerror(errno));
    return 1;
  }
  std::printf("%d\n", port);
  std::fflush(stdout);
  // Until a signal, or, when standard input is a pipe, until it closes (the
  // parent went away).
  struct stat st {};
  const bool watch_stdin = fstat(0, &st) == 0 && S_ISFIFO(st.st_mode);
  char buf[256];
  while (!g_stop) {
    if (!watch_stdin) {
      pause();
      continue;
    }
    ssize_t n = read(0, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0 && errno != EINTR) break;
  }
  server.Stop();
  return 0;
}
