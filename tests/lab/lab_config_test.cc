// The lab: section of fwaid.yaml.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "common/config.h"

namespace fwai {
namespace {

TEST(LabConfig, ParsesEndpointsNodeAdvertiseAndTtl) {
  auto c = ParseConfig(
      "lab:\n"
      "  etcd: [https://10.0.0.5:2379, https://10.0.0.6:2379]\n"
      "  node: bench-1\n"
      "  advertise: tls:bench1.lab:7443\n"
      "  ttl_s: 4\n"
      "  interactive_first: false\n"
      "  cert: /etc/fwai/tls/bench-1.pem\n"
      "  key: /etc/fwai/tls/bench-1.key\n"
      "  ca: /etc/fwai/tls/ca.pem\n",
      "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->lab.enabled());
  EXPECT_EQ(c->lab.etcd, (std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"}));
  // etcd is reached with the node's own certificate unless others are named.
  EXPECT_TRUE(c->lab.etcd_tls);
  EXPECT_EQ(c->lab.etcd_ca, "/etc/fwai/tls/ca.pem");
  EXPECT_EQ(c->lab.etcd_cert, "/etc/fwai/tls/bench-1.pem");
  EXPECT_EQ(c->lab.etcd_key, "/etc/fwai/tls/bench-1.key");
  // tls: files are read when the config is (their contents are checked at start).
  const std::string t = ::testing::TempDir() + "/lab-config-tls";
  std::filesystem::create_directories(t);
  for (const char* f : {"server.pem", "server.key", "ca.pem", "b.pem", "b.key"})
    std::ofstream(t + "/" + f) << "x\n";
  auto own = ParseConfig(
      "tls: {cert: " + t + "/server.pem, key: " + t + "/server.key, client_ca: " + t +
          "/ca.pem}\n"
          "lab: {etcd: [https://e1:2379], node: b, etcd_cert: /e/b.pem, etcd_key: /e/b.key, "
          "etcd_ca: /e/ca.pem}\n",
      "fwaid.yaml");
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->lab.etcd_cert, "/e/b.pem");
  EXPECT_EQ(own->lab.etcd_ca, "/e/ca.pem");
  auto from_tls = ParseConfig("tls: {cert: " + t + "/b.pem, key: " + t + "/b.key, client_ca: " + t +
                                  "/ca.pem}\nlab: {etcd: [https://e1:2379], node: b}\n",
                              "fwaid.yaml");
  ASSERT_TRUE(from_tls.ok()) << from_tls.status();
  EXPECT_EQ(from_tls->lab.etcd_cert, t + "/b.pem");
  EXPECT_EQ(from_tls->lab.etcd_ca, t + "/ca.pem");
  // Plain http on loopback stays possible (one machine, a test).
  for (const char* local : {"127.0.0.1:2379", "http://localhost:2379", "http://[::1]:2379"}) {
    auto plain =
        ParseConfig(std::string("lab: {etcd: [\"") + local + "\"], node: front}\n", "fwaid.yaml");
    EXPECT_TRUE(plain.ok()) << local << ": " << plain.status();
  }
  EXPECT_EQ(c->lab.node, "bench-1");
  EXPECT_EQ(c->lab.advertise, "tls:bench1.lab:7443");
  EXPECT_EQ(c->lab.ttl_s, 4);
  EXPECT_FALSE(c->lab.interactive_first);
  auto none = ParseConfig("log_level: info\n", "fwaid.yaml");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->lab.enabled());
  auto defaults = ParseConfig("lab: {etcd: [127.0.0.1:2379], node: front}\n", "fwaid.yaml");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->lab.ttl_s, 10);
  EXPECT_EQ(defaults->lab.advertise, "");
  EXPECT_TRUE(defaults->lab.interactive_first);
  auto on = ParseConfig("lab: {etcd: [127.0.0.1:2379], node: front, interactive_first: true}\n",
                        "fwaid.yaml");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->lab.interactive_first);
}

TEST(LabConfig, BadValuesAreRefusedWithFileLineAndField) {
  struct Case {
    std::string yaml, where, what;
  };
  for (const Case& k : std::vector<Case>{
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  ttl: 5\n", "fwaid.yaml:4: lab.ttl",
            "unknown key"},
           {"lab:\n  node: b\n", "fwaid.yaml:2: lab.etcd", "required"},
           {"lab:\n  etcd: []\n  node: b\n", "fwaid.yaml:2: lab.etcd", "expected a list"},
           {"lab:\n  etcd: [127.0.0.1]\n  node: b\n", "fwaid.yaml:2: lab.etcd[]", "HOST:PORT"},
           // etcd in plain text off loopback: anyone on the network could
           // steal or forge leases.
           {"lab:\n  etcd: [http://10.0.0.5:2379]\n  node: b\n", "fwaid.yaml:2: lab.etcd[]",
            "plain http:// to etcd at 10.0.0.5:2379 is refused off loopback"},
           {"lab:\n  etcd: [etcd.lab:2379]\n  node: b\n", "fwaid.yaml:2: lab.etcd[]",
            "lab.etcd_cert"},
           {"lab:\n  etcd: [https://e:2379, http://127.0.0.1:2379]\n  node: b\n",
            "fwaid.yaml:2: lab.etcd[]", "every endpoint"},
           {"lab:\n  etcd: [https://e:2379]\n  node: b\n", "fwaid.yaml:2: lab.etcd", "lab.etcd_ca"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  etcd_cert: /x.pem\n",
            "fwaid.yaml:2: lab.etcd", "use https://"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n", "fwaid.yaml:2: lab.node", "required"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: a/b\n", "fwaid.yaml:3: lab.node", "letters"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  advertise: tcp:h:1\n",
            "fwaid.yaml:4: lab.advertise", "mutual TLS"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  ttl_s: 1\n", "fwaid.yaml:4: lab.ttl_s",
            "2..300"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  interactive_first: maybe\n",
            "fwaid.yaml:4: lab.interactive_first", "expected true"},
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  interactive_first: [true]\n",
            "fwaid.yaml:4: lab.interactive_first", "expected true"},
       }) {
    auto c = ParseConfig(k.yaml, "fwaid.yaml");
    ASSERT_FALSE(c.ok()) << k.yaml;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(k.where), std::string::npos) << c.status();
    EXPECT_NE(c.status().message().find(k.what), std::string::npos) << c.status();
  }
}

}  // namespace
}  // namespace fwai
