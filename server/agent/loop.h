// agent: one agent's model/tool loop. Call the model with the conversation and
// the tools offered, run the tools it asks for, send the results back; until
// it answers without tools, fails, is cancelled or reaches agent.max_iterations.
#pragma once

#include <string>

namespace fwai {

struct AgentDeps;
struct Agent;

// Runs `a` on the calling thread; returns its last text. a.stop_reason and
// a.iterations say how it ended; usage and tool calls go to a.turn.
std::string RunAgent(const AgentDeps& deps, Agent& a);

}  // namespace fwai
