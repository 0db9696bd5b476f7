// RFC 6962 Merkle tree hashing: leaf and node hashes, tree heads, inclusion
// and consistency proofs and their verification.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fwai {

using Hash = std::array<uint8_t, 32>;

Hash Sha256(std::string_view data);
Hash LeafHash(std::string_view leaf);                // SHA-256(0x00 || leaf)
Hash NodeHash(const Hash& left, const Hash& right);  // SHA-256(0x01 || left || right)
// MTH(D[0:n]) over leaf hashes; SHA-256("") for none.
Hash TreeHead(const std::vector<Hash>& leaves, size_t n);
// PATH(m, D[0:n]).
std::vector<Hash> InclusionProof(const std::vector<Hash>& leaves, size_t m, size_t n);
bool VerifyInclusion(const Hash& leaf, size_t m, size_t n, const std::vector<Hash>& proof,
                     const Hash& root);
// PROOF(m, D[0:n]).
std::vector<Hash> ConsistencyProof(const std::vector<Hash>& leaves, size_t m, size_t n);
bool VerifyConsistency(size_t m, size_t n, const Hash& old_root, const Hash& new_root,
                       const std::vector<Hash>& proof);

std::string ToHex(const Hash& h);
bool FromHex(std::string_view hex, Hash& out);

}  // namespace fwai
