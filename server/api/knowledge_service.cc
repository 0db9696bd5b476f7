#include <grpcpp/grpcpp.h>

#include <deque>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/thread_pool.h"
#include "fwai/v1/knowledge.grpc.pb.h"
#include "server/api/api.h"
#include "server/api/offload.h"
#include "server/api/gate.h"
#include "absl/strings/match.h"
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
  bool Mine(const std::string& c) const {
    return c == "~" + who.user || absl::StartsWith(c, "~" + who.user + "/");
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
      return absl::NotFoundError(absl::StrCat("collection ", c, " not found"));
    }
    if (ids.MayWriteSharedKnowledge(who)) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "the shared knowledge base is written by roles in knowledge_writers (rule: knowledge_writers); you are ",
        who.id, " with role ", RoleName(who.role), ". Use a personal collection: --collection ~NAME"));
  }
};

// Ingest: a header message, then the document's bytes; progress comes back.
// The work runs on the pool; writes are queued, one in flight. Deletes itself
// in OnDone.
class IngestReactor final : public grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress> {
 public:
  IngestReactor(const ApiDeps& deps, grpc::CallbackServerContext* ctx, int64_t cap) : deps_(deps), cap_(cap) {
    auto who = deps_.gate->Admit(ctx, "Knowledge.Ingest");
    if (!who.ok()) {
      Fail(who.status());
      return;
    }
    who_ = *std::move(who);
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client sent everything: ingest off the gRPC thread.
      if (!have_header_) {
        Fail(absl::InvalidArgumentError("ingest: the first message must be a header"));
        return;
      }
      Send(Progress("received"));
      {
        std::lock_guard<std::mutex> lock(mu_);
        running_ = true;
      }
      if (!deps_.pool->Submit([this] { RunAndRelease(); })) {
        {
          std::lock_guard<std::mutex> lock(mu_);
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
        Fail(absl::InvalidArgumentError(absl::StrCat(header_.name(), ": ", header_.size() / 1e6, " MB is over the ",
                                                     cap_ / (1 << 20), " MB limit")));
        return;
      }
      Collections cols{who_, deps_.gate->identities()};
      header_.set_collection(cols.Resolve(header_.collection()));
      if (auto s = cols.MayWrite(header_.collection().empty() ? "default" : header_.collection()); !s.ok()) {
        Fail(s);
        return;
      }
      if (auto s = deps_.gate->quotas().Ingest(who_.id, std::max<int64_t>(header_.size(), 0),
                                               deps_.gate->identities().LimitsOf(who_));
          !s.ok()) {
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
        Fail(absl::InvalidArgumentError(absl::StrCat(header_.name(), ": over the ", cap_ / (1 << 20), " MB limit")));
        return;
      }
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
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
    {
      std::lock_guard<std::mutex> lock(mu_);
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
      std::lock_guard<std::mutex> lock(mu_);
      running_ = false;
      last = done_;
    }
    if (last) delete this;
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
    req.bytes = std::move(bytes_);
    auto r = deps_.knowledge->Ingest(std::move(req), [this](const std::string& stage) {
      if (stage != "done") Send(Progress(stage));
    });
    if (!r.ok()) {
      Fail(r.status());
      return;
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
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_ || final_queued_) return;
    queue_.push_back(std::move(p));
    if (last) final_queued_ = true;
    Pump();
  }

  void Fail(const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    final_status_ = ToGrpcStatus(s);
    final_queued_ = true;
    queue_.clear();
    Pump();
  }

  // Holds mu_.
  void Pump() {
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
  Principal who_;
  pb::IngestChunk in_;
  bool have_header_ = false;
  pb::IngestHeader header_;
  std::string bytes_;
  std::mutex mu_;
  std::deque<pb::IngestProgress> queue_;
  pb::IngestProgress out_;
  bool writing_ = false;
  bool finished_ = false;
  bool final_queued_ = false;
  bool running_ = false;
  bool done_ = false;
  grpc::Status final_status_ = grpc::Status::OK;
};

class KnowledgeService final : public pb::Knowledge::CallbackService {
 public:
  explicit KnowledgeService(ApiDeps deps) : deps_(std::move(deps)) {}

  grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress>* Ingest(grpc::CallbackServerContext* ctx) override {
    if (!deps_.knowledge) {
      auto* r = new Refuser();
      return r;
    }
    return new IngestReactor(deps_, ctx, 50ll << 20);
  }

  grpc::ServerUnaryReactor* ListDocuments(grpc::CallbackServerContext* ctx, const pb::ListDocumentsRequest* req,
                                          pb::ListDocumentsResponse* resp) override {
    return Offload(ctx, "Knowledge.ListDocuments", [this, req, resp](const Principal& who) -> absl::Status {
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

  grpc::ServerUnaryReactor* DeleteDocument(grpc::CallbackServerContext* ctx, const pb::DeleteDocumentRequest* req,
                                           pb::DeleteDocumentResponse* resp) override {
    return Offload(ctx, "Knowledge.DeleteDocument", [this, req, resp](const Principal& who) -> absl::Status {
      if (req->doc().empty()) return absl::InvalidArgumentError("doc: required (a document id or name)");
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
        return absl::NotFoundError(absl::StrCat("document '", req->doc(), "' not found",
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
    return Offload(ctx, "Knowledge.Search", [this, req, resp](const Principal& who) -> absl::Status {
      const auto t0 = std::chrono::steady_clock::now();
      Collections cols{who, deps_.gate->identities()};
      KbSearchRequest r;
      r.query = req->query();
      r.max_results = req->has_max_results() ? req->max_results() : 10;
      r.threshold = req->threshold();
      r.collection = cols.Resolve(req->collection());
      if (!cols.Visible(r.collection)) return absl::NotFoundError(absl::StrCat("collection ", r.collection, " not found"));
      if (!who.admin()) r.collection_visible = [cols](const std::string& c) { return cols.Visible(c); };
      for (const auto& d : req->filters().docs()) r.docs.push_back(d);
      for (const auto& t : req->filters().content_types()) r.content_types.push_back(t);
      for (const auto& t : req->filters().tags()) r.tags[t.key()] = t.value();
      r.rerank = !req->no_rerank();
      if (req->mode() == "lexical") {
        r.mode = SearchMode::kLexical;
      } else if (req->mode() == "vector") {
        r.mode = SearchMode::kVector;
      } else if (!req->mode().empty() && req->mode() != "hybrid") {
        return absl::InvalidArgumentError(absl::StrCat("mode: '", req->mode(), "'; expected hybrid, lexical or vector"));
      }
      auto hits = deps_.knowledge->Search(r);
      if (!hits.ok()) return hits.status();
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
      }
      resp->set_took_ms(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
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
      return absl::OkStatus();
    });
  }

 private:
  // Refuses an ingest when the knowledge base is not available.
  class Refuser final : public grpc::ServerBidiReactor<pb::IngestChunk, pb::IngestProgress> {
   public:
    Refuser() { Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the knowledge base is not available")); }
    void OnDone() override { delete this; }
  };

  grpc::ServerUnaryReactor* Offload(grpc::CallbackServerContext* ctx, std::string_view rpc,
                                    std::function<absl::Status(const Principal&)> work) {
    auto who = deps_.gate->Admit(ctx, rpc);
    if (!who.ok()) return Refuse(ctx, who.status());
    return OffloadUnary(ctx, deps_.pool, deps_.knowledge != nullptr, "the knowledge base is not available",
                        [who = *who, work = std::move(work)] { return work(who); });
  }

  const ApiDeps deps_;
};

}  // namespace

std::unique_ptr<grpc::Service> MakeKnowledgeService(const ApiDeps& deps) {
  return std::make_unique<KnowledgeService>(deps);
}

}  // namespace fwai
