// Chat clients for the streaming benchmarks: one turn read on a Chat stream,
// and what the client saw of it (events, per-chunk added latency from the
// timestamps the fake provider puts in each chunk).
//
// `Stream` reads one turn on the calling thread (gRPC's synchronous API).
// `RunChats` runs many turns at once on gRPC's callback API: each stream is
// read on gRPC's own threads as its events arrive, so a load of hundreds of
// clients costs the harness no thread per client and no wake-up of a reader
// thread per event (with the synchronous API, gRPC's polling thread hands
// every event to the thread blocked in `Read`). The harness shares the
// machine with fwaid; what it spends is taken from fwaid.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "fwai/v1/sessions.grpc.pb.h"

namespace fwai::testing {

struct StreamStats {
  uint64_t events = 0;
  uint64_t deltas = 0;
  uint64_t chunks = 0;  // provider chunks carried (more than deltas when coalesced)
  double seconds = 0;
  std::vector<double> latency_ms;
  std::vector<double> steady_latency_ms;        // after the first `warmup` chunks
  std::vector<double> first_latency_ms;         // the first `warmup`
  std::vector<double> first_by_index_ms;        // latency of chunk 1, 2, ... of the first `warmup`
  int64_t first_ns = 0, last_ns = 0;            // the first and last text delta received
  int64_t first_sent_ns = 0, last_sent_ns = 0;  // the provider's first and last chunk sent
  bool finished = false;                        // turn_finished was received
};

// One turn: a Chat stream on `session_id` that sends `text` and reads until
// turn_finished (5 minutes at most; a stream that ends before says why on
// stderr). `sent_ns`: when the message left.
StreamStats Stream(fwai::v1::Sessions::Stub& stub, const std::string& session_id,
                   bool measure_latency, int warmup = 0, const std::string& text = "bench",
                   int64_t* sent_ns = nullptr);

struct ChatSpec {
  std::string session_id;
  std::string text;
};

// One turn in each of `specs`' sessions, all at once on the callback API;
// returns when every stream has ended, each turn's stats in the order of
// `specs`. Each client opens its stream and sends its message at once, or,
// with `once_all_open`, opens its stream and waits: `once_all_open` is called
// once every stream is open, then every message is sent. `sent_ns[i]`: when
// message i left.
std::vector<StreamStats> RunChats(fwai::v1::Sessions::Stub& stub,
                                  const std::vector<ChatSpec>& specs, bool measure_latency,
                                  int warmup, const std::function<void()>& once_all_open,
                                  std::vector<int64_t>* sent_ns);

}  // namespace fwai::testing
