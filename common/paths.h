// Default locations, following the XDG base directory spec.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace fwai {

// $XDG_RUNTIME_DIR/fwai (or /tmp/fwai-<uid>) — holds the default socket.
std::string DefaultRuntimeDir();
// DefaultRuntimeDir()/fwaid.sock
std::string DefaultSocketPath();
// $XDG_DATA_HOME/fwai (or ~/.local/share/fwai).
std::string DefaultDataDir();
// $XDG_CONFIG_HOME/fwai/fwaid.yaml (or ~/.config/fwai/fwaid.yaml).
std::string DefaultConfigPath();

// Creates `dir` and its parents; the last component gets `mode`. Fails if it
// exists and is not a directory. Tightens the mode of an existing directory.
[[nodiscard]] absl::Status MakeDirs(const std::string& dir, unsigned mode);

// Writes `bytes` to `path` through a temporary file in the same directory,
// fsynced and renamed into place, then the directory fsynced: readers, and
// a process that starts after a crash at any point, see the old or the new
// contents, never part of them. Safe to call for one path from several
// threads at once (the last rename wins).
[[nodiscard]] absl::Status WriteFileAtomic(const std::string& path, std::string_view bytes,
                                           unsigned mode = 0644);

}  // namespace fwai
