#include "server/evidence/merkle.h"

#include <openssl/sha.h>

namespace fwai {

Hash Sha256(std::string_view data) {
  Hash h;
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), h.data());
  return h;
}

Hash LeafHash(std::string_view leaf) {
  std::string buf(1, '\0');
  buf.append(leaf);
  return Sha256(buf);
}

Hash NodeHash(const Hash& l, const Hash& r) {
  std::string buf(1, '\x01');
  buf.append(reinterpret_cast<const char*>(l.data()), l.size());
  buf.append(reinterpret_cast<const char*>(r.data()), r.size());
  return Sha256(buf);
}

namespace {

// Largest power of two smaller than n (n > 1).
size_t Split(size_t n) {
  size_t k = 1;
  while (k << 1 < n) k <<= 1;
  return k;
}

Hash Mth(const std::vector<Hash>& d, size_t lo, size_t hi) {
  const size_t n = hi - lo;
  if (n == 0) return Sha256("");
  if (n == 1) return d[lo];
  const size_t k = Split(n);
  return NodeHash(Mth(d, lo, lo + k), Mth(d, lo + k, hi));
}

void Path(const std::vector<Hash>& d, size_t m, size_t lo, size_t hi, std::vector<Hash>& out) {
  const size_t n = hi - lo;
  if (n <= 1) return;
  const size_t k = Split(n);
  if (m < k) {
    Path(d, m, lo, lo + k, out);
    out.push_back(Mth(d, lo + k, hi));
  } else {
    Path(d, m - k, lo + k, hi, out);
    out.push_back(Mth(d, lo, lo + k));
  }
}

void SubProof(const std::vector<Hash>& d, size_t m, size_t lo, size_t hi, bool b,
              std::vector<Hash>& out) {
  const size_t n = hi - lo;
  if (m == n) {
    if (!b) out.push_back(Mth(d, lo, hi));
    return;
  }
  const size_t k = Split(n);
  if (m <= k) {
    SubProof(d, m, lo, lo + k, b, out);
    out.push_back(Mth(d, lo + k, hi));
  } else {
    SubProof(d, m - k, lo + k, hi, false, out);
    out.push_back(Mth(d, lo, lo + k));
  }
}

}  // namespace

Hash TreeHead(const std::vector<Hash>& leaves, size_t n) {
  return Mth(leaves, 0, std::min(n, leaves.size()));
}

std::vector<Hash> InclusionProof(const std::vector<Hash>& leaves, size_t m, size_t n) {
  std::vector<Hash> out;
  if (m < n && n <= leaves.size()) Path(leaves, m, 0, n, out);
  return out;
}

// RFC 9162 section 2.1.3.2.
bool VerifyInclusion(const Hash& leaf, size_t m, size_t n, const std::vector<Hash>& proof,
                     const Hash& root) {
  if (m >= n) return false;
  size_t fn = m, sn = n - 1;
  Hash r = leaf;
  for (const Hash& p : proof) {
    if (sn == 0) return false;
    if ((fn & 1) || fn == sn) {
      r = NodeHash(p, r);
      if (!(fn & 1)) {
        while (fn != 0 && !(fn & 1)) {
          fn >>= 1;
          sn >>= 1;
        }
      }
    } else {
      r = NodeHash(r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  return sn == 0 && r == root;
}

std::vector<Hash> ConsistencyProof(const std::vector<Hash>& leaves, size_t m, size_t n) {
  std::vector<Hash> out;
  if (0 < m && m < n && n <= leaves.size()) SubProof(leaves, m, 0, n, true, out);
  return out;
}

// RFC 9162 section 2.1.4.2.
bool VerifyConsistency(size_t m, size_t n, const Hash& old_root, const Hash& new_root,
                       const std::vector<Hash>& proof) {
  if (m == n) return proof.empty() && old_root == new_root;
  if (m == 0 || m > n || proof.empty()) return false;
  std::vector<Hash> p = proof;
  // A power-of-two old size starts from its own root.
  if ((m & (m - 1)) == 0) p.insert(p.begin(), old_root);
  size_t fn = m - 1, sn = n - 1;
  while (fn & 1) {
    fn >>= 1;
    sn >>= 1;
  }
  Hash fr = p[0], sr = p[0];
  for (size_t i = 1; i < p.size(); ++i) {
    if (sn == 0) return false;
    if ((fn & 1) || fn == sn) {
      fr = NodeHash(p[i], fr);
      sr = NodeHash(p[i], sr);
      if (!(fn & 1)) {
        while (fn != 0 && !(fn & 1)) {
          fn >>= 1;
          sn >>= 1;
        }
      }
    } else {
      sr = NodeHash(sr, p[i]);
    }
    fn >>= 1;
    sn >>= 1;
  }
  return sn == 0 && fr == old_root && sr == new_root;
}

std::string ToHex(const Hash& h) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (uint8_t b : h) {
    out += d[b >> 4];
    out += d[b & 15];
  }
  return out;
}

bool FromHex(std::string_view hex, Hash& out) {
  if (hex.size() != 64) return false;
  auto v = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < 32; ++i) {
    int hi = v(hex[2 * i]), lo = v(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    out[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return true;
}

}  // namespace fwai
