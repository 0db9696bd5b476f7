#include "server/evidence/evidence_log.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/ids.h"
#include "common/mutex.h"
#include "common/paths.h"
#include "common/status_macros.h"
#include "server/storage/storage.h"

namespace fwai {

using json = nlohmann::json;

namespace {

std::string RecordKey(uint64_t i) { return absl::StrFormat("r/%020d", i); }
std::string CheckpointKey(uint64_t size) { return absl::StrFormat("c/%020d", size); }
constexpr char kHeadKey[] = "head";

Hash Chain(const Hash& prev, const Hash& leaf) {
  std::string buf(reinterpret_cast<const char*>(prev.data()), prev.size());
  buf.append(reinterpret_cast<const char*>(leaf.data()), leaf.size());
  return Sha256(buf);
}

std::string SignedText(uint64_t size, const Hash& root, const Hash& chain, int64_t time_us) {
  return absl::StrCat("fwai-evidence-checkpoint\n", size, "\n", ToHex(root), "\n", ToHex(chain),
                      "\n", time_us, "\n");
}

}  // namespace

struct EvidenceLog::Rep {
  // storage, key and checkpoint_every: set in Open(), read-only after.
  Storage* storage = nullptr;
  EVP_PKEY* key = nullptr;
  int checkpoint_every = 100;
  mutable Mutex mu;
  std::vector<Hash> leaves ABSL_GUARDED_BY(mu);
  Hash chain ABSL_GUARDED_BY(mu) = {};
  uint64_t last_checkpoint ABSL_GUARDED_BY(mu) = 0;
  absl::Status failed ABSL_GUARDED_BY(mu);  // set once a write failed: the log refuses appends
  bool fail_for_test ABSL_GUARDED_BY(mu) = false;

  ~Rep() {
    if (key) EVP_PKEY_free(key);
  }

  absl::Status Put(WriteBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ASSIGN_OR_RETURN(const uint64_t ticket, PutForSync(batch));
    return storage->SyncThrough(ticket);
  }
  // Stops the log: writing or syncing record `index` failed with `why`.
  absl::Status Stop(absl::string_view step, uint64_t index, absl::string_view why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (failed.ok()) {
      failed = absl::DataLossError(absl::StrCat(
          "evidence log stopped: ", step, " record ", index, " failed (", why,
          "); no further records are accepted until fwaid restarts with the problem fixed"));
    }
    return failed;
  }
  // The write, in order under `mu`; the disk is waited for with the ticket
  // (Storage::SyncThrough) after `mu` is let go.
  absl::StatusOr<uint64_t> PutForSync(WriteBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (fail_for_test)
      return absl::DataLossError("write failed: no space left on device (simulated)");
    return storage->WriteForSync(batch);
  }

  absl::StatusOr<std::string> Sign(const std::string& text) const {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    size_t len = 64;
    std::string sig(64, '\0');
    bool ok = EVP_DigestSignInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
              EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                             reinterpret_cast<const unsigned char*>(text.data()), text.size()) == 1;
    EVP_MD_CTX_free(ctx);
    if (!ok) return absl::InternalError("Ed25519 signing failed");
    sig.resize(len);
    return sig;
  }

  bool VerifySig(const std::string& text, const std::string& sig) const {
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok =
        EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
        EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                         reinterpret_cast<const unsigned char*>(text.data()), text.size()) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
  }

  absl::Status CheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!failed.ok()) return failed;
    const uint64_t size = leaves.size();
    if (size == 0 || size == last_checkpoint) return absl::OkStatus();
    const Hash root = TreeHead(leaves, size);
    const int64_t now = NowMicros();
    auto sig = Sign(SignedText(size, root, chain, now));
    if (!sig.ok()) return sig.status();
    std::string sig_hex;
    for (unsigned char c : *sig) absl::StrAppendFormat(&sig_hex, "%02x", c);
    json cp = {{"size", size},
               {"root", ToHex(root)},
               {"chain", ToHex(chain)},
               {"time_us", now},
               {"signature", sig_hex}};
    WriteBatch batch;
    batch.Put(Cf::kEvidence, CheckpointKey(size), cp.dump());
    if (auto s = Put(batch); !s.ok()) {
      failed = absl::DataLossError(absl::StrCat("evidence log stopped: writing checkpoint ", size,
                                                " failed: ", s.message()));
      return failed;
    }
    last_checkpoint = size;
    return absl::OkStatus();
  }
};

EvidenceLog::EvidenceLog(std::unique_ptr<Rep> rep) : rep_(std::move(rep)) {}

EvidenceLog::~EvidenceLog() {
  if (rep_) {
    MutexLock lock(&rep_->mu);
    (void)rep_->CheckpointLocked();  // at shutdown
  }
}

absl::StatusOr<std::unique_ptr<EvidenceLog>> EvidenceLog::Open(Storage& storage,
                                                               const std::string& key_path,
                                                               int checkpoint_every) {
  auto rep = std::make_unique<Rep>();
  rep->storage = &storage;
  rep->checkpoint_every = std::max(1, checkpoint_every);
  // The signing key: created on first start, readable by the daemon's user
  // only, written whole or not at all (a temporary file renamed over it). An
  // empty key file — an older fwaid killed while first writing it — never
  // signed anything: it is replaced. Any other unreadable key is refused.
  struct stat st;
  const bool exists = stat(key_path.c_str(), &st) == 0;
  if (!exists && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("evidence key ", key_path, ": ", std::strerror(errno)));
  }
  if (exists && st.st_size > 0) {
    FILE* f = std::fopen(key_path.c_str(), "r");
    if (!f) {
      return absl::PermissionDeniedError(
          absl::StrCat("evidence key ", key_path, ": cannot read it"));
    }
    rep->key = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
    std::fclose(f);
    if (!rep->key)
      return absl::DataLossError(
          absl::StrCat("evidence key ", key_path, ": not a readable PEM private key"));
    if (EVP_PKEY_id(rep->key) != EVP_PKEY_ED25519) {
      return absl::InvalidArgumentError(
          absl::StrCat("evidence key ", key_path, ": not an Ed25519 key"));
    }
  } else {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(key_path).parent_path(), ec);
    EVP_PKEY_CTX* kctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
    if (!kctx || EVP_PKEY_keygen_init(kctx) != 1 || EVP_PKEY_keygen(kctx, &rep->key) != 1) {
      if (kctx) EVP_PKEY_CTX_free(kctx);
      return absl::InternalError("cannot generate an Ed25519 key");
    }
    EVP_PKEY_CTX_free(kctx);
    BIO* bio = BIO_new(BIO_s_mem());
    const bool ok =
        bio && PEM_write_bio_PrivateKey(bio, rep->key, nullptr, nullptr, 0, nullptr, nullptr) == 1;
    char* data = nullptr;
    const long len = ok ? BIO_get_mem_data(bio, &data) : 0;
    std::string pem = ok && len > 0 ? std::string(data, static_cast<size_t>(len)) : std::string();
    if (bio) BIO_free(bio);
    if (pem.empty())
      return absl::InternalError(absl::StrCat("evidence key ", key_path, ": cannot encode it"));
    if (auto w = WriteFileAtomic(key_path, pem, 0600); !w.ok()) {
      return absl::PermissionDeniedError(
          absl::StrCat("evidence key ", key_path, ": ", w.message()));
    }
  }
  // Load the leaves and the chain head (into locals, handed over under the
  // lock; nothing else sees `rep` yet).
  absl::Status bad;
  std::vector<Hash> leaves;
  Hash chain{};
  auto s = storage.Scan(Cf::kEvidence, "r/", "r0", [&](std::string_view, std::string_view value) {
    const Hash leaf = LeafHash(value);
    chain = Chain(chain, leaf);
    leaves.push_back(leaf);
    return true;
  });
  if (!s.ok()) return s;
  auto last = storage.LastKey(Cf::kEvidence, "c/", "c0");
  if (!last.ok()) return last.status();
  {
    MutexLock lock(&rep->mu);
    rep->leaves = std::move(leaves);
    rep->chain = chain;
    if (last->has_value()) rep->last_checkpoint = std::stoull(last->value().substr(2));
  }
  return std::unique_ptr<EvidenceLog>(new EvidenceLog(std::move(rep)));
}

absl::StatusOr<EvidenceRecord> EvidenceLog::Append(json record) {
  if (!record.is_object())
    return absl::InvalidArgumentError("evidence record: expected a JSON object");
  uint64_t ticket = 0;
  absl::StatusOr<EvidenceRecord> out = AppendUnsynced(std::move(record), &ticket);
  if (!out.ok()) return out;
  // Records appended side by side share one sync; none is answered before
  // it is durable. A sync that fails stops the log, as a failed write does.
  if (absl::Status s = rep_->storage->SyncThrough(ticket); !s.ok()) {
    MutexLock lock(&rep_->mu);
    return rep_->Stop("syncing", out->index, s.message());
  }
  return out;
}

absl::StatusOr<EvidenceRecord> EvidenceLog::AppendUnsynced(json record, uint64_t* ticket) {
  MutexLock lock(&rep_->mu);
  if (!rep_->failed.ok()) return rep_->failed;
  EvidenceRecord out;
  out.index = rep_->leaves.size();
  out.run_id = record.value("run_id", "");
  if (out.run_id.empty()) out.run_id = NewId("run-");
  record["run_id"] = out.run_id;
  record["index"] = out.index;
  if (!record.contains("time_us")) record["time_us"] = NowMicros();
  record["prev"] = ToHex(rep_->chain);
  out.bytes = record.dump();
  out.leaf = LeafHash(out.bytes);
  const Hash chain = Chain(rep_->chain, out.leaf);
  WriteBatch batch;
  batch.Put(Cf::kEvidence, RecordKey(out.index), out.bytes);
  batch.Put(Cf::kEvidence, kHeadKey, json{{"size", out.index + 1}, {"chain", ToHex(chain)}}.dump());
  batch.Put(Cf::kEvidence, "id/" + out.run_id, std::to_string(out.index));
  auto written = rep_->PutForSync(batch);
  if (!written.ok()) return rep_->Stop("writing", out.index, written.status().message());
  *ticket = *written;
  rep_->leaves.push_back(out.leaf);
  rep_->chain = chain;
  if (rep_->leaves.size() - rep_->last_checkpoint >= static_cast<size_t>(rep_->checkpoint_every)) {
    if (auto s = rep_->CheckpointLocked(); !s.ok()) return s;  // synced with the record
  }
  return out;
}

absl::Status EvidenceLog::Checkpoint() {
  MutexLock lock(&rep_->mu);
  return rep_->CheckpointLocked();
}

absl::StatusOr<std::vector<EvidenceRecord>> EvidenceLog::List(size_t limit) {
  std::vector<EvidenceRecord> out;
  uint64_t i = 0;
  auto s =
      rep_->storage->Scan(Cf::kEvidence, "r/", "r0", [&](std::string_view, std::string_view v) {
        EvidenceRecord r;
        r.index = i++;
        r.bytes = std::string(v);
        r.leaf = LeafHash(v);
        auto j = json::parse(r.bytes, nullptr, false);
        if (j.is_object()) r.run_id = j.value("run_id", "");
        out.push_back(std::move(r));
        return true;
      });
  if (!s.ok()) return s;
  if (limit > 0 && out.size() > limit)
    out.erase(out.begin(), out.end() - static_cast<ptrdiff_t>(limit));
  return out;
}

absl::StatusOr<json> EvidenceLog::FindLatest(const std::vector<std::string>& contains,
                                             const std::function<bool(const json&)>& match) {
  json found;
  auto s =
      rep_->storage->Scan(Cf::kEvidence, "r/", "r0", [&](std::string_view, std::string_view v) {
        for (const auto& c : contains) {
          if (v.find(c) == std::string_view::npos) return true;
        }
        auto j = json::parse(v, nullptr, false);
        if (j.is_object() && match(j)) found = std::move(j);
        return true;
      });
  if (!s.ok()) return s;
  return found;
}

absl::StatusOr<EvidenceRecord> EvidenceLog::Get(const std::string& run_id) {
  auto idx = rep_->storage->Get(Cf::kEvidence, "id/" + run_id);
  if (!idx.ok()) return idx.status();
  if (!idx->has_value())
    return absl::NotFoundError(absl::StrCat("no run '", run_id, "' in the evidence log"));
  const uint64_t i = std::stoull(**idx);
  auto v = rep_->storage->Get(Cf::kEvidence, RecordKey(i));
  if (!v.ok()) return v.status();
  if (!v->has_value())
    return absl::DataLossError(absl::StrCat("run '", run_id, "': record ", i, " is missing"));
  EvidenceRecord r;
  r.index = i;
  r.run_id = run_id;
  r.bytes = **v;
  r.leaf = LeafHash(r.bytes);
  return r;
}

std::string EvidenceLog::root_hex() const {
  MutexLock lock(&rep_->mu);
  return ToHex(TreeHead(rep_->leaves, rep_->leaves.size()));
}

absl::StatusOr<std::string> EvidenceLog::Sign(std::string_view message) const {
  MutexLock lock(&rep_->mu);
  return rep_->Sign(std::string(message));
}

uint64_t EvidenceLog::size() const {
  MutexLock lock(&rep_->mu);
  return rep_->leaves.size();
}

std::string EvidenceLog::public_key_hex() const {
  unsigned char pub[32];
  size_t len = sizeof pub;
  if (EVP_PKEY_get_raw_public_key(rep_->key, pub, &len) != 1) return "";
  std::string out;
  for (size_t i = 0; i < len; ++i) absl::StrAppendFormat(&out, "%02x", pub[i]);
  return out;
}

void EvidenceLog::FailWritesForTest(bool fail) {
  MutexLock lock(&rep_->mu);
  rep_->fail_for_test = fail;
}

EvidenceVerifyReport EvidenceLog::Verify() {
  EvidenceVerifyReport rep;
  auto fail = [&](const std::string& what, const std::string& detail) {
    if (rep.ok) {
      rep.ok = false;
      rep.first_bad = what;
      rep.detail = detail;
    }
  };
  // 1. The chain: each record names the chain hash before it and its index.
  std::vector<Hash> leaves;
  std::vector<Hash> chains;  // chain after record i
  Hash chain{};
  uint64_t expect = 0;
  auto s =
      rep_->storage->Scan(Cf::kEvidence, "r/", "r0", [&](std::string_view key, std::string_view v) {
        const uint64_t i = std::stoull(std::string(key.substr(2)));
        if (i != expect) {
          fail(absl::StrCat("record ", expect),
               absl::StrCat("record ", expect, " is missing (the next one is ", i, ")"));
        }
        auto j = json::parse(v, nullptr, false);
        if (!j.is_object()) {
          fail(absl::StrCat("record ", i),
               absl::StrCat("record ", i, " is not valid JSON (its bytes were changed)"));
        } else {
          if (j.value("index", uint64_t{0}) != i) {
            fail(absl::StrCat("record ", i),
                 absl::StrCat("record ", i, " says it is record ", j.value("index", uint64_t{0}),
                              " (records were reordered)"));
          }
          if (j.value("prev", "") != ToHex(chain)) {
            // The previous record's bytes no longer hash to what this one chained to.
            const std::string who = i == 0 ? "record 0" : absl::StrCat("record ", i - 1);
            fail(who, absl::StrCat(who, " does not hash to what record ", i,
                                   " chained to (changed, dropped or reordered)"));
          }
        }
        const Hash leaf = LeafHash(v);
        chain = Chain(chain, leaf);
        leaves.push_back(leaf);
        chains.push_back(chain);
        expect = i + 1;
        return true;
      });
  if (!s.ok()) fail("storage", std::string(s.message()));
  rep.records = leaves.size();
  // 2. The head: a truncated log is shorter than it says.
  auto head = rep_->storage->Get(Cf::kEvidence, kHeadKey);
  if (head.ok() && head->has_value()) {
    auto h = json::parse(**head, nullptr, false);
    const uint64_t size = h.is_object() ? h.value("size", uint64_t{0}) : 0;
    if (size > leaves.size()) {
      fail(
          absl::StrCat("record ", leaves.size()),
          absl::StrCat("the log was truncated: ", leaves.size(), " records, its head says ", size));
    } else if (size == leaves.size() && size > 0 && h.value("chain", "") != ToHex(chains.back())) {
      fail(absl::StrCat("record ", size - 1),
           absl::StrCat("record ", size - 1, " does not hash to the recorded head"));
    }
  }
  // 3. Checkpoints: signature, root over the leaves, consistency with the last one.
  uint64_t prev_size = 0;
  Hash prev_root{};
  s = rep_->storage->Scan(Cf::kEvidence, "c/", "c0", [&](std::string_view, std::string_view v) {
    ++rep.checkpoints;
    auto cp = json::parse(v, nullptr, false);
    const uint64_t size = cp.is_object() ? cp.value("size", uint64_t{0}) : 0;
    const std::string name = absl::StrCat("checkpoint ", size);
    Hash root{}, cchain{};
    if (!cp.is_object() || !FromHex(cp.value("root", ""), root) ||
        !FromHex(cp.value("chain", ""), cchain)) {
      fail(name, name + " is damaged");
      return true;
    }
    std::string sig;
    const std::string sig_hex = cp.value("signature", "");
    for (size_t k = 0; k + 1 < sig_hex.size(); k += 2)
      sig.push_back(static_cast<char>(std::stoi(sig_hex.substr(k, 2), nullptr, 16)));
    if (!rep_->VerifySig(SignedText(size, root, cchain, cp.value("time_us", int64_t{0})), sig)) {
      fail(name, name + ": the signature does not verify with this daemon's key");
    }
    if (size > leaves.size()) {
      fail(absl::StrCat("record ", leaves.size()),
           absl::StrCat(name, " covers ", size, " records but the log has ", leaves.size(),
                        " (truncated)"));
      return true;
    }
    if (TreeHead(leaves, size) != root) {
      // Name the first record whose chain differs from the checkpoint's.
      fail(name, absl::StrCat(name, ": the Merkle root over records 0..", size - 1,
                              " does not match (a record was changed)"));
    } else if (chains[size - 1] != cchain) {
      fail(name, absl::StrCat(name, ": the chain does not match"));
    }
    if (prev_size > 0 && rep.ok) {
      auto proof = ConsistencyProof(leaves, prev_size, size);
      if (!VerifyConsistency(prev_size, size, prev_root, root, proof)) {
        fail(name, absl::StrCat(name, " is not consistent with checkpoint ", prev_size));
      }
    }
    prev_size = size;
    prev_root = root;
    return true;
  });
  // 4. Every record under the last checkpoint has a valid inclusion proof.
  if (rep.ok && prev_size > 0) {
    for (uint64_t i = 0; i < prev_size; ++i) {
      if (!VerifyInclusion(leaves[i], i, prev_size, InclusionProof(leaves, i, prev_size),
                           prev_root)) {
        fail(absl::StrCat("record ", i),
             absl::StrCat("record ", i, " has no valid inclusion proof"));
        break;
      }
    }
  }
  if (rep.ok) {
    rep.detail = absl::StrCat(rep.records, " records, ", rep.checkpoints,
                              " signed checkpoints, chain and Merkle tree intact");
  }
  return rep;
}

}  // namespace fwai
