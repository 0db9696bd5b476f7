// Status helpers shared by daemon and clients.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define FWAI_CONCAT_INNER(a, b) a##b
#define FWAI_CONCAT(a, b) FWAI_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                    \
  do {                                           \
    ::absl::Status fwai_status_ = (expr);        \
    if (!fwai_status_.ok()) return fwai_status_; \
  } while (0)

#define FWAI_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(*tmp)

// `ASSIGN_OR_RETURN(auto x, F());` binds the value of an absl::StatusOr or returns its status.
#define ASSIGN_OR_RETURN(lhs, expr) \
  FWAI_ASSIGN_OR_RETURN_IMPL(FWAI_CONCAT(fwai_statusor_, __LINE__), lhs, expr)
