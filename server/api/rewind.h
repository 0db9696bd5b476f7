// Sessions.ListCheckpoints and Sessions.Rewind: a session back to one of its
// checkpoints (server/session/checkpoints.h). Internal to server/api.
//
// A rewind restores the project's files as the session's account (nothing
// outside the root), re-flashes each board of the checkpoint whose image
// differs, through Boards::Flash (the guard, the flash's own record), and
// cuts the conversation back to before that turn when asked. Everything is
// checked before anything changes: a turn running, a board the caller does
// not hold, a kept file or image gone - each refuses the whole rewind.
#pragma once

#include "absl/status/status.h"
#include "fwai/v1/sessions.pb.h"
#include "server/api/api.h"
#include "server/auth/caller.h"

namespace fwai {

struct SessionInfo;

[[nodiscard]] absl::Status ListSessionCheckpoints(const ApiDeps& deps, const SessionInfo& session,
                                                  fwai::v1::ListCheckpointsResponse* out);
[[nodiscard]] absl::Status RewindSession(const ApiDeps& deps, const Caller& caller,
                                         const SessionInfo& session,
                                         const fwai::v1::RewindRequest& req,
                                         fwai::v1::RewindResponse* out);

// The bytes `req.path` had at the checkpoint `req.to` names (kept false when
// it did not exist then). NOT_FOUND names a path the checkpoint did not look
// at (skipped, ignored, outside the project); FAILED_PRECONDITION a file too
// large for one answer.
[[nodiscard]] absl::Status ReadCheckpointFile(const ApiDeps& deps, const SessionInfo& session,
                                              const fwai::v1::ReadCheckpointFileRequest& req,
                                              fwai::v1::ReadCheckpointFileResponse* out);

}  // namespace fwai
