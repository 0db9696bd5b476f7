// The daemon's configuration (fwaid.yaml). Loading validates every value and
// refuses the file with "config FILE:LINE: field: what is expected".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/lab_config.h"
#include "common/security_config.h"

namespace fwai {

struct ProviderConfig {
  std::string name;         // key in `providers:`
  std::string kind;         // anthropic | openai
  std::string api_key;      // literal key (discouraged) ...
  std::string api_key_env;  // ... or the variable that holds it
  std::string base_url;
  std::string model;
  int max_tokens = 4096;
  double temperature = -1;  // < 0: provider default
  int64_t context_window = 200000;
  int connect_timeout_s = 15;  // copied from http: by ApplyProviderEnvironment
  int idle_timeout_s = 120;
};

struct RetryConfig {
  int max_attempts = 4;          // total attempts including the first
  int initial_backoff_ms = 500;  // doubled each retry, jittered
  int max_backoff_ms = 20000;
};

struct SubscriberConfig {
  // Past this many queued events adjacent text deltas are coalesced.
  int high_water = 512;
  // Past this many queued events (after coalescing) a subscriber is dropped
  // with RESOURCE_EXHAUSTED.
  int max_queue = 4096;
  // While events arrive within this long of the last write, the event log
  // gathers them for up to this long (or 256 events) and stores and hands
  // them out together: one write and one wake-up per batch, not per event.
  // 0: every event is written as soon as the writer is free.
  int batch_window_us = 1000;
};

struct ToolsConfig {
  int64_t read_file_max_bytes = 256 * 1024;
  int grep_max_results = 200;
  int glob_max_results = 1000;
  int list_dir_max_entries = 1000;
};

// A reranker: the built-in one, a rerank service over HTTP, or the chat
// provider ranking the passages.
struct RerankerConfig {
  std::string kind = "builtin";           // builtin | tei | cohere | jina | llm
  std::map<std::string, double> weights;  // the built-in reranker's, by feature name
  std::string base_url;
  std::string api_key;
  std::string api_key_env;
  std::string model;
  std::string provider;  // for llm: a name under providers:
};

struct KnowledgeConfig {
  std::string embedder = "builtin";  // builtin | openai (any OpenAI-compatible /v1/embeddings)
  int builtin_dimension = 256;
  std::string embed_base_url;
  std::string embed_api_key;
  std::string embed_api_key_env;
  std::string embed_model;
  int chunk_min_tokens = 100;
  int chunk_target_tokens = 300;
  int chunk_max_tokens = 512;
  int chunk_overlap_tokens = 50;
  double bm25_k1 = 1.2;
  double bm25_b = 0.75;
  double rrf_k = 60;
  double lexical_weight = 1.0;
  double vector_weight = 0.1;
  // Query expansion on the lexical legs (synonyms engineers use, part-number
  // families); measured on the development and our validation questions.
  double synonym_weight = 0.35;
  double family_weight = 0.8;
  // Document-level legs: chunks of the documents whose name/title the query
  // names (doc_weight) and of those whose whole text matches it best
  // (doc_text_weight, BM25 at document level with length normalization
  // doc_text_b over the best doc_text_candidates documents).
  double doc_weight = 0.0;
  double doc_text_weight = 0.5;
  double doc_text_b = 0.3;
  int doc_text_candidates = 10;
  int candidates = 100;
  int rerank_top = 100;
  RerankerConfig reranker;
  bool query_rewrite =
      true;          // with a provider configured: rewrite short, vague or paraphrased queries
  bool hyde = true;  // with a provider configured: search a hypothetical answer too
  // Passages: the budget of each result (tokens), how many reranked chunks
  // are widened and ranked again, and that ranking's weights (0: off).
  int passage_tokens = 512;
  int passage_pool = 30;
  double passage_coverage_weight = -1;  // -1: the built-in default
  double passage_sentence_weight = -1;
  int passage_forward = -1;        // -1: the built-in default; 0 / 1
  double passage_within_doc = -1;  // -1: the built-in default
  // Window evidence (knowledge.windows): -1 / empty: the built-in defaults.
  int window_enabled = -1;  // 0 / 1
  int window_docs = -1;
  double window_weight = -1, window_k = -1;
  int window_identifiers = -1;  // 0 / 1: also for questions with an identifier
  // The retrieval log and its corrections.
  int64_t log_max_entries = 100000;
  double feedback_weight = 0.8;
  double feedback_min_similarity = 0.5;
  std::string code_web_context_url;  // optional endpoint for codeSearch
  std::string code_web_context_api_key_env;
  int64_t hnsw_above = 20000;             // exact vector search below this many vectors
  std::string vector_index = "ivf";       // above it: ivf (IVF, 8-bit scalar quantized) | hnsw
  int ivf_lists = 0;                      // 0: about 4 * sqrt(n)
  int ivf_nprobe = 0;                     // 0: chosen for recall@10 >= 0.95
  double ivf_max_probe_share = 1.0 / 32;  // chosen nprobe at most this share of the lists (>= 16)
  // An approximate index below this recall@10 on its sample is not kept
  // (vector search off). -1: 0.9 with the built-in embedder, 0 with openai.
  double vector_min_recall = -1;
  int hnsw_m = 32;
  int hnsw_ef_construction = 80;
  int hnsw_ef_search = 0;  // 0: chosen by measured recall
  int64_t max_document_mb = 50;
};

struct CatalogConfig {
  int coarse_slices = 100;
  int candidates = 30;
  std::string grouping = "sum";  // sum | rrf
  double rrf_k = 60;
  double vector_weight = 0.1;
  double whole_weight = 0.0;
  double synonym_weight = 0.35;  // query expansion: synonyms (0: off)
  double family_weight = 0.8;    // query expansion: part-number families (0: off)
  double namespace_boost = 0.2;  // a query naming a program prefers its tools (0: off)
  // With a provider configured: search a hypothetical tool too (one cached
  // model call per distinct request, before the agent's tool offer).
  bool hyde = false;
  double hyde_weight = 1.0;
  // The fine stage: the built-in tool reranker (its feature weights, by
  // feature name, also as catalog.rerank_weights; unset features keep the
  // tool defaults), or a rerank service or the chat provider over the
  // candidates' whole documents.
  RerankerConfig reranker;
};

struct McpServerEntry {
  std::vector<std::string> command;  // stdio ...
  std::map<std::string, std::string> env;
  std::string url;  // ... or streamable HTTP
  std::vector<std::string> headers;
};

// A board: what one lease hands out. Physical boards bundle a debug probe, a
// serial port and a target; simulated boards are a QEMU machine.
struct BoardConfig {
  std::string id;
  std::string kind = "physical";  // physical | simulated
  std::vector<std::string> tags;
  bool maintenance = false;
  // Serial port (physical boards; simulated ones use QEMU's pty).
  std::string serial;  // path, e.g. /dev/serial/by-id/...
  int baud = 115200;
  int data_bits = 8;
  std::string parity = "none";        // none | odd | even
  std::string stop_bits = "1";        // 1 | 1.5 | 2
  std::string flow_control = "none";  // none | software | hardware
  std::string line_ending = "\n";     // appended to commands sent
  std::string encoding = "utf-8";     // ascii | utf-8 | hex
  std::vector<std::string> startup_commands;
  std::string log_file;
  // Debug probe (serial number or VID:PID) and how to drive it.
  std::string probe;
  std::vector<std::string> openocd_config;  // -f files, e.g. interface/stlink.cfg
  std::string flash_command;                // template with {elf} {bin} {hex} {port} {probe}
  std::string power_on;
  std::string power_off;
  std::string self_test;  // command run by `fwai hw test`; exit 0 = good
  // Target and memory map (flash guard).
  std::string target;
  uint64_t flash_origin = 0x08000000;
  uint64_t flash_size = 0;
  uint64_t ram_origin = 0x20000000;
  uint64_t ram_size = 0;
  // Simulated boards.
  std::string machine;  // stm32vldiscovery | lm3s6965evb
  std::string image;    // firmware loaded at start (optional)
  std::string qemu = "qemu-system-arm";
  std::string gdb;           // default: gdb-multiarch, else arm-none-eabi-gdb
  std::string boot_pattern;  // a line that means the firmware booted
  int boot_timeout_s = 15;   // how long a flash waits for it
  // SEGGER RTT read while the firmware runs (simulated boards): the poll
  // interval, 0 when `rtt: off`.
  int rtt_poll_ms = 10;
  // ARM semihosting (simulated boards): its console is the board's
  // "semihosting" stream; QEMU then runs in a bubblewrap sandbox that shows
  // the firmware's file calls nothing of the host but the system's files.
  bool semihosting = false;
  // Over-the-air updates. Simulated boards keep two MCUboot slots of
  // ota_slot_size bytes as host files (0: half the flash). Physical boards
  // are updated through commands: ota_upload puts {image} into the secondary
  // slot marked for test (e.g. mcumgr image upload + image test), ota_reset
  // restarts the board, ota_confirm makes the running image permanent.
  uint64_t ota_slot_size = 0;
  std::string ota_upload;
  std::string ota_reset;
  std::string ota_confirm;
};

struct HardwareConfig {
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  int history_lines = 10000;
  int default_ttl_s = 900;
  int max_ttl_s = 86400;
  bool default_simulated_board = true;  // with no boards configured: one simulated STM32VLDISCOVERY
  // Each lease's serial output is kept (data dir artifacts/serial/SHA256.log)
  // and named by its hash in the record of the lease's end.
  bool keep_serial_transcripts = false;
  // A board whose flashes and skill runs fail this many times in a row for
  // the lab's fault (verdict `lab`) is quarantined; 0: never.
  int quarantine_after = 3;
  std::vector<BoardConfig> boards;
};

// Over-the-air rollouts (`ota:`).
struct OtaConfig {
  // Ed25519 public keys (PEM files) an image must be signed with; the
  // simulated boards' bootloader checks them as MCUboot built with them
  // would. Empty: the image's SHA-256 is enough.
  std::vector<std::string> keys;
  double max_failure_rate = 0;  // a stage that fails more than this stops and reverts
  int health_timeout_s = 120;   // one board's health skill
};

// Plugins (`plugins:`): what may be installed and from where.
struct PluginsConfig {
  // minisign public keys (the base64 line, or a .pub file) whose signatures are trusted.
  std::vector<std::string> trusted_keys;
  bool allow_unsigned = false;            // unsigned, or signed by a key not trusted
  bool allow_tampered = false;            // files that differ from the signed manifest
  std::vector<std::string> marketplaces;  // index files: https:// URLs or local paths
};

// One header sent with every OTLP export; its value is read from an
// environment variable or a file when fwaid starts, never from the config
// text, and is never logged.
struct TelemetryHeader {
  std::string name;
  std::string env;    // the variable holding the value, or
  std::string file;   // the file holding it (trailing newline dropped)
  std::string where;  // "config fwaid.yaml:12: telemetry.headers.authorization"
};

// OpenTelemetry export (`telemetry:`): off unless the section is present.
struct TelemetryConfig {
  bool enabled = false;
  std::string endpoint;           // http://HOST:PORT (plain) or https://HOST:PORT (TLS)
  std::string protocol = "grpc";  // OTLP over gRPC
  std::string service_name = "fwaid";
  std::string ca_file;  // https: the CA that signed the collector's certificate ("": system's)
  std::vector<TelemetryHeader> headers;
  int metrics_interval_ms = 60000;
  int span_batch_delay_ms = 5000;
  // Prompt text and tool arguments (secrets redacted) in spans; off by default.
  bool capture_content = false;
};

// A sub-agent type: what `delegateSubagent` may start.
struct SubagentConfig {
  std::string name;
  std::string description;
  std::string provider;  // "" = the delegating agent's
  std::string model;     // "" = the provider's default
  int timeout_s = 300;
  int max_tokens = 4096;
  int max_tool_calls = 30;
  double temperature = -1;
  std::vector<std::string> tools;  // allowed tools
  bool read_only = true;           // refuse any tool that changes things
  std::string prompt;              // extra system instructions
};

// checkpoints: what rewinding a session keeps (server/session/checkpoints.h).
struct CheckpointsConfig {
  int64_t max_bytes = int64_t{2} << 30;        // of kept files and images per project
  int64_t max_file_bytes = int64_t{64} << 20;  // larger files are not kept
};

struct DaemonConfig {
  std::string source;               // file the config came from, "" for defaults
  std::vector<std::string> listen;  // "unix:PATH" | "tcp:HOST:PORT"
  std::string data_dir;
  std::string default_provider;
  std::map<std::string, ProviderConfig> providers;
  int max_iterations = 25;
  int tool_threshold = 30;  // above this many tools, offer core + retrieved ones per call
  int tools_top_k = 8;
  int64_t max_message_bytes = 256 * 1024;
  // Threads started with the daemon that run turns and never end for
  // idleness (more are started when all are busy; those end idle).
  int turn_threads = 50;
  // Turns preparing their first model request at once (the rest wait their
  // turn, at most 50 ms behind a slow one): -1 for half the cores (at least
  // one), 0 for no limit.
  int turn_starts = -1;
  std::map<std::string, SubagentConfig> subagents;  // built-in types plus agent.subagents
  // Model-name prefix -> USD per million input/output tokens (over the built-in table).
  std::map<std::string, std::pair<double, double>> prices;
  // Model-name prefix -> context window in tokens (over the built-in table).
  std::map<std::string, int64_t> context_windows;
  int max_subagent_depth = 3;
  int http_connect_timeout_s = 15;
  int http_idle_timeout_s = 120;  // no byte for this long fails the stream
  RetryConfig retry;
  SubscriberConfig subscribers;
  ToolsConfig tools;
  KnowledgeConfig knowledge;
  CatalogConfig catalog;
  std::map<std::string, McpServerEntry> mcp_servers;
  HardwareConfig hardware;
  CheckpointsConfig checkpoints;
  OtaConfig ota;
  PluginsConfig plugins;
  TelemetryConfig telemetry;
  std::string policy_file;  // organisation policy (YAML with a policy: section)
  // secrets.patterns: extra regexes ("name=regex" or "regex") redacted from
  // tool output, evidence and logs, over the built-in ones.
  std::vector<std::string> secret_patterns;
  // toolchain.dpkg_admindir: the dpkg database the toolchain attestation asks
  // (dpkg -S / -V); "" is dpkg's own (/var/lib/dpkg).
  std::string toolchain_dpkg_admindir;
  std::string log_level = "info";
  SecurityConfig security;  // tls, unix_socket, users, limits, knowledge_writers
  LabConfig lab;            // a node of a lab of many bench hosts (etcd)
};

// Parses YAML text; `source` names the file in error messages.
[[nodiscard]] absl::StatusOr<DaemonConfig> ParseConfig(const std::string& yaml_text,
                                                       const std::string& source);
// The `mcp_servers:` section of a YAML document (a project's config uses the
// daemon's format); empty when there is none.
[[nodiscard]] absl::StatusOr<std::map<std::string, McpServerEntry>> ParseMcpServers(
    const std::string& yaml_text, const std::string& source);
// Reads and parses a file. A missing file is an error.
[[nodiscard]] absl::StatusOr<DaemonConfig> LoadConfigFile(const std::string& path);

// Adds providers found in the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY,
// *_BASE_URL) that the config does not define, and applies *_BASE_URL to
// configured providers that have no base_url. Picks a default provider if none.
void ApplyProviderEnvironment(DaemonConfig& config);

// Fills a board's target and memory map from its machine (simulated boards)
// or target name when they were not given. False if nothing is known.
bool ApplyBoardDefaults(BoardConfig& b);

// The key of `p`: the literal one, else the one in its environment variable.
std::string ResolveApiKey(const ProviderConfig& p);

}  // namespace fwai
