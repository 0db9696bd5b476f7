// The evidence log: RFC 6962 test vectors, proofs, tamper detection, fail-stop
// and durability under kill -9, on a real RocksDB.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <rocksdb/env.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "server/evidence/evidence_log.h"
#include "server/evidence/export.h"
#include "server/evidence/merkle.h"
#include "server/storage/storage.h"
#include "tests/unit/held_sync_fs.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

std::string TempDir() {
  std::string t = (fs::temp_directory_path() / "fwai-evidence-XXXXXX").string();
  return mkdtemp(t.data());
}

std::string Unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

// The RFC 6962 reference inputs and tree heads (Certificate Transparency test data).
const std::vector<std::string> kInputs = {"",
                                          "00",
                                          "10",
                                          "2021",
                                          "3031",
                                          "40414243",
                                          "5051525354555657",
                                          "606162636465666768696a6b6c6d6e6f"};
const std::vector<std::string> kRoots = {
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328"};

std::vector<Hash> ReferenceLeaves() {
  std::vector<Hash> out;
  for (const auto& in : kInputs) out.push_back(LeafHash(Unhex(in)));
  return out;
}

TEST(MerkleTest, TreeHeadsMatchTheRfc6962Vectors) {
  auto leaves = ReferenceLeaves();
  for (size_t n = 0; n <= 8; ++n) EXPECT_EQ(ToHex(TreeHead(leaves, n)), kRoots[n]) << "size " << n;
}

TEST(MerkleTest, InclusionProofsMatchTheReferenceAndVerify) {
  auto leaves = ReferenceLeaves();
  auto p0 = InclusionProof(leaves, 0, 8);
  ASSERT_EQ(p0.size(), 3u);
  EXPECT_EQ(ToHex(p0[0]), "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7");
  EXPECT_EQ(ToHex(p0[1]), "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e");
  EXPECT_EQ(ToHex(p0[2]), "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4");
  auto p5 = InclusionProof(leaves, 5, 8);
  ASSERT_EQ(p5.size(), 3u);
  EXPECT_EQ(ToHex(p5[0]), "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b");
  EXPECT_EQ(ToHex(p5[2]), "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7");
  // Every leaf of every tree size verifies; a wrong leaf or root does not.
  std::vector<Hash> many;
  for (int i = 0; i < 37; ++i) many.push_back(LeafHash(std::string(1, static_cast<char>(i))));
  for (size_t n = 1; n <= many.size(); ++n) {
    const Hash root = TreeHead(many, n);
    for (size_t m = 0; m < n; ++m) {
      auto proof = InclusionProof(many, m, n);
      ASSERT_TRUE(VerifyInclusion(many[m], m, n, proof, root)) << m << "/" << n;
      EXPECT_FALSE(VerifyInclusion(many[(m + 1) % many.size()], m, n, proof, root) && n > 1)
          << m << "/" << n;
    }
  }
}

TEST(MerkleTest, ConsistencyProofsVerifyForEveryPairOfSizes) {
  std::vector<Hash> many;
  for (int i = 0; i < 21; ++i) many.push_back(LeafHash(std::to_string(i)));
  for (size_t n = 1; n <= many.size(); ++n) {
    for (size_t m = 1; m <= n; ++m) {
      auto proof = ConsistencyProof(many, m, n);
      EXPECT_TRUE(VerifyConsistency(m, n, TreeHead(many, m), TreeHead(many, n), proof))
          << m << "->" << n;
      if (m < n) {
        Hash wrong = TreeHead(many, m);
        wrong[0] ^= 1;
        EXPECT_FALSE(VerifyConsistency(m, n, wrong, TreeHead(many, n), proof)) << m << "->" << n;
      }
    }
  }
}

class EvidenceLogTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = TempDir(); }
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<Storage> OpenDb() {
    auto db = Storage::Open(dir_ + "/db");
    EXPECT_TRUE(db.ok()) << db.status();
    return std::move(*db);
  }
  std::unique_ptr<EvidenceLog> OpenLog(Storage& db, int every = 4) {
    auto log = EvidenceLog::Open(db, dir_ + "/keys/evidence.pem", every);
    EXPECT_TRUE(log.ok()) << log.status();
    return std::move(*log);
  }
  void Fill(EvidenceLog& log, int n) {
    for (int i = 0; i < n; ++i) ASSERT_TRUE(log.Append({{"kind", "turn"}, {"n", i}}).ok());
  }
  std::string dir_;
};

TEST_F(EvidenceLogTest, AppendsVerifyAcrossRestartsWithAPrivateKey) {
  std::string pub;
  {
    auto db = OpenDb();
    auto log = OpenLog(*db);
    Fill(*log, 10);
    pub = log->public_key_hex();
    EXPECT_EQ(pub.size(), 64u);
    auto r = log->Verify();
    EXPECT_TRUE(r.ok) << r.detail;
    EXPECT_EQ(r.records, 10u);
    EXPECT_EQ(r.checkpoints, 2u);  // every 4
  }
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/keys/evidence.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  auto db = OpenDb();
  auto log = OpenLog(*db);
  EXPECT_EQ(log->public_key_hex(), pub);  // the same key after a restart
  auto r = log->Verify();
  EXPECT_TRUE(r.ok) << r.detail;
  EXPECT_EQ(r.checkpoints, 3u);  // one more signed at shutdown
  auto rec = log->Append({{"kind", "flash"}, {"sha256", "ab12"}});
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->index, 10u);
  auto got = log->Get(rec->run_id);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->bytes, rec->bytes);
  EXPECT_NE(got->bytes.find("\"sha256\":\"ab12\""), std::string::npos);
}

// A key file left empty by a crash while it was first written (as an older
// fwaid could leave it) never signed anything: the log starts and makes a
// key. A key file with anything else in it is refused, and left as it is.
TEST_F(EvidenceLogTest, AnEmptyKeyFromACrashIsReplacedAndAnyOtherBadKeyIsRefusedAndKept) {
  const std::string key = dir_ + "/keys/evidence.pem";
  fs::create_directories(dir_ + "/keys");
  std::ofstream(key).close();  // empty
  {
    auto db = OpenDb();
    auto log = OpenLog(*db);
    ASSERT_NE(log, nullptr);
    Fill(*log, 5);
    EXPECT_EQ(log->public_key_hex().size(), 64u);
  }
  EXPECT_GT(fs::file_size(key), 0u);
  EXPECT_EQ(fs::status(key).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  // No temporary file left beside it.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir_ + "/keys")) files += e.is_regular_file();
  EXPECT_EQ(files, 1);
  // Garbage where the key was: refused, and nothing overwritten.
  std::ofstream(key, std::ios::trunc) << "-----BEGIN PRIVATE KEY-----\nnot a key\n";
  auto db = OpenDb();
  auto bad = EvidenceLog::Open(*db, key, 4);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  std::ifstream in(key);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "-----BEGIN PRIVATE KEY-----");
}

TEST_F(EvidenceLogTest, FlippedByteTruncationReorderAndDropAreCaught) {
  auto tamper = [&](const std::function<void(Storage&)>& change, const std::string& expect_bad) {
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    {
      auto db = OpenDb();
      auto log = OpenLog(*db);
      Fill(*log, 10);
    }
    {
      auto db = OpenDb();
      change(*db);
    }
    auto db = OpenDb();
    auto log = OpenLog(*db);
    auto r = log->Verify();
    EXPECT_FALSE(r.ok) << expect_bad;
    EXPECT_EQ(r.first_bad, expect_bad) << r.detail;
  };
  auto key = [](int i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "r/%020d", i);
    return std::string(buf);
  };
  // One byte of record 3 flipped.
  tamper(
      [&](Storage& db) {
        auto v = db.Get(Cf::kEvidence, key(3));
        std::string s = **v;
        s[s.find("\"n\":3") + 4] = '7';
        ASSERT_TRUE(db.Put(Cf::kEvidence, key(3), s, true).ok());
      },
      "record 3");
  // The last two records cut off.
  tamper(
      [&](Storage& db) {
        ASSERT_TRUE(db.Delete(Cf::kEvidence, key(9), true).ok());
        ASSERT_TRUE(db.Delete(Cf::kEvidence, key(8), true).ok());
      },
      "record 8");
  // Two records swapped.
  tamper(
      [&](Storage& db) {
        auto a = db.Get(Cf::kEvidence, key(5));
        auto b = db.Get(Cf::kEvidence, key(6));
        ASSERT_TRUE(db.Put(Cf::kEvidence, key(5), **b, true).ok());
        ASSERT_TRUE(db.Put(Cf::kEvidence, key(6), **a, true).ok());
      },
      "record 5");
  // A record in the middle dropped.
  tamper([&](Storage& db) { ASSERT_TRUE(db.Delete(Cf::kEvidence, key(2), true).ok()); },
         "record 2");
}

TEST_F(EvidenceLogTest, AFailedWriteStopsTheLog) {
  auto db = OpenDb();
  auto log = OpenLog(*db);
  Fill(*log, 3);
  log->FailWritesForTest(true);
  auto r = log->Append({{"kind", "turn"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("evidence log stopped"), std::string::npos) << r.status();
  log->FailWritesForTest(false);
  auto again = log->Append({{"kind", "turn"}});
  ASSERT_FALSE(again.ok());  // fail-stop: not silently continued
  EXPECT_NE(again.status().message().find("record 3"), std::string::npos);
  EXPECT_TRUE(log->Verify().ok);  // what was stored is intact
}

// Turns that end together record their runs together: while one record's
// sync waits for the disk, the next records are chained and written (not
// queued behind that sync under the log's lock), and they share one sync.
// None is answered before it is durable.
TEST_F(EvidenceLogTest, RecordsAppendedTogetherShareOneSyncAndNoneIsAnsweredBeforeIt) {
  HeldStore held;
  HeldSyncFs* fs = held.fs.get();
  auto opened = held.Open(dir_ + "/db");
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<Storage> db = std::move(*opened);
  auto log = OpenLog(*db, /*every=*/1000);
  // Declared before the guard: destroyed after it, once the disk is released.
  std::future<absl::StatusOr<EvidenceRecord>> first;
  std::vector<std::future<absl::StatusOr<EvidenceRecord>>> next;
  fs->Hold(true);
  struct Release {  // whatever fails below, the appends can end
    HeldSyncFs* fs;
    ~Release() { fs->Hold(false); }
  } release{fs};
  const int syncs_before = fs->syncs();
  first = std::async(std::launch::async, [&] {
    return log->Append({{"kind", "turn"}, {"run_id", "run-a"}});
  });
  ASSERT_TRUE(fs->WaitForHeldSync()) << "the first record never synced the log";
  for (const char* id : {"run-b", "run-c", "run-d"}) {
    next.push_back(std::async(std::launch::async, [&log, id] {
      return log->Append({{"kind", "turn"}, {"run_id", id}});
    }));
  }
  // The later records reach the store while the first one's sync is held
  // (and are chained: the log's size counts them once their tickets are taken).
  bool written = false;
  for (int i = 0; i < 30000 && !written; ++i) {
    written = true;
    for (const char* id : {"run-b", "run-c", "run-d"}) {
      auto r = db->Get(Cf::kEvidence, std::string("id/") + id);
      written = written && r.ok() && r->has_value();
    }
    written = written && log->size() == 4;
    if (!written) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  bool answered_early = first.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  for (auto& f : next)
    answered_early =
        answered_early || f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
  fs->Hold(false);
  EXPECT_TRUE(written) << "a record waited for another record's sync under the log's lock";
  EXPECT_FALSE(answered_early) << "a record was answered before its log sync";
  auto a = first.get();
  ASSERT_TRUE(a.ok()) << a.status();
  std::set<uint64_t> indexes{a->index};
  for (auto& f : next) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    indexes.insert(r->index);
  }
  EXPECT_EQ(indexes, (std::set<uint64_t>{0, 1, 2, 3}));
  // The first record's sync, then one for the three written behind it.
  EXPECT_EQ(fs->syncs() - syncs_before, 2);
  EXPECT_TRUE(log->Verify().ok);
  EXPECT_EQ(log->size(), 4u);
}

TEST_F(EvidenceLogTest, EveryAcknowledgedRecordSurvivesKillNine) {
  int pipefd[2];
  ASSERT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    close(pipefd[0]);
    auto db = Storage::Open(dir_ + "/db");
    if (!db.ok()) _exit(2);
    auto log = EvidenceLog::Open(**db, dir_ + "/keys/evidence.pem", 7);
    if (!log.ok()) _exit(3);
    for (uint32_t i = 0;; ++i) {
      if (!(*log)->Append({{"kind", "turn"}, {"n", i}}).ok()) _exit(4);
      if (write(pipefd[1], &i, sizeof i) != sizeof i) _exit(5);  // acknowledged
    }
  }
  close(pipefd[1]);
  uint32_t acked = 0, v = 0;
  int got = 0;
  while (got < 200 && read(pipefd[0], &v, sizeof v) == sizeof v) {
    acked = v;
    ++got;
  }
  kill(pid, SIGKILL);
  // Drain what the child acknowledged before it died.
  while (read(pipefd[0], &v, sizeof v) == sizeof v) acked = v;
  close(pipefd[0]);
  waitpid(pid, nullptr, 0);
  auto db = OpenDb();
  auto log = OpenLog(*db);
  EXPECT_GE(log->size(), acked + 1);
  auto r = log->Verify();
  EXPECT_TRUE(r.ok) << r.first_bad << ": " << r.detail;
}

}  // namespace
}  // namespace fwai

namespace fwai {
namespace {

TEST_F(EvidenceLogTest, ExportsSarifHtmlAndASignedInTotoStatement) {
  auto db = OpenDb();
  auto log = OpenLog(*db);
  const std::string sha(64, 'a');
  nlohmann::json run = {
      {"kind", "skill_run"},
      {"skill", "build"},
      {"project", "/work/fw"},
      {"ok", false},
      {"exit_code", 12},
      {"failure_class", "build"},
      {"steps", {{{"name", "build"}, {"command", "make <all>"}, {"exit_code", 2}, {"ok", false}}}},
      {"images", {{{"path", "build/fw.elf"}, {"sha256", sha}, {"board", "sim"}}}},
      {"diagnostic_items",
       {{{"kind", "compiler"},
         {"severity", "error"},
         {"file", "src/main.c"},
         {"line", 12},
         {"column", 5},
         {"message", "'x' undeclared"},
         {"step", "build"}},
        {{"kind", "region_overflow"},
         {"severity", "error"},
         {"region", "FLASH"},
         {"bytes", 20},
         {"message", "region `FLASH' overflowed by 20 bytes"},
         {"step", "build"}}}}};
  auto r1 = log->Append(run);
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(log->Append({{"kind", "flash"},
                           {"board", "sim"},
                           {"image", "fw.elf"},
                           {"image_sha256", std::string(64, 'b')}})
                  .ok());
  auto records = log->List(0);
  ASSERT_TRUE(records.ok());
  ASSERT_EQ(records->size(), 2u);

  auto sarif = nlohmann::json::parse(ExportSarif(*records, "1.2.3"));
  EXPECT_EQ(sarif["version"], "2.1.0");
  ASSERT_EQ(sarif["runs"].size(), 1u);  // one per skill run
  const auto& results = sarif["runs"][0]["results"];
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0]["ruleId"], "compiler");
  EXPECT_EQ(results[0]["level"], "error");
  EXPECT_EQ(results[0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"],
            "src/main.c");
  EXPECT_EQ(results[0]["locations"][0]["physicalLocation"]["region"]["startLine"], 12);
  EXPECT_EQ(results[1]["ruleId"], "region_overflow");
  EXPECT_EQ(results[1]["properties"]["region"], "FLASH");
  EXPECT_EQ(sarif["runs"][0]["invocations"][0]["exitCode"], 12);

  const std::string html =
      ExportHtml(*records, log->Verify(), log->public_key_hex(), log->root_hex());
  EXPECT_NE(html.find("<strong class=\"ok\">intact</strong>"), std::string::npos);
  EXPECT_NE(html.find("make &lt;all&gt;"), std::string::npos);  // escaped
  EXPECT_EQ(html.find("make <all>"), std::string::npos);
  EXPECT_NE(html.find(log->root_hex()), std::string::npos);

  auto env_text = ExportInToto(*records, log->root_hex(), log->public_key_hex(),
                               [&](std::string_view m) { return log->Sign(m); });
  ASSERT_TRUE(env_text.ok()) << env_text.status();
  auto env = nlohmann::json::parse(*env_text);
  EXPECT_EQ(env["payloadType"], "application/vnd.in-toto+json");
  std::string payload;
  ASSERT_TRUE(absl::Base64Unescape(env["payload"].get<std::string>(), &payload));
  auto statement = nlohmann::json::parse(payload);
  EXPECT_EQ(statement["_type"], "https://in-toto.io/Statement/v1");
  ASSERT_EQ(statement["subject"].size(), 2u);
  EXPECT_EQ(statement["subject"][0]["digest"]["sha256"], sha);
  EXPECT_EQ(statement["predicate"]["log"]["root_hash"], log->root_hex());
  // The signature verifies over DSSE's PAE with the log's public key, and
  // fails for a changed payload.
  std::string sig;
  ASSERT_TRUE(absl::Base64Unescape(env["signatures"][0]["sig"].get<std::string>(), &sig));
  std::string pub;
  pub = absl::HexStringToBytes(log->public_key_hex());
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(pub.data()), pub.size());
  ASSERT_NE(key, nullptr);
  auto verify = [&](const std::string& body) {
    const std::string pae = DssePae("application/vnd.in-toto+json", body);
    EVP_MD_CTX* ctx = EVP_MD_CTX_new();
    bool ok = EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
              EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                               reinterpret_cast<const unsigned char*>(pae.data()), pae.size()) == 1;
    EVP_MD_CTX_free(ctx);
    return ok;
  };
  EXPECT_TRUE(verify(payload));
  std::string tampered = payload;
  tampered[tampered.find("aaaa")] = 'c';
  EXPECT_FALSE(verify(tampered));
  EVP_PKEY_free(key);
  EXPECT_EQ(DssePae("t", "hello"), "DSSEv1 1 t 5 hello");
}

}  // namespace
}  // namespace fwai
