#include "client/cli/kb.h"

#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/lib/client.h"
#include "fwai/v1/knowledge.grpc.pb.h"

namespace fwai {

namespace pb = fwai::v1;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr int64_t kMaxDocument = 50ll << 20;

std::string CleanName(const fs::path& p) {
  std::string s = p.lexically_normal().string();
  while (s.rfind("./", 0) == 0) s = s.substr(2);
  return s;
}

bool Hidden(const fs::path& p) {
  const std::string n = p.filename().string();
  return n.size() > 1 && n[0] == '.' && n != "..";
}

struct FileItem {
  std::string path;  // to read
  std::string name;  // shown in results
};

// Files, directories (recursively, hidden entries skipped) and globs.
std::vector<FileItem> ExpandPaths(const std::vector<std::string>& args,
                                  std::vector<std::string>* errors) {
  std::vector<FileItem> out;
  for (const auto& a : args) {
    std::vector<std::string> matches;
    std::error_code ec;
    if (!fs::exists(a, ec) && a.find_first_of("*?[") != std::string::npos) {
      glob_t gl{};
      if (glob(a.c_str(), 0, nullptr, &gl) == 0) {
        for (size_t i = 0; i < gl.gl_pathc; ++i) matches.emplace_back(gl.gl_pathv[i]);
      }
      globfree(&gl);
      if (matches.empty()) errors->push_back(absl::StrCat(a, ": no file matches"));
    } else {
      matches.push_back(a);
    }
    for (const auto& m : matches) {
      if (fs::is_directory(m, ec)) {
        std::vector<FileItem> found;
        fs::recursive_directory_iterator it(m, fs::directory_options::skip_permission_denied, ec),
            end;
        for (; !ec && it != end; it.increment(ec)) {
          if (Hidden(it->path())) {
            if (it->is_directory()) it.disable_recursion_pending();
            continue;
          }
          if (it->is_regular_file()) {
            found.push_back({it->path().string(), CleanName(it->path())});
          }
        }
        if (ec) errors->push_back(absl::StrCat(m, ": ", ec.message()));
        std::sort(found.begin(), found.end(),
                  [](const auto& x, const auto& y) { return x.name < y.name; });
        out.insert(out.end(), found.begin(), found.end());
      } else if (fs::exists(m, ec)) {
        out.push_back({m, CleanName(m)});
      } else {
        errors->push_back(absl::StrCat(m, ": no such file or directory"));
      }
    }
  }
  return out;
}

json HitToJson(const pb::SearchResult& r) {
  json highlights = json::array();
  for (const auto& h : r.highlights()) highlights.push_back({h.begin(), h.end()});
  std::vector<std::string> chunk_ids(r.chunk_ids().begin(), r.chunk_ids().end());
  return json{{"rank", r.rank()},
              {"score", r.score()},
              {"doc", r.doc()},
              {"title_path", r.title_path()},
              {"page", r.page()},
              {"end_page", r.end_page()},
              {"start_line", r.start_line()},
              {"end_line", r.end_line()},
              {"content_type", r.content_type()},
              {"tokens", r.tokens()},
              {"chunk_id", r.chunk_id()},
              {"chunk_ids", chunk_ids},
              {"highlights", highlights},
              {"text", r.text()}};
}

// What to show of a result on a terminal: its best-matching sentences (or
// its beginning), on one line, at most `max` bytes.
std::string Snippet(const pb::SearchResult& r, size_t max) {
  std::string s;
  for (const auto& h : r.highlights()) {
    if (h.begin() < 0 || h.end() > static_cast<int>(r.text().size()) || h.end() <= h.begin())
      continue;
    if (!s.empty()) s += " ... ";
    s += r.text().substr(h.begin(), h.end() - h.begin());
  }
  if (s.empty()) s = r.text();
  for (auto& c : s) {
    if (c == '\n' || c == '\t') c = ' ';
  }
  if (s.size() > max) s = s.substr(0, max) + "...";
  return s;
}

}  // namespace

KbCommands::KbCommands(CLI::App& app, Globals& g) : g_(g) {
  auto* kb =
      app.add_subcommand("kb", "The knowledge base: datasheets, manuals, register descriptions");
  kb->require_subcommand(1);
  add_ = kb->add_subcommand("add", "Add files, directories (recursively) or globs");
  add_->add_option("paths", paths_, "Files, directories or globs")->required();
  add_->add_option("--collection", collection_, "Collection (default: default)");
  add_->add_option("--tag", tags_, "Metadata key=value (repeatable)");
  add_->add_option("--kind", kind_, "doc or code (default: detect)")
      ->check(CLI::IsMember({"doc", "code"}));
  ls_ = kb->add_subcommand("ls", "List documents");
  ls_->add_option("--collection", collection_, "Only this collection");
  rm_ = kb->add_subcommand("rm", "Remove documents (by id or name)");
  rm_->add_option("docs", docs_)->required();
  rm_->add_option("--collection", collection_, "Collection of the named documents");
  stats_ = kb->add_subcommand("stats", "Documents, chunks, bytes, index kinds, embedder");
  stats_->add_option("--collection", collection_, "Only this collection");
  search_ = kb->add_subcommand("search", "Search the knowledge base");
  search_->add_option("query", query_words_, "What to look for");
  search_->add_option("--max-results,-n", max_results_, "1..100 (default 10)");
  search_->add_option("--threshold", threshold_, "Minimum score 0..1");
  search_->add_option("--collection", collection_, "Only this collection");
  search_->add_option("--doc", docs_, "Only these documents (repeatable)");
  search_->add_option("--type", types_, "Only these content types: text, code, table, register");
  search_->add_flag("--no-rerank", no_rerank_, "Fused order, no reranking");
  search_->add_option("--mode", mode_, "hybrid (default), lexical or vector")
      ->check(CLI::IsMember({"hybrid", "lexical", "vector"}));
  search_->add_option("--batch", batch_,
                      "JSON lines with a \"query\" field; one JSON line out per query");
  search_
      ->add_option("--passage-tokens", passage_tokens_,
                   "Passage size in tokens, 1..512 (default 512)")
      ->check(CLI::Range(1, 512));
  search_->add_flag("--chunks", chunks_only_, "Results are chunks as stored, not passages");
  log_ = kb->add_subcommand("log",
                            "Recent searches (newest first) with their results and corrections");
  log_->add_option("-n,--limit", log_limit_, "How many, 1..1000 (default 20)")
      ->check(CLI::Range(1, 1000));
  log_->add_option("--before", log_before_, "Page back from this search id");
  feedback_ =
      kb->add_subcommand("feedback", "Mark a result of a logged search good or bad for its query");
  feedback_->add_option("search_id", search_id_, "The search, as fwai kb log shows it (q123)")
      ->required();
  feedback_->add_option("result", result_, "Its rank (1-based) or a chunk id")->required();
  auto* good = feedback_->add_flag("--good", good_, "The result answers the query");
  auto* bad = feedback_->add_flag("--bad", bad_, "The result does not answer the query");
  good->excludes(bad);
  feedback_->add_option("--note", note_, "Why (kept with the correction)");
}

std::optional<int> KbCommands::RunIfParsed() {
  if (add_->parsed()) return Add();
  if (ls_->parsed()) return Ls();
  if (rm_->parsed()) return Rm();
  if (stats_->parsed()) return Stats();
  if (search_->parsed()) return Search();
  if (log_->parsed()) return Log();
  if (feedback_->parsed()) return Feedback();
  return std::nullopt;
}

int KbCommands::Add() {
  std::vector<pb::Tag> tags;
  for (const auto& t : tags_) {
    auto eq = t.find('=');
    if (eq == std::string::npos || eq == 0)
      return Fail(g_, kExitUsage, absl::StrCat("--tag ", t, ": expected key=value"));
    pb::Tag tag;
    tag.set_key(t.substr(0, eq));
    tag.set_value(t.substr(eq + 1));
    tags.push_back(tag);
  }
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Knowledge::NewStub(*ch);
  std::vector<std::string> errors;
  auto files = ExpandPaths(paths_, &errors);
  const bool tty = isatty(2) && !g_.json;
  int added = 0, unchanged = 0, failed = static_cast<int>(errors.size());
  int64_t chunks = 0;
  auto t0 = std::chrono::steady_clock::now();
  auto report_error = [&](const std::string& name, const std::string& msg) {
    if (g_.json) {
      std::cout << json({{"type", "error"}, {"name", name}, {"message", msg}}).dump() << std::endl;
    } else {
      std::cerr << (tty ? "\r\033[K" : "") << "error: " << msg << std::endl;
    }
  };
  for (const auto& e : errors) report_error("", e);
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& f = files[i];
    if (tty)
      std::cerr << "\r\033[K[" << i + 1 << "/" << files.size() << "] " << f.name << std::flush;
    std::error_code ec;
    auto size = fs::file_size(f.path, ec);
    if (ec) {
      ++failed;
      report_error(f.name, absl::StrCat(f.name, ": cannot read: ", ec.message()));
      continue;
    }
    if (static_cast<int64_t>(size) > kMaxDocument) {
      ++failed;
      report_error(f.name, absl::StrCat(f.name, ": ", size / 1e6, " MB is over the 50 MB limit"));
      continue;
    }
    std::ifstream in(f.path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) {
      ++failed;
      report_error(f.name, absl::StrCat(f.name, ": cannot read: ", std::strerror(errno)));
      continue;
    }
    std::string bytes = ss.str();
    grpc::ClientContext ctx;
    auto stream = stub->Ingest(&ctx);
    pb::IngestChunk header;
    auto* h = header.mutable_header();
    h->set_name(f.name);
    h->set_collection(collection_);
    for (const auto& t : tags) *h->add_tags() = t;
    h->set_kind(kind_);
    h->set_size(static_cast<int64_t>(bytes.size()));
    auto mtime = fs::last_write_time(f.path, ec);
    if (!ec) {
      h->set_modified_us(std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::file_clock::to_sys(mtime).time_since_epoch())
                             .count());
    }
    bool ok = stream->Write(header);
    for (size_t off = 0; ok && off < bytes.size(); off += 1 << 20) {
      pb::IngestChunk data;
      data.set_data(bytes.substr(off, 1 << 20));
      ok = stream->Write(data);
    }
    stream->WritesDone();
    pb::IngestProgress p, last;
    while (stream->Read(&p)) {
      last = p;
      if (g_.json) {
        std::cout << json({{"type", "progress"},
                           {"name", f.name},
                           {"stage", p.stage()},
                           {"bytes", p.bytes()}})
                         .dump()
                  << std::endl;
      }
    }
    grpc::Status st = stream->Finish();
    if (!st.ok()) {
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE) return FailGrpc(g_, st);
      ++failed;
      report_error(f.name, st.error_message());
      continue;
    }
    if (last.unchanged()) {
      ++unchanged;
    } else {
      ++added;
    }
    chunks += last.chunks();
    if (g_.json) {
      std::cout << json({{"type", "done"},
                         {"name", f.name},
                         {"doc_id", last.doc_id()},
                         {"chunks", last.chunks()},
                         {"pages", last.pages()},
                         {"unchanged", last.unchanged()},
                         {"replaced", !last.replaced_doc_id().empty()},
                         {"duplicate_of", last.duplicate_of()}})
                       .dump()
                << std::endl;
    } else if (!tty) {
      std::cout << f.name << ": "
                << (last.unchanged() ? "unchanged" : absl::StrCat(last.chunks(), " chunks"))
                << (last.duplicate_of().empty() ? ""
                                                : " (same content as " + last.duplicate_of() + ")")
                << std::endl;
    }
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (g_.json) {
    std::cout << json({{"type", "summary"},
                       {"added", added},
                       {"unchanged", unchanged},
                       {"failed", failed},
                       {"chunks", chunks},
                       {"seconds", secs}})
                     .dump()
              << std::endl;
  } else {
    std::cerr << (tty ? "\r\033[K" : "") << "added " << added << ", unchanged " << unchanged
              << ", failed " << failed << " (" << chunks << " chunks) in " << secs << " s"
              << std::endl;
  }
  return failed > 0 ? kExitError : kExitOk;
}

int KbCommands::Ls() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::ListDocumentsRequest req;
  req.set_collection(collection_);
  pb::ListDocumentsResponse resp;
  auto st = pb::Knowledge::NewStub(*ch)->ListDocuments(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json arr = json::array();
    for (const auto& d : resp.documents()) arr.push_back(ProtoToJson(d));
    std::cout << arr.dump() << std::endl;
    return kExitOk;
  }
  if (resp.documents().empty()) {
    std::cout << "no documents (add some with: fwai kb add PATH...)" << std::endl;
    return kExitOk;
  }
  std::printf("%-20s %-12s %7s %6s %10s %-9s %s\n", "ID", "COLLECTION", "CHUNKS", "PAGES", "BYTES",
              "FORMAT", "NAME");
  for (const auto& d : resp.documents()) {
    std::printf("%-20s %-12s %7d %6d %10lld %-9s %s\n", d.id().c_str(), d.collection().c_str(),
                d.chunks(), d.pages(), static_cast<long long>(d.bytes()), d.format().c_str(),
                d.name().c_str());
  }
  return kExitOk;
}

int KbCommands::Rm() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Knowledge::NewStub(*ch);
  int rc = kExitOk;
  json removed = json::array();
  for (const auto& d : docs_) {
    grpc::ClientContext ctx;
    pb::DeleteDocumentRequest req;
    req.set_doc(d);
    req.set_collection(collection_);
    pb::DeleteDocumentResponse resp;
    auto st = stub->DeleteDocument(&ctx, req, &resp);
    if (!st.ok()) {
      rc = FailGrpc(g_, st);
      continue;
    }
    removed.push_back({{"doc", d}, {"chunks", resp.chunks_removed()}});
    if (!g_.json)
      std::cout << "removed " << d << " (" << resp.chunks_removed() << " chunks)" << std::endl;
  }
  if (g_.json) std::cout << json({{"removed", removed}}).dump() << std::endl;
  return rc;
}

int KbCommands::Stats() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::StatsRequest req;
  req.set_collection(collection_);
  pb::StatsResponse resp;
  auto st = pb::Knowledge::NewStub(*ch)->Stats(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << ProtoToJson(resp).dump() << std::endl;
    return kExitOk;
  }
  std::printf(
      "documents  %lld\nchunks     %lld\nbytes      %lld\nindexes    %s\nembedder   %s (%d dims)\n",
      static_cast<long long>(resp.documents()), static_cast<long long>(resp.chunks()),
      static_cast<long long>(resp.bytes()), absl::StrJoin(resp.index_kinds(), ", ").c_str(),
      resp.embedder().c_str(), resp.dimension());
  std::printf(
      "searches   %lld logged\nfeedback   %lld good, %lld bad (people); %lld cited, %lld discarded "
      "(agent)\n",
      static_cast<long long>(resp.searches()), static_cast<long long>(resp.feedback_good()),
      static_cast<long long>(resp.feedback_bad()), static_cast<long long>(resp.feedback_cited()),
      static_cast<long long>(resp.feedback_discarded()));
  return kExitOk;
}

int KbCommands::Search() {
  query_ = absl::StrJoin(query_words_, " ");
  if (batch_.empty() && query_.empty())
    return Fail(g_, kExitUsage, "kb search: give a QUERY or --batch FILE");
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  auto stub = pb::Knowledge::NewStub(*ch);
  auto make = [&](const std::string& q) {
    pb::SearchRequest req;
    req.set_query(q);
    req.set_max_results(max_results_);
    req.set_threshold(threshold_);
    req.set_collection(collection_);
    for (const auto& d : docs_) req.mutable_filters()->add_docs(d);
    for (const auto& t : types_) req.mutable_filters()->add_content_types(t);
    req.set_no_rerank(no_rerank_);
    req.set_mode(mode_);
    if (passage_tokens_ > 0) req.set_passage_tokens(passage_tokens_);
    req.set_chunks_only(chunks_only_);
    return req;
  };
  if (!batch_.empty()) {
    return RunBatch(g_, batch_, [&](const std::string& q) -> absl::StatusOr<json> {
      grpc::ClientContext ctx;
      ctx.AddMetadata("fwai-client", "cli");
      pb::SearchResponse resp;
      auto st = stub->Search(&ctx, make(q), &resp);
      if (!st.ok())
        return absl::Status(static_cast<absl::StatusCode>(st.error_code()), st.error_message());
      json out = {
          {"took_ms", resp.took_ms()}, {"search_id", resp.search_id()}, {"results", json::array()}};
      for (const auto& r : resp.results()) out["results"].push_back(HitToJson(r));
      return out;
    });
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("fwai-client", "cli");
  pb::SearchResponse resp;
  auto st = stub->Search(&ctx, make(query_), &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    json arr = json::array();
    for (const auto& r : resp.results()) {
      arr.push_back(HitToJson(r));
      arr.back()["search_id"] = resp.search_id();
    }
    std::cout << arr.dump() << std::endl;
    return kExitOk;
  }
  if (resp.results().empty()) std::cout << "no results" << std::endl;
  for (const auto& r : resp.results()) {
    std::string where = r.doc();
    if (!r.title_path().empty()) absl::StrAppend(&where, " > ", r.title_path());
    if (r.page() > 0) {
      absl::StrAppend(&where, r.end_page() > r.page()
                                  ? absl::StrCat(", pages ", r.page(), "-", r.end_page())
                                  : absl::StrCat(", page ", r.page()));
    } else {
      absl::StrAppend(&where, ", lines ", r.start_line(), "-", r.end_line());
    }
    std::printf("%2d. %.3f  %s\n    %s\n", r.rank(), r.score(), where.c_str(),
                Snippet(r, 300).c_str());
  }
  std::fprintf(stderr,
               "(%d results in %.1f ms; search %s: mark a result with fwai kb feedback %s RANK "
               "--good|--bad)\n",
               resp.results_size(), resp.took_ms(), resp.search_id().c_str(),
               resp.search_id().c_str());
  return kExitOk;
}

int KbCommands::Log() {
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::ListSearchesRequest req;
  req.set_limit(log_limit_);
  req.set_before(log_before_);
  pb::ListSearchesResponse resp;
  auto st = pb::Knowledge::NewStub(*ch)->ListSearches(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    for (const auto& s : resp.searches()) std::cout << ProtoToJson(s).dump() << std::endl;
    return kExitOk;
  }
  if (resp.searches().empty()) std::cout << "no searches logged" << std::endl;
  for (const auto& s : resp.searches()) {
    const time_t t = static_cast<time_t>(s.time_us() / 1000000);
    char when[32];
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
    std::string who = s.source();
    if (!s.session_id().empty()) absl::StrAppend(&who, " ", s.session_id(), "/", s.turn_id());
    std::printf("%s  %s  %s  %.1f ms  %s\n  \"%s\"\n", s.id().c_str(), when, who.c_str(),
                s.took_ms(), s.method().c_str(), s.query().c_str());
    for (const auto& w : s.rewrites()) std::printf("  also: \"%s\"\n", w.c_str());
    for (const auto& r : s.results()) {
      std::string marks;
      for (const auto& f : s.feedback()) {
        if (f.rank() == r.rank()) {
          absl::StrAppend(&marks, marks.empty() ? "  [" : ", ",
                          f.source() == "user" ? (f.good() ? "good" : "bad") : f.source());
        }
      }
      if (!marks.empty()) marks += "]";
      std::printf("  %2d. %.3f  %s%s%s%s\n", r.rank(), r.score(), r.doc().c_str(),
                  r.title_path().empty() ? "" : " > ", r.title_path().c_str(), marks.c_str());
    }
  }
  return kExitOk;
}

int KbCommands::Feedback() {
  if (good_ == bad_) return Fail(g_, kExitUsage, "kb feedback: give --good or --bad");
  auto ch = ConnectChannel(g_);
  if (!ch.ok()) return Fail(g_, kExitUnreachable, std::string(ch.status().message()));
  grpc::ClientContext ctx;
  pb::FeedbackRequest req;
  req.set_search_id(search_id_);
  req.set_result(result_);
  req.set_good(good_);
  req.set_note(note_);
  pb::FeedbackResponse resp;
  auto st = pb::Knowledge::NewStub(*ch)->Feedback(&ctx, req, &resp);
  if (!st.ok()) return FailGrpc(g_, st);
  if (g_.json) {
    std::cout << ProtoToJson(resp.correction()).dump() << std::endl;
  } else {
    std::cout << "marked result " << resp.correction().rank() << " ("
              << resp.correction().chunk_id() << ") of " << search_id_ << (good_ ? " good" : " bad")
              << std::endl;
  }
  return kExitOk;
}

}  // namespace fwai
