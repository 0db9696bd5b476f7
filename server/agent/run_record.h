// agent: the evidence record of a finished turn (kind agent_turn): who ran
// what with which model, the usage, every tool call, the policy refusals, and
// the files the turn left changed (git diff --numstat, in a git project).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace fwai {

struct Agent;
struct TurnRequest;

// The record of `main`'s turn; its tool outputs are logged under run `run_id`.
nlohmann::json RunRecord(const TurnRequest& req, const Agent& main, const std::string& run_id,
                         int64_t duration_ms);

}  // namespace fwai
