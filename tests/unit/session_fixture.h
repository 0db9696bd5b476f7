// A SessionManager over a real RocksDB store in a temporary directory, and
// helpers to publish and read events: the fixture of the session and event
// pump tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "fwai/v1/events.pb.h"
#include "server/session/session_manager.h"
#include "server/storage/storage.h"

namespace fwai {

class SessionFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (std::filesystem::temp_directory_path() / "fwai-session-XXXXXX").string();
    dir_ = mkdtemp(t.data());
    std::filesystem::create_directories(dir_ + "/proj");
    auto db = Storage::Open(dir_ + "/db");
    ASSERT_TRUE(db.ok());
    storage_ = *std::move(db);
  }
  void TearDown() override {
    sessions_.reset();
    storage_.reset();
    std::filesystem::remove_all(dir_);
  }
  SessionManager& Sessions(SubscriberConfig limits = {}) {
    if (!sessions_) sessions_ = std::make_unique<SessionManager>(*storage_, limits);
    return *sessions_;
  }
  static std::string Text(const std::string& t, const std::string& turn = "t1") {
    fwai::v1::ServerEvent ev;
    ev.set_turn_id(turn);
    ev.mutable_text_delta()->mutable_origin()->set_agent("main");
    ev.mutable_text_delta()->set_text(t);
    return ev.SerializeAsString();
  }
  static std::string Finished() {
    fwai::v1::ServerEvent ev;
    ev.set_turn_id("t1");
    ev.mutable_turn_finished()->set_stop_reason("end_turn");
    return ev.SerializeAsString();
  }
  std::vector<fwai::v1::ServerEvent> Drain(Subscriber& sub, absl::Status* final_status = nullptr,
                                           bool* closed = nullptr) {
    std::vector<fwai::v1::ServerEvent> out;
    std::string bytes;
    absl::Status st;
    while (true) {
      auto r = sub.Pull(&bytes, &st);
      if (r == Subscriber::PullResult::kEvent) {
        fwai::v1::ServerEvent ev;
        ev.ParseFromString(bytes);
        out.push_back(ev);
        continue;
      }
      if (closed) *closed = r == Subscriber::PullResult::kClosed;
      if (final_status) *final_status = st;
      return out;
    }
  }

  std::string dir_;
  std::unique_ptr<Storage> storage_;
  std::unique_ptr<SessionManager> sessions_;
};

}  // namespace fwai
