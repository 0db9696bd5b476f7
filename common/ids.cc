#include "common/ids.h"

#include <openssl/rand.h>

#include <cstdio>
#include <random>

namespace fwai {

std::string NewId(const std::string& prefix) {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    std::random_device rd;
    for (auto& b : bytes) b = static_cast<unsigned char>(rd());
  }
  std::string out = prefix;
  char hex[3];
  for (unsigned char b : bytes) {
    std::snprintf(hex, sizeof(hex), "%02x", b);
    out += hex;
  }
  return out;
}

}  // namespace fwai
