#include "server/agent/questions.h"

#include "absl/strings/str_cat.h"
#include "common/ids.h"
#include "fwai/v1/events.pb.h"
#include "server/agent/agent.h"
#include "server/agent/events.h"
#include "server/agent/pending_replies.h"
#include "server/session/session_manager.h"

namespace fwai {

using json = nlohmann::json;

ToolSpecPtr SpecAskQuestion() {
  static const ToolSpecPtr spec = MakeToolSpec(
      kAskQuestion,
      "Ask the user one or more questions and wait for the answers. Each question may offer "
      "options (single or multiple choice) and/or free text.",
      {{"type", "object"},
       {"properties",
        {{"questions",
          {{"type", "array"},
           {"items",
            {{"type", "object"},
             {"properties",
              {{"text", {{"type", "string"}}},
               {"options", {{"type", "array"}, {"items", {{"type", "string"}}}}},
               {"multiple", {{"type", "boolean"}}},
               {"allow_free_text", {{"type", "boolean"}}}}},
             {"required", {"text"}}}}}}}},
       {"required", {"questions"}}});
  return spec;
}

void EmitAnswered(const Agent& a, const std::string& question_id, const std::string& call_id,
                  const Interaction& reply) {
  v1::ServerEvent answered;
  auto* qa = answered.mutable_question_answered();
  qa->set_question_id(question_id);
  for (const auto& sel : reply.selected) qa->add_selected(sel);
  qa->set_text(reply.text);
  qa->set_answered_by(reply.by);
  qa->set_answered_by_user(reply.by_user);
  reply.author.ToProto(qa->mutable_author());
  qa->set_call_id(call_id);
  a.turn->sink.Emit(std::move(answered));
  a.turn->LogDecision({{"kind", "answer"},
                       {"id", question_id},
                       {"by", reply.by},
                       {"principal", reply.author.principal},
                       {"user", reply.author.user}});
}

ToolResult AskQuestion(const AgentDeps& deps, const Agent& a, const std::string& call_id,
                       const json& input) {
  const json qs = input.value("questions", json());
  if (!qs.is_array() || qs.empty()) return {"questions: expected a non-empty list", true};
  const std::string session_id = a.turn->session.id;
  const std::string qid = NewId("q-");
  v1::ServerEvent ev;
  auto* q = ev.mutable_question_asked();
  q->set_question_id(qid);
  q->set_call_id(call_id);
  int n = 0;
  for (const auto& item : qs) {
    auto* one = q->add_questions();
    one->set_id(absl::StrCat(qid, ".", ++n));
    one->set_text(item.value("text", ""));
    for (const auto& opt : item.value("options", json::array())) {
      if (opt.is_string()) one->add_options()->set_label(opt.get<std::string>());
    }
    one->set_multiple(item.value("multiple", false));
    one->set_allow_free_text(item.value("allow_free_text", one->options_size() == 0));
  }
  // Waiting before the question is visible: an answer cannot arrive too early.
  auto pending = deps.replies.Expect(session_id, qid, false);
  a.turn->sink.Emit(std::move(ev));
  auto reply = deps.replies.Wait(session_id, pending, a.turn->cancel);
  if (!reply) return {"the question was not answered (turn cancelled)", true};
  EmitAnswered(a, qid, call_id, *reply);
  json ans = {{"selected", reply->selected}, {"text", reply->text}};
  return {absl::StrCat("The user answered: ", ans.dump()), false};
}

}  // namespace fwai
