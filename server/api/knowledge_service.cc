#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <map>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/gate.h"
#include "server/api/offload.h"
#include "server/firmware/check_registers.h"
#include "server/knowledge/extract.h"
#include "server/knowledge/knowledge_base.h"

namespace fwai {
namespace {

namespace pb = fwai::v1;

// Collections: the team's shared ones, readable by everyone and written by
// the roles in knowledge_writers; and personal ones, "~NAME" as the caller
// says it, stored as "~USER/NAME", seen and written by their user (and
// admins) only.
struct Collections {
  const Principal& who;
  Identities& ids;

  bool Personal(const std::string& c) const { return absl::StartsWith(c, "~"); }
  // "~alice/notes" -> "alice".
  static std::string NameOf(const std::string& c) {
    return c.substr(1, c.find('/') == std::string::npos ? std::string::npos : c.find('/') - 1);
  }
  // The caller's own: the name's owner (Identities::OwnerOfName) is the
  // caller, or the same person under another id. Asked for every candidate
  // chunk of a search (from any thread): each name is looked up once.
  struct Memo {
    Mutex mu;
    std::map<std::string, bool> mine ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Memo> memo = std::make_shared<Memo>();
  bool Mine(const std::string& c) const {
    if (!Personal(c)) return false;
    const std::string name = NameOf(c);
    MutexLock lock(&memo->mu);
    auto it = memo->mine.find(name);
    if (it == memo->mine.end())
      it = memo->mine.emplace(name, who.Owns(ids.OwnerOfName(name))).first;
    return it->second;
  }
  // The stored name of what the caller asked for ("~notes" -> "~alice/notes").
  std::string Resolve(const std::string& c) const {
    if (!Personal(c) || Mine(c) || (who.admin() && c.find('/') != std::string::npos)) return c;
    if (c.find('/') != std::string::npos) return c;  // another's: refused by the checks below
    return c == "~" ? "~" + who.user : "~" + who.user + "/" + c.substr(1);
  }
  bool Visible(const std::string& c) const { return !Personal(c) || Mine(c) || who.admin(); }
  absl::Status MayWrite(const std::string& c) const {
    if (Personal(c)) {
      if (Mine(c) || who.admin()) return absl::OkStatus();
      if (NameOf(c) == who.user) {
        // The caller's own name is someone else's: a token made for a local
        // account's name that users: does not map to that account, or a
        // local account whose name is another configured user's.
        const std::string owner = ids.OwnerOfName(who.user);
        return absl::PermissionDeniedError(absl::StrCat(
            "collection ", c, ": ~", who.user, " belongs to ",
            absl::StartsWith(owner, "uid:") ? "the local account " : "fwaid.yaml's user ", who.user,
            " (", owner, "), not to you (", who.id,
            "); map yourself to it in fwaid.yaml (users.NAME.local_user) "
            "(rule: personal collections)"));
      }
      return absl::NotFoundError(absl::StrCat("collection ", c, " not found"));
    }
    if (ids.MayWriteSharedKnowledge(who)) return absl::OkStatus();
    return absl::PermissionDeniedError(
        absl::StrCat("the shared knowledge base is written by roles in knowledge_writers (rule: "
                     "knowledge_writers); you are ",
                     who.id, " with role ", RoleName(who.role),
                     ". Use a personal collection: --collection ~NAME"));
  }
};

// Ingest: a header message, then the document's bytes; progress comes back.
// The work runs on the ingest pool (a background worker); writes are queued,
// one in flight. Deletes itself in OnDone.
class IngestReactor final : public grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress> {
 public:
  IngestReactor(const ApiDeps& deps, grpc::CallbackServerContext* ctx, int64_t cap)
      : deps_(deps), cap_(cap), ctx_(ctx) {
    auto who = deps_.gate->Admit(ctx, "Knowledge.Ingest");
    if (!who.ok()) {
      Fail(who.status());
      return;
    }
    who_ = *std::move(who);
    // A revoked or expired token ends the upload with the gate's status.
    ticket_ = deps_.gate->Track(who_, ctx, [this](const grpc::Status& why) {
      Fail(absl::Status(static_cast<absl::StatusCode>(why.error_code()), why.error_message()));
    });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      {
        // Ended meanwhile (the token was revoked): what came is not ingested.
        MutexLock lock(&mu_);
        if (finished_ || final_queued_) return;
      }
      // The reads ended: the client sent everything, or went away (a
      // cancel, a deadline, a broken connection) — then nothing is stored.
      if (ctx_->IsCancelled()) {
        Fail(absl::CancelledError("ingest: the upload was cancelled; nothing was stored"));
        return;
      }
      if (!have_header_) {
        Fail(absl::InvalidArgumentError("ingest: the first message must be a header"));
        return;
      }
      if (header_.size() > 0 && static_cast<int64_t>(bytes_.size()) != header_.size()) {
        Fail(absl::InvalidArgumentError(absl::StrCat(
            "ingest: ", header_.name(), ": ", bytes_.size(), " of the ", header_.size(),
            " bytes its header declared arrived; nothing was stored")));
        return;
      }
      // Ingest off the gRPC thread.
      Send(Progress("received"));
      {
        MutexLock lock(&mu_);
        running_ = true;
      }
      ThreadPool* pool = deps_.ingest_pool ? deps_.ingest_pool : deps_.pool;
      if (!pool->Submit([this] { RunAndRelease(); })) {
        {
          MutexLock lock(&mu_);
          running_ = false;
        }
        Fail(absl::UnavailableError("fwaid is shutting down"));
      }
      return;
    }
    if (in_.has_header()) {
      if (have_header_) {
        Fail(absl::InvalidArgumentError("ingest: a second header"));
        return;
      }
      have_header_ = true;
      header_ = in_.header();
      if (header_.name().empty()) {
        Fail(absl::InvalidArgumentError("ingest: header.name is required"));
        return;
      }
      if (header_.size() > cap_) {
        Fail(absl::InvalidArgumentError(absl::StrCat(header_.name(), ": ", header_.size() / 1e6,
                                                     " MB is over the ", cap_ / (1 << 20),
                                                     " MB limit")));
        return;
      }
      Collections cols{who_, deps_.gate->identities()};
      header_.set_collection(cols.Resolve(header_.collection()));
      if (auto s = cols.MayWrite(header_.collection().empty() ? "default" : header_.collection());
          !s.ok()) {
        Fail(s);
        return;
      }
      // The size the client declares is charged up front (a file over the
      // hour's budget is refused before it is sent); what arrives beyond it
      // is charged as it arrives (OnData), so a low declaration gains nothing.
      if (auto s = Charge(std::max<int64_t>(header_.size(), 0)); !s.ok()) {
        Fail(s);
        return;
      }
    } else {
      if (!have_header_) {
        Fail(absl::InvalidArgumentError("ingest: the first message must be a header"));
        return;
      }
      bytes_.append(in_.data());
      if (static_cast<int64_t>(bytes_.size()) > cap_) {
        Fail(absl::InvalidArgumentError(
            absl::StrCat(header_.name(), ": over the ", cap_ / (1 << 20), " MB limit")));
        return;
      }
      if (const int64_t over = static_cast<int64_t>(bytes_.size()) - charged_; over > 0) {
        if (auto s = Charge(over); !s.ok()) {
          Fail(s);
          return;
        }
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      queue_.clear();
      if (!finished_) {
        finished_ = true;
        Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
      }
      return;
    }
    Pump();
  }

  // The pool task may outlive the stream (client cancelled): whoever is last,
  // OnDone or the task, deletes the reactor.
  void OnDone() override {
    ticket_.reset();  // first: the gate no longer ends a stream that is gone
    {
      MutexLock lock(&mu_);
      done_ = true;
      if (running_) return;
    }
    delete this;
  }

 private:
  void RunAndRelease() {
    Run();
    bool last;
    {
      MutexLock lock(&mu_);
      running_ = false;
      last = done_;
    }
    if (last) delete this;
  }

  // Charges `bytes` to the caller's ingest budget (limits.ingest_mb_per_hour).
  absl::Status Charge(int64_t bytes) {
    RETURN_IF_ERROR(
        deps_.gate->quotas().Ingest(who_.id, bytes, deps_.gate->identities().LimitsOf(who_)));
    charged_ += bytes;
    return absl::OkStatus();
  }

  pb::IngestProgress Progress(const std::string& stage) {
    pb::IngestProgress p;
    p.set_stage(stage);
    p.set_bytes(static_cast<int64_t>(bytes_.size()));
    return p;
  }

  void Run() {
    IngestRequest req;
    req.name = header_.name();
    req.collection = header_.collection();
    for (const auto& t : header_.tags()) req.tags[t.key()] = t.value();
    req.kind = header_.kind();
    req.modified_us = header_.modified_us();
    // An SVD added to the knowledge base also makes its part checkable.
    const std::string svd =
        DetectFormat(header_.name(), bytes_) == DocFormat::kSvd ? bytes_ : std::string();
    req.bytes = std::move(bytes_);
    auto r = deps_.knowledge->Ingest(std::move(req), [this](const std::string& stage) {
      if (stage != "done") Send(Progress(stage));
    });
    if (!r.ok()) {
      Fail(r.status());
      return;
    }
    if (!svd.empty() && deps_.svd_catalog) {
      auto device = deps_.svd_catalog->Add(svd, header_.name());
      if (device.ok()) {
        spdlog::info("kb: {} makes part {} checkable (fwai check registers)", header_.name(),
                     *device);
      } else {
        spdlog::warn("kb: {} is in the knowledge base but checks no registers: {}", header_.name(),
                     std::string(device.status().message()));
      }
    }
    pb::IngestProgress p = Progress("done");
    p.set_chunks(r->chunks);
    p.set_doc_id(r->doc_id);
    p.set_unchanged(r->unchanged);
    p.set_pages(r->pages);
    p.set_replaced_doc_id(r->replaced_doc_id);
    p.set_duplicate_of(r->duplicate_of);
    Send(std::move(p), /*last=*/true);
  }

  void Send(pb::IngestProgress p, bool last = false) {
    MutexLock lock(&mu_);
    if (finished_ || final_queued_) return;
    queue_.push_back(std::move(p));
    if (last) final_queued_ = true;
    Pump();
  }

  void Fail(const absl::Status& s) {
    MutexLock lock(&mu_);
    if (finished_) return;
    final_status_ = ToGrpcStatus(s);
    final_queued_ = true;
    queue_.clear();
    Pump();
  }

  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      out_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&out_);
      return;
    }
    if (final_queued_) {
      finished_ = true;
      Finish(final_status_);
    }
  }

  const ApiDeps& deps_;
  const int64_t cap_;
  grpc::CallbackServerContext* const ctx_;
  // Set in the constructor, read-only after.
  Principal who_;
  // The upload: written by the read callbacks (one at a time), then read by
  // the pool task that Submit hands them to once the reads have ended.
  pb::IngestChunk in_;
  bool have_header_ = false;
  pb::IngestHeader header_;
  std::string bytes_;
  int64_t charged_ = 0;  // bytes charged to the ingest budget
  Mutex mu_;
  std::deque<pb::IngestProgress> queue_ ABSL_GUARDED_BY(mu_);
  pb::IngestProgress out_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool final_queued_ ABSL_GUARDED_BY(mu_) = false;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_) = grpc::Status::OK;
  std::unique_ptr<Gate::Ticket> ticket_;
};

pb::SearchCorrection Correction(const SearchFeedback& f) {
  pb::SearchCorrection c;
  c.set_rank(f.rank);
  c.set_chunk_id(f.chunk_id);
  c.set_good(f.good);
  c.set_source(f.source);
  c.set_note(f.note);
  c.set_time_us(f.time_us);
  return c;
}

class KnowledgeService final : public pb::Knowledge::CallbackService {
 public:
  explicit KnowledgeService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress>* Ingest(
      grpc::CallbackServerContext* ctx) override {
    if (!deps_.knowledge) {
      auto* r = new Refuser();
      return r;
    }
    return new IngestReactor(deps_, ctx, 50ll << 20);
  }

  grpc::ServerUnaryReactor* ListDocuments(grpc::CallbackServerContext* ctx,
                                          const pb::ListDocumentsRequest* req,
                                          pb::ListDocumentsResponse* resp) override {
    return Offload(ctx, "Knowledge.ListDocuments",
                   [this, req, resp](const Principal& who) -> absl::Status {
                     Collections cols{who, deps_.gate->identities()};
                     auto docs = deps_.knowledge->List(cols.Resolve(req->collection()));
                     if (!docs.ok()) return docs.status();
                     for (const auto& d : *docs) {
                       if (!cols.Visible(d.collection)) continue;
                       auto* o = resp->add_documents();
                       o->set_id(d.id);
                       o->set_name(d.name);
                       o->set_collection(d.collection);
                       for (const auto& [k, v] : d.tags) {
                         auto* t = o->add_tags();
                         t->set_key(k);
                         t->set_value(v);
                       }
                       o->set_bytes(d.bytes);
                       o->set_chunks(d.chunks);
                       o->set_pages(d.pages);
                       o->set_content_hash(d.content_hash);
                       o->set_indexed_us(d.indexed_us);
                       o->set_format(d.format);
                     }
                     return absl::OkStatus();
                   });
  }

  grpc::ServerUnaryReactor* DeleteDocument(grpc::CallbackServerContext* ctx,
                                           const pb::DeleteDocumentRequest* req,
                                           pb::DeleteDocumentResponse* resp) override {
    return Offload(
        ctx, "Knowledge.DeleteDocument", [this, req, resp](const Principal& who) -> absl::Status {
          if (req->doc().empty())
            return absl::InvalidArgumentError("doc: required (a document id or name)");
          Collections cols{who, deps_.gate->identities()};
          const std::string collection = cols.Resolve(req->collection());
          // The document's own collection decides who may delete it.
          auto docs = deps_.knowledge->List(collection);
          if (!docs.ok()) return docs.status();
          const DocumentInfo* found = nullptr;
          for (const auto& d : *docs) {
            if ((d.id == req->doc() || d.name == req->doc()) && cols.Visible(d.collection)) {
              found = &d;
              break;
            }
          }
          if (found == nullptr) {
            return absl::NotFoundError(
                absl::StrCat("document '", req->doc(), "' not found",
                             collection.empty() ? "" : " in collection " + collection));
          }
          if (auto s = cols.MayWrite(found->collection); !s.ok()) return s;
          auto n = deps_.knowledge->Delete(found->id, found->collection);
          if (!n.ok()) return n.status();
          resp->set_chunks_removed(*n);
          return absl::OkStatus();
        });
  }

  grpc::ServerUnaryReactor* Search(grpc::CallbackServerContext* ctx, const pb::SearchRequest* req,
                                   pb::SearchResponse* resp) override {
    // Who asked, for the retrieval log: the fwai CLI says so in metadata.
    std::string source = "api";
    auto client = ctx->client_metadata().find("fwai-client");
    if (client != ctx->client_metadata().end() && client->second == "cli") source = "cli";
    return Offload(
        ctx, "Knowledge.Search", [this, req, resp, source](const Principal& who) -> absl::Status {
          const auto t0 = std::chrono::steady_clock::now();
          Collections cols{who, deps_.gate->identities()};
          KbSearchRequest r;
          r.query = req->query();
          r.max_results = req->has_max_results() ? req->max_results() : 10;
          r.threshold = req->threshold();
          r.collection = cols.Resolve(req->collection());
          if (!cols.Visible(r.collection))
            return absl::NotFoundError(absl::StrCat("collection ", r.collection, " not found"));
          if (!who.admin())
            r.collection_visible = [cols](const std::string& c) { return cols.Visible(c); };
          for (const auto& d : req->filters().docs()) r.docs.push_back(d);
          for (const auto& t : req->filters().content_types()) r.content_types.push_back(t);
          for (const auto& t : req->filters().tags()) r.tags[t.key()] = t.value();
          r.rerank = !req->no_rerank();
          if (req->chunks_only()) {
            r.passage_tokens = 0;
          } else if (req->has_passage_tokens()) {
            if (req->passage_tokens() < 1 || req->passage_tokens() > 512) {
              return absl::InvalidArgumentError(
                  absl::StrCat("passage_tokens: ", req->passage_tokens(), "; expected 1..512"));
            }
            r.passage_tokens = req->passage_tokens();
          }
          if (req->mode() == "lexical") {
            r.mode = SearchMode::kLexical;
          } else if (req->mode() == "vector") {
            r.mode = SearchMode::kVector;
          } else if (!req->mode().empty() && req->mode() != "hybrid") {
            return absl::InvalidArgumentError(
                absl::StrCat("mode: '", req->mode(), "'; expected hybrid, lexical or vector"));
          }
          r.origin.source = source;
          r.origin.owner = who.id;
          KbSearchInfo info;
          auto hits = deps_.knowledge->Search(r, &info);
          if (!hits.ok()) return hits.status();
          resp->set_search_id(info.search_id);
          for (const auto& w : info.rewrites) resp->add_rewrites(w);
          for (const auto& h : *hits) {
            auto* o = resp->add_results();
            o->set_rank(h.rank);
            o->set_score(h.score);
            o->set_doc(h.doc);
            o->set_doc_id(h.doc_id);
            o->set_title_path(h.title_path);
            o->set_page(h.page);
            o->set_start_line(h.start_line);
            o->set_end_line(h.end_line);
            o->set_content_type(h.content_type);
            o->set_text(h.text);
            o->set_chunk_id(h.chunk_id);
            for (const auto& c : h.chunk_ids) o->add_chunk_ids(c);
            o->set_end_page(h.end_page);
            o->set_tokens(h.tokens);
            for (const auto& [b, e] : h.highlights) {
              auto* hl = o->add_highlights();
              hl->set_begin(b);
              hl->set_end(e);
            }
          }
          resp->set_took_ms(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
          return absl::OkStatus();
        });
  }

  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* ctx, const pb::StatsRequest* req,
                                  pb::StatsResponse* resp) override {
    return Offload(ctx, "Knowledge.Stats", [this, req, resp](const Principal& who) -> absl::Status {
      Collections cols{who, deps_.gate->identities()};
      auto s = deps_.knowledge->Stats(cols.Resolve(req->collection()));
      if (!s.ok()) return s.status();
      resp->set_documents(s->documents);
      resp->set_chunks(s->chunks);
      resp->set_bytes(s->bytes);
      for (const auto& k : s->index_kinds) resp->add_index_kinds(k);
      resp->set_embedder(s->embedder);
      resp->set_dimension(s->dimension);
      resp->set_searches(s->log.searches);
      resp->set_feedback_good(s->log.good);
      resp->set_feedback_bad(s->log.bad);
      resp->set_feedback_cited(s->log.cited);
      resp->set_feedback_discarded(s->log.discarded);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListSearches(grpc::CallbackServerContext* ctx,
                                         const pb::ListSearchesRequest* req,
                                         pb::ListSearchesResponse* resp) override {
    return Offload(
        ctx, "Knowledge.ListSearches", [this, req, resp](const Principal& who) -> absl::Status {
          // Each caller sees the searches it made (admins: all of them).
          const int want = req->limit() == 0 ? 20 : req->limit();
          std::vector<LoggedSearch> mine;
          std::string before = req->before();
          for (size_t scanned = 0; static_cast<int>(mine.size()) < want && scanned < 100000;) {
            auto page = deps_.knowledge->retrieval_log().List(want, before);
            if (!page.ok()) return page.status();
            for (auto& s : *page) {
              before = s.id;
              if (static_cast<int>(mine.size()) < want && who.MaySee(s.origin.owner)) {
                mine.push_back(std::move(s));
              }
            }
            scanned += page->size();
            if (static_cast<int>(page->size()) < want) break;
          }
          for (const auto& s : mine) {
            auto* o = resp->add_searches();
            o->set_id(s.id);
            o->set_time_us(s.time_us);
            o->set_query(s.query);
            for (const auto& w : s.rewrites) o->add_rewrites(w);
            o->set_method(s.method);
            o->set_top_k(s.top_k);
            o->set_took_ms(s.took_ms);
            o->set_source(s.origin.source);
            o->set_session_id(s.origin.session_id);
            o->set_turn_id(s.origin.turn_id);
            o->set_call_id(s.origin.call_id);
            for (const auto& r : s.results) {
              auto* x = o->add_results();
              x->set_rank(r.rank);
              x->set_score(r.score);
              x->set_doc(r.doc);
              x->set_title_path(r.title_path);
              x->set_chunk_id(r.chunk_id);
              for (const auto& c : r.chunk_ids) x->add_chunk_ids(c);
            }
            for (const auto& f : s.feedback) *o->add_feedback() = Correction(f);
          }
          return absl::OkStatus();
        });
  }

  grpc::ServerUnaryReactor* Feedback(grpc::CallbackServerContext* ctx,
                                     const pb::FeedbackRequest* req,
                                     pb::FeedbackResponse* resp) override {
    return Offload(
        ctx, "Knowledge.Feedback", [this, req, resp](const Principal& who) -> absl::Status {
          if (req->search_id().empty())
            return absl::InvalidArgumentError("search_id: required (see fwai kb log)");
          if (req->result().empty())
            return absl::InvalidArgumentError("result: required (a rank or a chunk id)");
          // A search is corrected by whoever made it (or an admin); others' are
          // not shown to exist.
          auto logged = deps_.knowledge->retrieval_log().Get(req->search_id());
          if (!logged.ok()) return logged.status();
          if (!who.MaySee(logged->origin.owner)) {
            return absl::NotFoundError(
                absl::StrCat("search ", req->search_id(), " is not in the retrieval log"));
          }
          auto f = deps_.knowledge->retrieval_log().AddFeedback(req->search_id(), req->result(),
                                                                req->good(), "user", req->note());
          if (!f.ok()) return f.status();
          *resp->mutable_correction() = Correction(*f);
          return absl::OkStatus();
        });
  }

 private:
  // Refuses an ingest when the knowledge base is not available.
  class Refuser final : public grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress> {
   public:
    Refuser() {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the knowledge base is not available"));
    }
    void OnDone() override { delete this; }
  };

  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                    std::function<absl::Status(const Principal&)> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.knowledge != nullptr,
                        "the knowledge base is not available",
                        [who = *who, work = std::move(work)] { return work(who); });
  }

  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeKnowledgeService(const ApiDeps& deps) {
  return std::make_unique<KnowledgeService>(deps);
}

}  // namespace fwai
