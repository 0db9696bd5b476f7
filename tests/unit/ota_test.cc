// MCUboot images (package, parse, hash, Ed25519 signature, trailer), the
// simulated boards' bootloader (bootutil's swap table over two slot files)
// and rollout stages.
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/mcuboot.h"
#include "server/hardware/sim_mcuboot.h"
#include "server/ota/rollout.h"
#include "tests/integration/daemon_fixture.h"

namespace fwai {
namespace {

namespace fs = std::filesystem;

std::string NewKeyPem() {
  EVP_PKEY* key = nullptr;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  EVP_PKEY_keygen_init(ctx);
  EVP_PKEY_keygen(ctx, &key);
  EVP_PKEY_CTX_free(ctx);
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<size_t>(n));
  BIO_free(bio);
  EVP_PKEY_free(key);
  return pem;
}

std::string Payload(char fill, size_t n = 3000) {
  std::string p(n, fill);
  // A vector table: initial SP in RAM, reset handler in flash.
  const unsigned char vt[8] = {0x00, 0x20, 0x00, 0x20, 0x41, 0x00, 0x00, 0x08};
  std::memcpy(p.data(), vt, sizeof vt);
  return p;
}

std::string Image(const std::string& version, char fill, const std::string& key = "") {
  mcuboot::PackageOptions o;
  o.version = *mcuboot::Version::Parse(version);
  o.key_pem = key;
  auto img = mcuboot::Package(Payload(fill), o);
  EXPECT_TRUE(img.ok()) << img.status();
  return *img;
}

TEST(McubootTest, PackagesAndParsesWhatItWrote) {
  const std::string key = NewKeyPem();
  mcuboot::PackageOptions o;
  o.version = *mcuboot::Version::Parse("1.2.3+7");
  o.key_pem = key;
  o.security_counter = 0x01020003;
  const std::string payload = Payload('x');
  auto img = mcuboot::Package(payload, o);
  ASSERT_TRUE(img.ok()) << img.status();
  // The header, as bootutil's struct image_header lays it out.
  EXPECT_EQ(static_cast<uint8_t>((*img)[0]), 0x3d);
  EXPECT_EQ(static_cast<uint8_t>((*img)[3]), 0x96);
  auto info = mcuboot::Parse(*img);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->header_size, 0x200);
  EXPECT_EQ(info->image_size, payload.size());
  EXPECT_EQ(info->version.ToString(), "1.2.3+7");
  EXPECT_EQ(img->substr(0x200, payload.size()), payload);
  EXPECT_TRUE(info->hash_ok);
  EXPECT_TRUE(info->has_signature);
  ASSERT_TRUE(info->security_counter.has_value());
  EXPECT_EQ(*info->security_counter, 0x01020003u);
  EXPECT_EQ(info->protected_tlv_size, 12);  // info header + SEC_CNT TLV
  EXPECT_EQ(info->hashed_size, 0x200 + payload.size() + 12);
  EXPECT_EQ(info->key_hash_hex, *mcuboot::KeyHashHex(key));
  EXPECT_TRUE(mcuboot::VerifySignature(*img, *info, key).ok());
}

TEST(McubootTest, AnotherKeyOrAChangedByteIsCaught) {
  const std::string key = NewKeyPem();
  const std::string img = Image("1.0.0", 'a', key);
  auto info = mcuboot::Parse(img);
  ASSERT_TRUE(info.ok());
  auto other = mcuboot::VerifySignature(img, *info, NewKeyPem());
  EXPECT_EQ(other.code(), absl::StatusCode::kPermissionDenied) << other;
  std::string flipped = img;
  flipped[0x200 + 100] ^= 1;
  auto finfo = mcuboot::Parse(flipped);
  ASSERT_TRUE(finfo.ok());
  EXPECT_FALSE(finfo->hash_ok);
  EXPECT_FALSE(mcuboot::VerifySignature(flipped, *finfo, key).ok());
  // A signature that no longer matches its digest.
  std::string badsig = img;
  badsig[badsig.size() - 1] ^= 1;
  auto binfo = mcuboot::Parse(badsig);
  ASSERT_TRUE(binfo.ok());
  EXPECT_TRUE(binfo->hash_ok);
  EXPECT_FALSE(mcuboot::VerifySignature(badsig, *binfo, key).ok());
}

TEST(McubootTest, MalformedImagesNameTheOffset) {
  auto r = mcuboot::Parse("short");
  EXPECT_NE(std::string(r.status().message()).find("shorter than the header"), std::string::npos)
      << r.status();
  std::string img = Image("1.0.0", 'b');
  img[0] = 0;
  r = mcuboot::Parse(img);
  EXPECT_NE(std::string(r.status().message()).find("ih_magic"), std::string::npos) << r.status();
  img = Image("1.0.0", 'b');
  r = mcuboot::Parse(img.substr(0, img.size() - 10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(mcuboot::Version::Parse("1.x").ok());
  EXPECT_FALSE(mcuboot::Version::Parse("256.0.0").ok());
}

TEST(McubootTest, PaddedToASlotCarriesTheTrailer) {
  mcuboot::PackageOptions o;
  o.version = *mcuboot::Version::Parse("1.0.0");
  o.slot_size = 64 * 1024;
  o.confirm = true;
  auto img = mcuboot::Package(Payload('c'), o);
  ASSERT_TRUE(img.ok());
  ASSERT_EQ(img->size(), 64u * 1024);
  // boot_img_magic in the last 16 bytes, image_ok 8 bytes before it.
  EXPECT_EQ(static_cast<uint8_t>((*img)[img->size() - 16]), 0x77);
  EXPECT_EQ(static_cast<uint8_t>((*img)[img->size() - 1]), 0x80);
  EXPECT_EQ(static_cast<uint8_t>((*img)[img->size() - 24]), 0x01);
  auto info = mcuboot::Parse(*img);
  ASSERT_TRUE(info.ok());
  ASSERT_TRUE(info->trailer.has_value());
  EXPECT_EQ(info->trailer->magic, mcuboot::Magic::kGood);
  EXPECT_EQ(info->trailer->image_ok, mcuboot::Flag::kSet);
  o.slot_size = 4096;
  EXPECT_FALSE(mcuboot::Package(Payload('c'), o).ok());
}

class SimMcubootTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("simboot"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(SimMcubootTest, TestBootThenRevertWithoutConfirm) {
  SimMcuboot boot(dir_, 64 * 1024, {});
  ASSERT_TRUE(boot.Init().ok());
  auto empty = boot.Boot();
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->bootable);
  ASSERT_TRUE(boot.Program(Image("1.0.0", 'a')).ok());
  auto first = boot.Boot();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->swap, "none");
  EXPECT_TRUE(first->bootable);
  EXPECT_EQ(first->primary.version, "1.0.0");
  EXPECT_EQ(first->payload, Payload('a'));

  ASSERT_TRUE(boot.Stage(Image("1.1.0", 'b'), false).ok());
  auto test = boot.Boot();
  ASSERT_TRUE(test.ok());
  EXPECT_EQ(test->swap, "test");
  EXPECT_EQ(test->primary.version, "1.1.0");
  EXPECT_EQ(test->primary.image_ok, "unset");
  EXPECT_EQ(test->primary.copy_done, "set");
  EXPECT_EQ(boot.State(1)->version, "1.0.0");
  // Not confirmed: the next power-on swaps back, and for good.
  auto revert = boot.Boot();
  ASSERT_TRUE(revert.ok());
  EXPECT_EQ(revert->swap, "revert");
  EXPECT_EQ(revert->primary.version, "1.0.0");
  EXPECT_EQ(revert->primary.image_ok, "set");
  EXPECT_EQ(boot.Boot()->swap, "none");
  EXPECT_EQ(boot.Boot()->primary.version, "1.0.0");
}

TEST_F(SimMcubootTest, ConfirmedUpdateStaysAndCanBeTakenBack) {
  SimMcuboot boot(dir_, 64 * 1024, {});
  ASSERT_TRUE(boot.Init().ok());
  ASSERT_TRUE(boot.Program(Image("1.0.0", 'a')).ok());
  ASSERT_TRUE(boot.Stage(Image("1.1.0", 'b'), false).ok());
  ASSERT_EQ(boot.Boot()->swap, "test");
  ASSERT_TRUE(boot.Confirm().ok());
  auto again = boot.Boot();
  EXPECT_EQ(again->swap, "none");
  EXPECT_EQ(again->primary.version, "1.1.0");
  // Taking a confirmed update back: the previous image, permanently.
  ASSERT_TRUE(boot.RestorePrevious().ok());
  auto back = boot.Boot();
  EXPECT_EQ(back->swap, "perm");
  EXPECT_EQ(back->primary.version, "1.0.0");
  EXPECT_EQ(back->primary.image_ok, "set");
  EXPECT_EQ(boot.Boot()->primary.version, "1.0.0");
}

TEST_F(SimMcubootTest, UnsignedOrDamagedUpdateIsRefusedAndErased) {
  const std::string key = NewKeyPem();
  SimMcuboot boot(dir_, 64 * 1024, {key});
  ASSERT_TRUE(boot.Init().ok());
  ASSERT_TRUE(boot.Program(Image("1.0.0", 'a', key)).ok());
  ASSERT_TRUE(boot.Boot()->bootable);
  ASSERT_TRUE(boot.Stage(Image("1.1.0", 'b'), false).ok());  // not signed
  auto r = boot.Boot();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->swap, "fail");
  EXPECT_NE(r->detail.find("signature"), std::string::npos) << r->detail;
  EXPECT_EQ(r->primary.version, "1.0.0");
  EXPECT_FALSE(boot.State(1)->has_image);
  std::string damaged = Image("1.2.0", 'c', key);
  damaged[0x300] ^= 0x40;
  ASSERT_TRUE(boot.Stage(damaged, false).ok());
  r = boot.Boot();
  EXPECT_EQ(r->swap, "fail");
  EXPECT_EQ(r->primary.version, "1.0.0");
  EXPECT_EQ(boot.Boot()->swap, "none");
}

TEST(RolloutStagesTest, CumulativeCountsAndPercentages) {
  auto c = StageCounts({"1", "25%", "100%"}, 5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(*c, (std::vector<size_t>{1, 2, 5}));
  c = StageCounts({"1", "20%", "100%"}, 5);  // 20% of 5 is the 1 board already done
  EXPECT_EQ(*c, (std::vector<size_t>{1, 5}));
  EXPECT_EQ(*StageCounts({}, 3), (std::vector<size_t>{3}));
  EXPECT_EQ(*StageCounts({"10"}, 3), (std::vector<size_t>{3}));
  auto bad = StageCounts({"50%", "1"}, 10);
  EXPECT_NE(std::string(bad.status().message()).find("cumulative"), std::string::npos)
      << bad.status();
  EXPECT_FALSE(StageCounts({"0"}, 3).ok());
  EXPECT_FALSE(StageCounts({"150%"}, 3).ok());
  EXPECT_FALSE(StageCounts({"x"}, 3).ok());
}

}  // namespace
}  // namespace fwai
