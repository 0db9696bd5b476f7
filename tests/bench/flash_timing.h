// One flash through Hardware.Flash until the board's boot line, timed; shared
// by the benchmarks that measure flashing (locally and through a lab front).
#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include "fwai/v1/hardware.grpc.pb.h"

namespace fwai::testing {

// Milliseconds from the request until the flash ended with the board's boot
// line; nullopt (the reason on stderr) when it failed or no boot line came.
inline std::optional<double> TimedFlash(fwai::v1::Hardware::Stub& hw,
                                        const fwai::v1::FlashRequest& req) {
  grpc::ClientContext ctx;
  const auto t0 = std::chrono::steady_clock::now();
  auto reader = hw.Flash(&ctx, req);
  fwai::v1::FlashProgress p;
  std::string banner;
  while (reader->Read(&p)) {
    if (p.done()) banner = p.boot_line();
  }
  auto st = reader->Finish();
  if (!st.ok() || banner.empty()) {
    std::fprintf(stderr, "flash: %s\n", st.error_message().c_str());
    return std::nullopt;
  }
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace fwai::testing
