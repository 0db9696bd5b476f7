// Ota: rollouts (a stream of state changes on their own thread; the client
// going away cancels the rollout), their history, and the boards' slots.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "fwai/v1/ota.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/caller.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/api/queued_writer.h"
#include "server/ota/rollout.h"

namespace fwai {
namespace {

namespace pb = ::fwai::v1;

constexpr int kMaxRollouts = 8;

class OtaService final : public pb::Ota::CallbackService {
 public:
  explicit OtaService(ApiDeps deps) : deps_(std::move(deps)) {}
  ~OtaService() override {
    for (int i = 0; i < 500 && running_ > 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  grpc::ServerWriteReactor<pb::RolloutEvent>* Rollout(grpc::CallbackServerContext* ctx,
                                                      const pb::RolloutRequest* req) override {
    auto* svc = this;
    using Stream = WorkStreamReactor<pb::RolloutEvent>;
    return Stream::Serve(
        deps_.rollouts != nullptr, "over-the-air rollouts are not available",
        [&](Stream& stream, const std::shared_ptr<Stream::State>& st) {
          if (req->image().empty()) {
            st->writer.Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "image: required"));
            return;
          }
          if (req->boards().empty()) {
            st->writer.Close(
                grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "boards: name board ids or tags"));
            return;
          }
          if (req->max_failure_rate() > 1) {
            st->writer.Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "max_failure_rate: expected 0..1"));
            return;
          }
          RolloutRequest r;
          if (!req->project_root().empty()) {
            auto root = CanonicalProjectRoot(req->project_root());
            if (!root.ok()) {
              st->writer.Close(ToGrpcStatus(root.status()));
              return;
            }
            r.project_root = *root;
          } else if (!req->health_skill().empty()) {
            st->writer.Close(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                          "project_root: required with a health skill"));
            return;
          }
          if (svc->running_ >= kMaxRollouts) {
            st->writer.Close(grpc::Status(
                grpc::StatusCode::RESOURCE_EXHAUSTED,
                absl::StrCat(kMaxRollouts, " rollouts are under way; try again when one ends")));
            return;
          }
          r.image_path = req->image();
          r.boards.assign(req->boards().begin(), req->boards().end());
          r.stages.assign(req->stages().begin(), req->stages().end());
          r.health_skill = req->health_skill();
          r.max_failure_rate = req->max_failure_rate();
          r.force = req->force();
          auto who = svc->deps_.gate->Admit(ctx, "Ota.Rollout");
          if (!who.ok()) {
            st->writer.Close(ToGrpcStatus(who.status()));
            return;
          }
          r.caller = CallerFor(*who, ctx);
          // A revoked or expired token cancels the rollout as the client's
          // cancel does, and ends the stream with the gate's status.
          stream.Track(*svc->deps_.gate, *who, ctx);
          svc->running_++;
          std::thread([svc, st, r = std::move(r)] {
            auto result = svc->deps_.rollouts->Run(
                r,
                [&](const RolloutEvent& e) {
                  pb::RolloutEvent out;
                  out.set_rollout_id(e.data.is_object() ? e.data.value("rollout_id", "") : "");
                  out.set_kind(e.kind);
                  out.set_board(e.board);
                  out.set_state(e.state);
                  out.set_text(e.text);
                  if (!e.data.is_null()) out.set_json(e.data.dump());
                  std::atomic<bool> stop{false};
                  st->writer.WaitBelow(1024, stop);
                  st->writer.Push(std::move(out));
                },
                st->cancel);
            (void)result;
            st->writer.Close(grpc::Status::OK);
            svc->running_--;
          }).detach();
        });
  }

  grpc::ServerUnaryReactor* ListRollouts(grpc::CallbackServerContext* ctx,
                                         const pb::ListRolloutsRequest* req,
                                         pb::ListRolloutsResponse* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Ota.ListRollouts"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.rollouts != nullptr,
                        "over-the-air rollouts are not available", [this, req, resp] {
                          int limit = req->limit() <= 0 ? 20 : std::min(req->limit(), 1000);
                          auto all = deps_.rollouts->List(static_cast<size_t>(limit));
                          if (!all.ok()) return all.status();
                          for (const auto& r : *all) resp->add_rollouts()->set_json(r.dump());
                          return absl::OkStatus();
                        });
  }

  grpc::ServerUnaryReactor* GetRollout(grpc::CallbackServerContext* ctx,
                                       const pb::GetRolloutRequest* req,
                                       pb::RolloutInfo* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Ota.GetRollout"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.rollouts != nullptr,
                        "over-the-air rollouts are not available", [this, req, resp] {
                          if (req->rollout_id().empty())
                            return absl::InvalidArgumentError("rollout_id: required");
                          auto r = deps_.rollouts->Get(req->rollout_id());
                          if (!r.ok()) return r.status();
                          resp->set_json(r->dump());
                          return absl::OkStatus();
                        });
  }

  grpc::ServerUnaryReactor* Boards(grpc::CallbackServerContext* ctx, const pb::OtaBoardsRequest*,
                                   pb::OtaBoardsResponse* resp) override {
    if (auto who = deps_.gate->Admit(ctx, "Ota.Boards"); !who.ok())
      return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.rollouts != nullptr,
                        "over-the-air rollouts are not available", [this, resp] {
                          auto b = deps_.rollouts->Boards();
                          if (!b.ok()) return b.status();
                          resp->set_json(b->dump());
                          return absl::OkStatus();
                        });
  }

 private:
  const ApiDeps deps_;
  std::atomic<int> running_{0};
};

}  // namespace

std::unique_ptr<grpc::Service> MakeOtaService(const ApiDeps& deps) {
  return std::make_unique<OtaService>(deps);
}

}  // namespace fwai
