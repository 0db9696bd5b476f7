// The lab: section of fwaid.yaml.
#include <gtest/gtest.h>

#include "common/config.h"

namespace fwai {
namespace {

TEST(LabConfig, ParsesEndpointsNodeAdvertiseAndTtl) {
  auto c = ParseConfig(
      "lab:\n"
      "  etcd: [http://10.0.0.5:2379, 10.0.0.6:2379]\n"
      "  node: bench-1\n"
      "  advertise: tls:bench1.lab:7443\n"
      "  ttl_s: 4\n"
      "  interactive_first: false\n",
      "fwaid.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->lab.enabled());
  EXPECT_EQ(c->lab.etcd, (std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"}));
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
  auto on = ParseConfig("lab: {etcd: [127.0.0.1:2379], node: front, interactive_first: true}\n", "fwaid.yaml");
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_TRUE(on->lab.interactive_first);
}

TEST(LabConfig, BadValuesAreRefusedWithFileLineAndField) {
  struct Case {
    std::string yaml, where, what;
  };
  for (const Case& k : std::vector<Case>{
           {"lab:\n  etcd: [127.0.0.1:2379]\n  node: b\n  ttl: 5\n", "fwaid.yaml:4: lab.ttl", "unknown key"},
           {"lab:\n  node: b\n", "fwaid.yaml:2: lab.etcd", "required"},
           {"lab:\n  etcd: []\n  node: b\n", "fwaid.yaml:2: lab.etcd", "expected a list"},
           {"lab:\n  etcd: [127.0.0.1]\n  node: b\n", "fwaid.yaml:2: lab.etcd[]", "HOST:PORT"},
           {"lab:\n  etcd: [https://e:2379]\n  node: b\n", "fwaid.yaml:2: lab.etcd[]", "TLS to etcd"},
           {"lab:\n  etcd: [e:2379]\n", "fwaid.yaml:2: lab.node", "required"},
           {"lab:\n  etcd: [e:2379]\n  node: a/b\n", "fwaid.yaml:3: lab.node", "letters"},
           {"lab:\n  etcd: [e:2379]\n  node: b\n  advertise: tcp:h:1\n", "fwaid.yaml:4: lab.advertise", "mutual TLS"},
           {"lab:\n  etcd: [e:2379]\n  node: b\n  ttl_s: 1\n", "fwaid.yaml:4: lab.ttl_s", "2..300"},
           {"lab:\n  etcd: [e:2379]\n  node: b\n  interactive_first: maybe\n", "fwaid.yaml:4: lab.interactive_first",
            "expected true"},
           {"lab:\n  etcd: [e:2379]\n  node: b\n  interactive_first: [true]\n",
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
