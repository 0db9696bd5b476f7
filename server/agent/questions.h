// agent: askQuestion, the main agent's way to ask the person one or more
// questions (options and/or free text) and wait for the answers. The question
// is published (question_asked) only once its reply is expected.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "server/llm/provider.h"
#include "server/tools/tool.h"

namespace fwai {

struct AgentDeps;
struct Agent;
struct Interaction;

inline constexpr char kAskQuestion[] = "askQuestion";

ToolSpecPtr SpecAskQuestion();

// Tells every client of the session the answer that won, and whose it was.
void EmitAnswered(const Agent& a, const std::string& question_id, const std::string& call_id,
                  const Interaction& reply);

// Asks input.questions and blocks until they are answered or the turn is cancelled.
ToolResult AskQuestion(const AgentDeps& deps, const Agent& a, const std::string& call_id,
                       const nlohmann::json& input);

}  // namespace fwai
