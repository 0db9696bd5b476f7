// A small client of etcd's v3 gRPC API (KV, Txn, Lease, Watch) for the lab:
// the registry of bench hosts and their boards, and board leases. The gRPC
// and generated etcd types stay in etcd_client.cc.
//
// Endpoints are tried in turn: a request that finds one member unreachable
// (or without a leader) goes to the next, so one member down changes
// nothing; when none answers the error is UNAVAILABLE naming every endpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fwai::lab {

struct EtcdOptions {
  // "HOST:PORT", "http://HOST:PORT" or "https://HOST:PORT" (all one scheme).
  std::vector<std::string> endpoints;
  // For https:// (or `tls`): PEM files of the CA etcd's certificate must
  // chain to, and this node's client certificate and key (etcd's
  // --client-cert-auth; with etcd's auth on, the certificate's CN is the
  // etcd user whose roles apply).
  bool tls = false;
  std::string ca_file, cert_file, key_file;
  int request_timeout_ms = 3000;  // per attempt on one endpoint
  int connect_timeout_ms = 1000;  // to wait for a connection to one endpoint
};

struct KeyValue {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // of the store when read
};

struct WatchEvent {
  enum Type { kPut, kDelete } type = kPut;
  KeyValue kv;
};

// Ends a watch when destroyed (or on Cancel); the callback is not called after.
class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;
  virtual void Cancel() = 0;
};

class EtcdClient {
 public:
  // Channels are made here; no connection is needed yet (etcd may come later).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdOptions options);
  virtual ~EtcdClient() = default;

  virtual const std::vector<std::string>& endpoints() const = 0;

  // Returns the revision of the write. `lease` 0: the key lives until deleted.
  [[nodiscard]] virtual absl::StatusOr<int64_t> Put(const std::string& key,
                                                    const std::string& value,
                                                    int64_t lease = 0) = 0;
  [[nodiscard]] virtual absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key) = 0;
  // Every key starting with `prefix`, in key order.
  [[nodiscard]] virtual absl::StatusOr<RangeResult> GetPrefix(const std::string& prefix) = 0;
  // How many keys were deleted (0 or 1).
  [[nodiscard]] virtual absl::StatusOr<int64_t> Delete(const std::string& key) = 0;
  [[nodiscard]] virtual absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix) = 0;

  struct CreateResult {
    bool created = false;
    KeyValue current;  // the key as it is now: ours when created, the holder's otherwise
  };
  // One transaction: if `key` does not exist, put it (bound to `lease`);
  // otherwise return what is there. Of many racing callers exactly one creates.
  [[nodiscard]] virtual absl::StatusOr<CreateResult> CreateIfAbsent(const std::string& key,
                                                                    const std::string& value,
                                                                    int64_t lease) = 0;
  // One transaction: create `key` (bound to `lease`) only if it is absent,
  // no key under `unchanged_prefix` was written after `unchanged_since`
  // (keys deleted since do not matter), and `consume_key` (if set) still is
  // the key created at `consume_create_revision`; it is deleted with the create.
  struct GuardedCreate {
    std::string key, value;
    int64_t lease = 0;
    std::string unchanged_prefix;
    int64_t unchanged_since = 0;
    std::string consume_key;
    int64_t consume_create_revision = 0;
  };
  [[nodiscard]] virtual absl::StatusOr<CreateResult> CreateGuarded(const GuardedCreate& g) = 0;
  // One transaction: delete `key` only if its value is still `value`.
  [[nodiscard]] virtual absl::StatusOr<bool> DeleteIfValue(const std::string& key,
                                                           const std::string& value) = 0;

  // A lease of `ttl_s` seconds; returns its id.
  [[nodiscard]] virtual absl::StatusOr<int64_t> LeaseGrant(int64_t ttl_s) = 0;
  // One keepalive; returns the TTL granted again. NOT_FOUND once the lease expired.
  [[nodiscard]] virtual absl::StatusOr<int64_t> LeaseKeepAlive(int64_t lease) = 0;
  // Remaining TTL in seconds; NOT_FOUND if the lease is gone.
  [[nodiscard]] virtual absl::StatusOr<int64_t> LeaseTimeToLive(int64_t lease) = 0;
  // Ends the lease and deletes its keys. A lease already gone is OK.
  [[nodiscard]] virtual absl::Status LeaseRevoke(int64_t lease) = 0;

  // Events on keys under `prefix` from `start_revision` (0: from now), in
  // revision order; the watch follows the cluster across endpoint failures,
  // resuming after the last event seen. `on_error` hears of a watch that can
  // no longer resume (e.g. its revision was compacted); it then ends.
  [[nodiscard]] virtual std::unique_ptr<EtcdWatch> Watch(
      const std::string& prefix, int64_t start_revision,
      std::function<void(const std::vector<WatchEvent>&, int64_t revision)> on_events,
      std::function<void(const absl::Status&)> on_error = nullptr) = 0;
};

// The first key after every key starting with `prefix` (etcd's range_end).
std::string PrefixEnd(const std::string& prefix);

// An UNAVAILABLE status from a client whose cluster did not answer carries
// each member's own answer ("127.0.0.1:2379: no leader") beside its one-line
// message: for `fwai hw ls --verbose` and the log. Empty for any other status.
std::vector<std::string> EtcdMemberAnswers(const absl::Status& s);

}  // namespace fwai::lab
