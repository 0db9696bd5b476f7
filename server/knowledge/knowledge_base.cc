#include "server/knowledge/knowledge_base.h"

#include <openssl/sha.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "common/thread_priority.h"
#include "server/knowledge/bm25_index.h"
#include "server/knowledge/embedder.h"
#include "server/knowledge/passage.h"
#include "server/knowledge/query_expansion.h"
#include "server/knowledge/reranker.h"
#include "server/knowledge/tokenizer.h"
#include "server/knowledge/vector_index.h"
#include "server/knowledge/windows.h"
#include "server/storage/storage.h"

namespace fwai {

using json = nlohmann::json;

namespace {

constexpr uint32_t kNoDoc = 0xffffffffu;
const char kGenKey[] = "kb/gen";
const char kNextKey[] = "kb/next";

std::string Sha256Hex(std::string_view data) {
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), md);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : md) {
    out.push_back(hex[c >> 4]);
    out.push_back(hex[c & 15]);
  }
  return out;
}

std::string ChunkKey(uint32_t ordinal) { return EncodeU64(ordinal).substr(4); }

// Adds to `records` (ordinal -> stored record) those of `want` it does not
// hold yet, read in one batched read.
absl::Status ReadChunksInto(Storage& storage, std::vector<uint32_t> want,
                            std::unordered_map<uint32_t, std::string>& records) {
  std::sort(want.begin(), want.end());
  want.erase(std::unique(want.begin(), want.end()), want.end());
  want.erase(
      std::remove_if(want.begin(), want.end(), [&](uint32_t o) { return records.count(o) > 0; }),
      want.end());
  std::vector<std::string> keys;
  keys.reserve(want.size());
  for (uint32_t o : want) keys.push_back(ChunkKey(o));
  ASSIGN_OR_RETURN(auto raws, storage.MultiGet(Cf::kChunks, keys));
  for (size_t i = 0; i < want.size(); ++i) {
    if (raws[i]) records.emplace(want[i], *std::move(raws[i]));
  }
  return absl::OkStatus();
}

char TypeCode(const std::string& t) {
  return t == "code" ? 'c' : t == "table" ? 't' : t == "register" ? 'r' : 'x';
}

struct DocRec {
  DocumentInfo info;
  std::vector<uint32_t> ordinals;
  std::string types;  // one TypeCode per ordinal
};

json DocToJson(const DocRec& d) {
  return json{{"id", d.info.id},
              {"name", d.info.name},
              {"collection", d.info.collection},
              {"format", d.info.format},
              {"title", d.info.title},
              {"hash", d.info.content_hash},
              {"kind", d.info.kind},
              {"tags", d.info.tags},
              {"bytes", d.info.bytes},
              {"indexed_us", d.info.indexed_us},
              {"modified_us", d.info.modified_us},
              {"pages", d.info.pages},
              {"ordinals", d.ordinals},
              {"types", d.types}};
}

absl::StatusOr<DocRec> DocFromJson(std::string_view s) {
  json j = json::parse(s, nullptr, false);
  if (!j.is_object()) return absl::DataLossError("damaged document record");
  try {
    DocRec d;
    d.info.id = j.at("id");
    d.info.name = j.at("name");
    d.info.collection = j.at("collection");
    d.info.format = j.value("format", "");
    d.info.title = j.value("title", "");
    d.info.content_hash = j.value("hash", "");
    d.info.kind = j.value("kind", "");
    d.info.tags = j.value("tags", std::map<std::string, std::string>{});
    d.info.bytes = j.value("bytes", int64_t{0});
    d.info.indexed_us = j.value("indexed_us", int64_t{0});
    d.info.modified_us = j.value("modified_us", int64_t{0});
    d.info.pages = j.value("pages", 0);
    d.ordinals = j.at("ordinals").get<std::vector<uint32_t>>();
    d.types = j.value("types", "");
    d.info.chunks = static_cast<int>(d.ordinals.size());
    return d;
  } catch (const json::exception& e) {
    return absl::DataLossError(absl::StrCat("damaged document record: ", e.what()));
  }
}

// A stored chunk: metadata JSON, text, vector.
struct ChunkRec {
  json meta;
  std::string text;
  std::vector<float> vec;
};

std::string EncodeChunk(const json& meta, const std::string& text, const float* vec, int dim) {
  std::string m = meta.dump();
  std::string out;
  uint32_t ml = m.size(), tl = text.size(), d = dim;
  out.append(reinterpret_cast<const char*>(&ml), 4).append(m);
  out.append(reinterpret_cast<const char*>(&tl), 4).append(text);
  out.append(reinterpret_cast<const char*>(&d), 4);
  out.append(reinterpret_cast<const char*>(vec), sizeof(float) * dim);
  return out;
}

absl::StatusOr<ChunkRec> DecodeChunk(std::string_view s, bool want_vec) {
  auto bad = [] { return absl::DataLossError("damaged chunk record"); };
  size_t off = 0;
  auto u32 = [&](uint32_t* v) {
    if (s.size() - off < 4) return false;
    std::memcpy(v, s.data() + off, 4);
    off += 4;
    return true;
  };
  uint32_t ml, tl, dim;
  if (!u32(&ml) || s.size() - off < ml) return bad();
  ChunkRec r;
  r.meta = json::parse(s.substr(off, ml), nullptr, false);
  if (!r.meta.is_object()) return bad();
  off += ml;
  if (!u32(&tl) || s.size() - off < tl) return bad();
  r.text.assign(s.data() + off, tl);
  off += tl;
  if (!u32(&dim) || s.size() - off < size_t{dim} * 4) return bad();
  if (want_vec) {
    r.vec.resize(dim);
    std::memcpy(r.vec.data(), s.data() + off, size_t{dim} * 4);
  }
  return r;
}

// True if `word` occurs in `hay` not inside a longer word or identifier.
bool ContainsWord(const std::string& hay, const std::string& word) {
  auto inner = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = hay.find(word); at != std::string::npos; at = hay.find(word, at + 1)) {
    const bool left = at == 0 || !inner(hay[at - 1]);
    const size_t end = at + word.size();
    if (left && (end >= hay.size() || !inner(hay[end]))) return true;
  }
  return false;
}

std::string Context(const DocumentInfo& d, const std::vector<std::string>& title_path) {
  std::string c = d.name;
  if (!d.title.empty()) absl::StrAppend(&c, " — ", d.title);
  if (!title_path.empty()) absl::StrAppend(&c, " > ", absl::StrJoin(title_path, " > "));
  return c;
}

}  // namespace

struct KnowledgeBase::Impl {
  Storage& storage;
  std::string index_dir;
  KnowledgeOptions options;
  Embedder& embedder;
  Reranker& reranker;
  std::string open_report;  // set in Open(), read-only after

  // Writers (Ingest, Delete) hold ingest_mu throughout and `mu` exclusively
  // while they change the tables and indexes; readers hold `mu` shared.
  Mutex ingest_mu;         // serializes writers
  mutable SharedMutex mu;  // guards everything below
  std::vector<std::unique_ptr<DocRec>> slots ABSL_GUARDED_BY(mu);
  std::unordered_map<std::string, uint32_t> slot_by_id ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> chunk_slot ABSL_GUARDED_BY(mu);  // ordinal -> slot
  // Each document's length in lexical terms (the sum of its chunks'), for
  // document-level BM25; recomputed when the collection changed. Recounted
  // under len_mu by a reader that holds `mu` shared; the count changes only
  // after a change made under `mu` exclusively, so the slot_len a reader
  // was given stays as it is while it holds `mu`.
  struct SlotLens {
    const std::vector<uint32_t>* len;
    uint32_t present;
    float avg;
  };
  Mutex len_mu;
  std::tuple<uint64_t, size_t, size_t> len_key ABSL_GUARDED_BY(len_mu) = {~0ull, 0, 0};
  std::vector<uint32_t> slot_len ABSL_GUARDED_BY(len_mu);
  uint32_t slot_present ABSL_GUARDED_BY(len_mu) = 0;
  float slot_avg ABSL_GUARDED_BY(len_mu) = 0;

  SlotLens EnsureSlotLens() ABSL_SHARED_LOCKS_REQUIRED(mu) ABSL_LOCKS_EXCLUDED(len_mu) {
    MutexLock g(&len_mu);
    const auto key = std::make_tuple(generation, slots.size(), bm25 ? bm25->size() : 0);
    if (key != len_key) {
      slot_len.assign(slots.size(), 0);
      for (uint32_t o = 0; o < chunk_slot.size(); ++o) {
        if (chunk_slot[o] != kNoDoc && chunk_slot[o] < slot_len.size())
          slot_len[chunk_slot[o]] += bm25->Length(o);
      }
      uint64_t total = 0;
      slot_present = 0;
      for (uint32_t l : slot_len) {
        total += l;
        slot_present += l > 0 ? 1 : 0;
      }
      slot_avg = slot_present > 0 ? static_cast<float>(total) / slot_present : 0.f;
      len_key = key;
    }
    return {&slot_len, slot_present, slot_avg};
  }
  std::vector<char> chunk_type ABSL_GUARDED_BY(mu);
  uint64_t generation ABSL_GUARDED_BY(mu) = 0;
  uint64_t next_ordinal ABSL_GUARDED_BY(mu) = 0;
  std::unique_ptr<Bm25Index> bm25 ABSL_GUARDED_BY(mu) ABSL_PT_GUARDED_BY(mu);
  std::unique_ptr<VectorIndex> vectors ABSL_GUARDED_BY(mu) ABSL_PT_GUARDED_BY(mu);
  std::unique_ptr<RetrievalLog> log;  // set in Open(), read-only after (thread-safe itself)
  // Document names and titles by slot: picks documents a query names.
  Bm25Index doc_titles ABSL_GUARDED_BY(mu);
  // Changes to the in-memory indexes since open: each update (a new
  // generation) and each vector index built aside and swapped in (the same
  // generation, the same vectors, another index). A save is due while the
  // saved count differs.
  uint64_t changes ABSL_GUARDED_BY(mu) = 0;
  Mutex save_mu;  // one save at a time; guards saved_changes
  uint64_t saved_changes ABSL_GUARDED_BY(save_mu) = 0;

  Mutex saver_mu;
  CondVar saver_cv;
  bool stopping ABSL_GUARDED_BY(saver_mu) = false;
  std::thread saver;  // started at the end of Open(), joined by ~KnowledgeBase

  // Ingest may run on a thread of low CPU priority (fwaid's ingest worker
  // runs at SCHED_IDLE). Its short commit, which holds RocksDB's write queue
  // and the index lock, runs on this thread of the priority the knowledge
  // base was opened with: a session's event append or a search never waits
  // on a writer the scheduler has set aside.
  ThreadPool committer{1, [] { NameThisThread("fwaid-kb-commit"); }};
  // The update of the in-memory indexes that follows runs on a thread of
  // background priority (nice 10): it holds the index lock, so searches must
  // not wait on a thread set aside as the ingest's is, but it can take
  // seconds of CPU on every core (the vector index trains its lists when the
  // collection outgrows exact search or has grown fourfold since), and the
  // streaming turns must keep their cores meanwhile. OpenMP's workers, started
  // from this thread, run at its priority.
  ThreadPool indexer{1, [] {
                       NameThisThread("fwaid-kb-index");
                       if (auto s = SetThisThreadPriority(ThreadPriority::kBackground); !s.ok()) {
                         spdlog::warn("knowledge index thread: {}; it runs at normal priority",
                                      std::string(s.message()));
                       }
                     }};
  // Builds of the vector index (training its lists) run here, at the lowest
  // priority (SCHED_IDLE) and without the index lock (BuildVectorsAside):
  // seconds of CPU on every core that only idle cores give. OpenMP's
  // workers, started from this thread, run at its priority.
  ThreadPool trainer{1, [] {
                       NameThisThread("fwaid-kb-train");
                       if (auto s = SetThisThreadPriority(ThreadPriority::kIdle); !s.ok()) {
                         spdlog::warn("knowledge training thread: {}; it runs at normal priority",
                                      std::string(s.message()));
                       }
                     }};
  static absl::Status RunOn(ThreadPool& pool, const std::function<absl::Status()>& fn) {
    std::promise<absl::Status> done;
    auto result = done.get_future();
    if (!pool.Submit([&] { done.set_value(fn()); })) return fn();
    return result.get();
  }
  absl::Status Commit(const std::function<absl::Status()>& fn) { return RunOn(committer, fn); }

  Impl(Storage& s, std::string dir, KnowledgeOptions o, Embedder& e, Reranker& r)
      : storage(s), index_dir(std::move(dir)), options(o), embedder(e), reranker(r) {}

  std::string LexPath() const { return index_dir + "/lexical.bm25"; }
  std::string VecPath() const { return index_dir + "/vectors"; }
  VectorIndexOptions VecOptions() const {
    VectorIndexOptions vo;
    vo.exact_below = options.exact_below;
    vo.approximate = options.vector_index;
    vo.ivf_lists = options.ivf_lists;
    vo.ivf_nprobe = options.ivf_nprobe;
    vo.ivf_max_probe_share = options.ivf_max_probe_share;
    vo.hnsw_m = options.hnsw_m;
    vo.ef_construction = options.hnsw_ef_construction;
    vo.ef_search = options.hnsw_ef_search;
    vo.min_recall = options.vector_min_recall;
    vo.build_on_add = false;  // built aside (BuildVectorsAside)
    return vo;
  }

  const DocRec* FindDoc(const std::string& doc, const std::string& collection) const
      ABSL_SHARED_LOCKS_REQUIRED(mu) {
    auto it = slot_by_id.find(doc);
    if (it != slot_by_id.end()) return slots[it->second].get();
    for (const auto& d : slots) {
      if (d && d->info.name == doc && (collection.empty() || d->info.collection == collection))
        return d.get();
    }
    return nullptr;
  }

  void AddDocLocked(std::unique_ptr<DocRec> d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    uint32_t slot = static_cast<uint32_t>(slots.size());
    for (size_t i = 0; i < d->ordinals.size(); ++i) {
      uint32_t o = d->ordinals[i];
      if (o >= chunk_slot.size()) {
        chunk_slot.resize(o + 1, kNoDoc);
        chunk_type.resize(o + 1, 'x');
      }
      chunk_slot[o] = slot;
      chunk_type[o] = i < d->types.size() ? d->types[i] : 'x';
    }
    slot_by_id[d->info.id] = slot;
    std::vector<std::string> terms;
    Tokenize(d->info.name + "\n" + d->info.title, &terms);
    doc_titles.Add(slot, terms);
    slots.push_back(std::move(d));
  }

  void RemoveDocLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    auto it = slot_by_id.find(id);
    if (it == slot_by_id.end()) return;
    DocRec* d = slots[it->second].get();
    for (uint32_t o : d->ordinals) {
      if (o < chunk_slot.size()) chunk_slot[o] = kNoDoc;
      bm25->Remove(o);
      vectors->Remove(o);
    }
    doc_titles.Remove(it->second);
    slots[it->second].reset();
    slot_by_id.erase(it);
  }

  // Visits each chunk record of the store that `member` accepts (by ordinal),
  // decoded (with its vector when `with_vector`); damaged records are skipped
  // with a warning.
  absl::Status ScanChunks(bool with_vector, const std::function<bool(uint32_t)>& member,
                          const std::function<void(uint32_t, ChunkRec&)>& visit) const {
    absl::Status bad;
    RETURN_IF_ERROR(storage.Scan(Cf::kChunks, "", "", [&](std::string_view k, std::string_view v) {
      if (k.size() != 4) return true;
      uint32_t o = static_cast<uint32_t>(DecodeU64(std::string(4, '\0') + std::string(k)));
      if (!member(o)) return true;
      auto rec = DecodeChunk(v, with_vector);
      if (!rec.ok()) {
        bad = rec.status();
        return true;
      }
      visit(o, *rec);
      return true;
    }));
    if (!bad.ok())
      spdlog::warn("knowledge: skipped damaged chunk records during rebuild: {}", bad.ToString());
    return absl::OkStatus();
  }
  // Whether chunk `o` belongs to a document of the tables.
  bool InDocument(uint32_t o) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return o < chunk_slot.size() && chunk_slot[o] != kNoDoc;
  }

  std::unique_ptr<VectorIndex> MakeVectors(const std::vector<uint32_t>& ids,
                                           const std::vector<float>& vecs) const {
    auto v = std::make_unique<VectorIndex>(embedder.dimension(), VecOptions());
    v->Build(ids, vecs);
    if (v->off()) {
      spdlog::info(
          "knowledge: vector search off over {} vectors: {}; searches use the lexical "
          "legs alone until the collection has grown {}x",
          ids.size(), v->off_reason(), VecOptions().ivf_retrain_growth);
    } else if (v->tuned_recall() >= 0) {
      spdlog::info("knowledge: vector index {} over {} vectors: recall@10 {:.3f} on its sample",
                   v->describe(), ids.size(), v->tuned_recall());
    }
    return v;
  }

  // At open (nothing else runs yet).
  absl::Status Rebuild(bool lexical, bool vector) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (lexical) bm25 = std::make_unique<Bm25Index>(Bm25Params{options.bm25_k1, options.bm25_b});
    std::vector<uint32_t> ids;
    std::vector<float> vecs;
    std::vector<std::string> terms;
    // ScanChunks calls both back on this thread.
    RETURN_IF_ERROR(ScanChunks(
        vector, [this](uint32_t o) ABSL_SHARED_LOCKS_REQUIRED(mu) { return InDocument(o); },
        [&](uint32_t o, ChunkRec& rec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
          if (lexical) {
            const DocRec& d = *slots[chunk_slot[o]];
            terms.clear();
            std::vector<std::string> path =
                rec.meta.value("title_path", std::vector<std::string>{});
            Tokenize(Context(d.info, path) + "\n" + rec.text, &terms);
            bm25->Add(o, terms);
          }
          if (vector && static_cast<int>(rec.vec.size()) == embedder.dimension()) {
            ids.push_back(o);
            vecs.insert(vecs.end(), rec.vec.begin(), rec.vec.end());
          }
        }));
    if (vector) vectors = MakeVectors(ids, vecs);
    return absl::OkStatus();
  }

  // A new vector index of every document's chunks, built from the store
  // when the index says a build is due (the collection outgrew exact search,
  // an IVF index grew past its retrain growth, or too many vectors were
  // removed). Training the lists can take seconds of CPU on every core, so
  // it runs without the index lock, on the trainer thread: searches go on
  // with the index as it is (already holding the update that made the build
  // due). Caller holds ingest_mu: no writer changes the tables meanwhile
  // (readers only read them).
  absl::StatusOr<std::unique_ptr<VectorIndex>> BuildVectorsAside()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ingest_mu) ABSL_LOCKS_EXCLUDED(mu) {
    // Which chunks are a document's, read here under the shared lock: the
    // trainer reads the store without it (the tables cannot change while
    // ingest_mu is held).
    std::vector<bool> in_document;
    {
      ReaderMutexLock l(&mu);
      in_document.resize(chunk_slot.size());
      for (uint32_t o = 0; o < chunk_slot.size(); ++o) in_document[o] = chunk_slot[o] != kNoDoc;
    }
    std::unique_ptr<VectorIndex> built;
    absl::Status s = RunOn(trainer, [&]() -> absl::Status {
      if (options.while_building_vectors_for_test) options.while_building_vectors_for_test();
      std::vector<uint32_t> ids;
      std::vector<float> vecs;
      RETURN_IF_ERROR(ScanChunks(
          true, [&in_document](uint32_t o) { return o < in_document.size() && in_document[o]; },
          [&](uint32_t o, ChunkRec& rec) {
            if (static_cast<int>(rec.vec.size()) != embedder.dimension()) return;
            ids.push_back(o);
            vecs.insert(vecs.end(), rec.vec.begin(), rec.vec.end());
          }));
      built = MakeVectors(ids, vecs);
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    return built;
  }

  // After an update made a build of the vector index due: the new index,
  // built aside, replaces the one searches used meanwhile. Caller holds
  // ingest_mu only.
  void RebuildVectorsAside() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ingest_mu) ABSL_LOCKS_EXCLUDED(mu) {
    auto built = BuildVectorsAside();
    if (!built.ok()) {
      spdlog::warn("knowledge: building the vector index failed: {}; the next update tries again",
                   built.status().ToString());
      return;
    }
    std::unique_ptr<VectorIndex> old;  // freed after the lock (GBs at a million vectors)
    {
      WriterMutexLock l(&mu);
      old = std::exchange(vectors, *std::move(built));
      ++changes;
    }
  }

  // What a save writes, copied under the index lock: the lexical index (its
  // mapped base image shared, not copied), each chunk's group key and the
  // vector index's saved form. The files are then written without the lock,
  // so an ingest meanwhile does not wait for the disk.
  struct SaveSnapshot {
    uint64_t generation = 0, changes = 0;
    std::unique_ptr<Bm25Index> bm25_copy;
    const Bm25Index* bm25 = nullptr;  // the copy, or the live index when nothing else runs
    std::vector<uint32_t> group_key;  // ordinal -> its document's first chunk
    VectorIndex::Image vectors;
    const VectorIndex* live_vectors = nullptr;  // exclusive: written from the live index
  };

  // Caller holds `mu` (shared is enough). `exclusive`: nothing else runs
  // (open), so the lexical index is written from itself, not from a copy.
  absl::StatusOr<SaveSnapshot> SnapshotLocked(bool exclusive) const ABSL_SHARED_LOCKS_REQUIRED(mu) {
    SaveSnapshot s;
    s.generation = generation;
    s.changes = changes;
    if (exclusive) {
      s.bm25 = bm25.get();
    } else {
      s.bm25_copy = std::make_unique<Bm25Index>(*bm25);
      s.bm25 = s.bm25_copy.get();
    }
    // Each chunk's group is its document, keyed by the document's first
    // chunk: document-level BM25 then reads the saved group postings.
    s.group_key.assign(chunk_slot.size(), Bm25Index::kNoGroup);
    for (uint32_t o = 0; o < chunk_slot.size(); ++o) {
      if (chunk_slot[o] == kNoDoc) continue;
      const DocRec* d = slots[chunk_slot[o]].get();
      if (d && !d->ordinals.empty()) s.group_key[o] = d->ordinals.front();
    }
    if (exclusive) {
      s.live_vectors = vectors.get();
    } else {
      ASSIGN_OR_RETURN(s.vectors, vectors->Capture(generation));
    }
    return s;
  }

  // Writes a snapshot; holds no index lock.
  absl::Status WriteSnapshot(const SaveSnapshot& s) const {
    if (options.while_saving_for_test) options.while_saving_for_test();
    std::error_code ec;
    std::filesystem::create_directories(index_dir, ec);
    RETURN_IF_ERROR(s.bm25->Save(LexPath(), s.generation, [&s](uint32_t o) {
      return o < s.group_key.size() ? s.group_key[o] : Bm25Index::kNoGroup;
    }));
    if (s.live_vectors) return s.live_vectors->Save(VecPath(), s.generation);
    return VectorIndex::WriteImage(s.vectors, VecPath());
  }

  // One save (caller holds save_mu): a snapshot under the shared index lock,
  // written after it is released. Returns the generation saved.
  absl::StatusOr<uint64_t> SaveOnce(bool exclusive = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu)
      ABSL_LOCKS_EXCLUDED(mu) {
    absl::StatusOr<SaveSnapshot> snap;
    {
      ReaderMutexLock l(&mu);
      snap = SnapshotLocked(exclusive);
    }
    if (!snap.ok()) return snap.status();
    RETURN_IF_ERROR(WriteSnapshot(*snap));
    saved_changes = snap->changes;
    return snap->generation;
  }

  // After a save: the saved lexical image becomes the base tier (mapped),
  // so what the mutable tier held is memory no more. What writers changed
  // since the snapshot the image was written from is brought over from the
  // live index. Caller holds save_mu only.
  void AdoptSavedLexical(uint64_t gen) ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu)
      ABSL_LOCKS_EXCLUDED(mu) {
    auto loaded = Bm25Index::Load(LexPath(), gen);
    if (!loaded.ok()) {
      spdlog::warn("knowledge: reopening the saved lexical index: {}", loaded.status().ToString());
      return;
    }
    WriterMutexLock l(&mu);
    if (generation != gen && !(*loaded)->CatchUp(*bm25)) return;  // the next save adopts
    bm25 = *std::move(loaded);
  }

  void SaverLoop() ABSL_LOCKS_EXCLUDED(saver_mu, save_mu, mu) {
    MutexLock lock(&saver_mu);
    // Saves are spaced by ten times the last one's duration (at least the
    // debounce), so writing large indexes costs an ingest at most a tenth.
    auto wait = std::chrono::milliseconds(options.save_debounce_ms);
    while (!stopping) {
      saver_cv.WaitWithTimeout(&saver_mu, wait);
      if (stopping) break;
      lock.Unlock();
      {
        MutexLock sl(&save_mu);
        bool due;
        {
          ReaderMutexLock l(&mu);
          due = saved_changes != changes;
        }
        if (due) {
          const auto t0 = std::chrono::steady_clock::now();
          auto gen = SaveOnce();
          if (!gen.ok()) {
            spdlog::warn("knowledge: saving indexes failed: {}", gen.status().ToString());
          } else {
            AdoptSavedLexical(*gen);
          }
          wait = std::max(std::chrono::milliseconds(options.save_debounce_ms),
                          std::chrono::duration_cast<std::chrono::milliseconds>(
                              (std::chrono::steady_clock::now() - t0) * 10));
        }
      }
      lock.Lock();
    }
  }
};

KnowledgeBase::KnowledgeBase(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KnowledgeBase::~KnowledgeBase() {
  {
    MutexLock lock(&impl_->saver_mu);
    impl_->stopping = true;
  }
  impl_->saver_cv.SignalAll();
  if (impl_->saver.joinable()) impl_->saver.join();
  auto s = SaveIndexes();
  if (!s.ok()) spdlog::warn("knowledge: final index save failed: {}", s.ToString());
}

const std::string& KnowledgeBase::open_report() const { return impl_->open_report; }

namespace {

// Open's steps, in order. Nothing else sees `m` until the saver starts at
// the end of Open; the locks are taken where its tables and indexes are
// touched all the same.

// Every stored document into `m`'s tables. A record that does not parse is
// logged and left out; the others load.
absl::Status LoadDocuments(KnowledgeBase::Impl& m) {
  absl::Status bad;
  {
    WriterMutexLock lock(&m.mu);
    auto add = [&](std::string_view, std::string_view v) ABSL_EXCLUSIVE_LOCKS_REQUIRED(m.mu) {
      auto d = DocFromJson(v);
      if (!d.ok()) {
        bad = d.status();
        return true;
      }
      m.AddDocLocked(std::make_unique<DocRec>(*std::move(d)));
      return true;
    };
    RETURN_IF_ERROR(m.storage.Scan(Cf::kDocuments, "", "", add));
  }
  if (!bad.ok()) spdlog::warn("knowledge: {}", bad.ToString());
  return absl::OkStatus();
}

// The stored generation and next ordinal into `m`; returns the generation.
absl::StatusOr<uint64_t> LoadCounters(KnowledgeBase::Impl& m) {
  ASSIGN_OR_RETURN(auto gen, m.storage.Get(Cf::kMeta, kGenKey));
  ASSIGN_OR_RETURN(auto next, m.storage.Get(Cf::kMeta, kNextKey));
  WriterMutexLock lock(&m.mu);
  m.generation = gen ? DecodeU64(*gen) : 0;
  m.next_ordinal = next ? DecodeU64(*next) : 0;
  return m.generation;
}

// The collections whose vectors another embedder than `m`'s made.
absl::StatusOr<std::set<std::string>> StaleCollections(KnowledgeBase::Impl& m) {
  std::set<std::string> stale;
  RETURN_IF_ERROR(m.storage.Scan(
      Cf::kMeta, "kb/coll/", "kb/coll0", [&](std::string_view k, std::string_view v) {
        json j = json::parse(v, nullptr, false);
        if (j.is_object() && j.value("embedder", "") != m.embedder.name())
          stale.insert(std::string(k.substr(8)));
        return true;
      }));
  return stale;
}

// Which saved index loaded, and why one did not (or what else Open did).
struct IndexLoad {
  bool lexical_ok = false;
  bool vector_ok = false;
  std::vector<std::string> why;
};

// The two saved indexes of `generation`, loaded in parallel into `m`. The
// vector index is not loaded when its vectors are stale. A missing index
// of a new store (generation 0) is no reason worth reporting.
IndexLoad LoadIndexes(KnowledgeBase::Impl& m, uint64_t generation, bool vectors_stale) {
  IndexLoad r;
  std::string vector_why;
  std::unique_ptr<VectorIndex> loaded_vectors;
  std::thread vector_loader([&] {
    if (vectors_stale) return;
    auto v = VectorIndex::Load(m.VecPath(), generation, m.embedder.dimension(), m.VecOptions());
    if (v.ok() && (*v)->off() && m.options.vector_min_recall <= 0) {
      // Dropped for its recall; the settings now keep any approximate index.
      vector_why = absl::StrCat(m.VecPath(), ": vector search was off (", (*v)->off_reason(),
                                ") and no recall is required now");
    } else if (v.ok()) {
      loaded_vectors = *std::move(v);
      r.vector_ok = true;
    } else if (generation > 0) {
      vector_why = std::string(v.status().message());
    }
  });
  std::unique_ptr<Bm25Index> loaded_bm25;
  auto idx = Bm25Index::Load(m.LexPath(), generation);
  if (idx.ok()) {
    loaded_bm25 = *std::move(idx);
    r.lexical_ok = true;
  } else if (generation > 0 || !absl::IsNotFound(idx.status())) {
    r.why.push_back(std::string(idx.status().message()));
  }
  vector_loader.join();
  {
    WriterMutexLock lock(&m.mu);
    if (r.vector_ok) m.vectors = std::move(loaded_vectors);
    if (r.lexical_ok) m.bm25 = std::move(loaded_bm25);
  }
  if (!vector_why.empty()) r.why.push_back(vector_why);
  return r;
}

// Every chunk of the `stale` collections embedded again by `m`'s embedder
// (one synced batch per document), then the collections marked as its.
absl::Status ReEmbed(KnowledgeBase::Impl& m, const std::set<std::string>& stale) {
  Embedder& embedder = m.embedder;
  std::vector<const DocRec*> stale_docs;
  {
    ReaderMutexLock lock(&m.mu);
    for (const auto& d : m.slots) {
      if (d && stale.count(d->info.collection)) stale_docs.push_back(d.get());
    }
  }
  for (const DocRec* d : stale_docs) {
    std::vector<std::string> texts;
    std::vector<ChunkRec> recs;
    for (uint32_t o : d->ordinals) {
      ASSIGN_OR_RETURN(auto raw, m.storage.Get(Cf::kChunks, ChunkKey(o)));
      if (!raw) continue;
      ASSIGN_OR_RETURN(auto rec, DecodeChunk(*raw, false));
      texts.push_back(Context(d->info, rec.meta.value("title_path", std::vector<std::string>{})) +
                      "\n" + rec.text);
      recs.push_back(std::move(rec));
    }
    ASSIGN_OR_RETURN(auto vecs, embedder.Embed(texts, false));
    WriteBatch batch;
    for (size_t i = 0; i < recs.size(); ++i) {
      batch.Put(Cf::kChunks, ChunkKey(d->ordinals[i]),
                EncodeChunk(recs[i].meta, recs[i].text, vecs[i].data(), embedder.dimension()));
    }
    RETURN_IF_ERROR(m.storage.Write(batch, true));
  }
  for (const auto& c : stale) {
    RETURN_IF_ERROR(m.storage.Put(
        Cf::kMeta, "kb/coll/" + c,
        json({{"embedder", embedder.name()}, {"dimension", embedder.dimension()}}).dump(), true));
  }
  return absl::OkStatus();
}

// An index that did not load is rebuilt from the stored chunks and saved
// (when there was anything to save); loaded ones are taken as saved.
absl::Status RebuildOrAdopt(KnowledgeBase::Impl& m, const IndexLoad& load, uint64_t generation) {
  if (load.lexical_ok && load.vector_ok) {
    m.open_report = "loaded";
    MutexLock save(&m.save_mu);
    ReaderMutexLock lock(&m.mu);
    m.saved_changes = m.changes;
    if (m.bm25->image_version() < 3) {
      // A lexical image of the previous layout (no skip blocks, no group
      // postings) is searched exhaustively; the next save rewrites it.
      m.saved_changes = ~0ull;
    }
    return absl::OkStatus();
  }
  {
    WriterMutexLock lock(&m.mu);
    RETURN_IF_ERROR(m.Rebuild(!load.lexical_ok, !load.vector_ok));
  }
  m.open_report =
      absl::StrCat("rebuilt: ", load.why.empty() ? "new store" : absl::StrJoin(load.why, "; "));
  if (generation == 0 && load.why.empty()) return absl::OkStatus();
  MutexLock save(&m.save_mu);
  auto gen = m.SaveOnce(/*exclusive=*/true);
  if (!gen.ok()) {
    // The saver tries again.
    spdlog::warn("knowledge: saving the rebuilt indexes failed: {}", gen.status().ToString());
    m.saved_changes = ~0ull;
  } else if (!load.lexical_ok) {
    m.AdoptSavedLexical(*gen);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KnowledgeBase>> KnowledgeBase::Open(Storage& storage,
                                                                   const std::string& index_dir,
                                                                   KnowledgeOptions options,
                                                                   Embedder& embedder,
                                                                   Reranker& reranker) {
  auto impl = std::make_unique<Impl>(storage, index_dir, options, embedder, reranker);
  Impl& m = *impl;
  RETURN_IF_ERROR(LoadDocuments(m));
  ASSIGN_OR_RETURN(const uint64_t stored_generation, LoadCounters(m));
  // Collections embedded by another embedder are re-embedded now.
  ASSIGN_OR_RETURN(const std::set<std::string> stale, StaleCollections(m));
  IndexLoad load = LoadIndexes(m, stored_generation, /*vectors_stale=*/!stale.empty());
  if (!stale.empty()) {
    RETURN_IF_ERROR(ReEmbed(m, stale));
    load.why.push_back(
        absl::StrCat("re-embedded ", stale.size(), " collection(s) with ", embedder.name()));
  }
  RETURN_IF_ERROR(RebuildOrAdopt(m, load, stored_generation));
  {
    WriterMutexLock lock(&m.mu);
    if (!m.bm25) m.bm25 = std::make_unique<Bm25Index>(Bm25Params{options.bm25_k1, options.bm25_b});
    if (!m.vectors) m.vectors = std::make_unique<VectorIndex>(embedder.dimension(), m.VecOptions());
  }
  ASSIGN_OR_RETURN(m.log, RetrievalLog::Open(storage, options.log));
  m.saver = std::thread([p = &m] {
    // Writing the index files is background work like ingest: it takes only
    // CPU that streaming turns leave (readers go on meanwhile).
    NameThisThread("fwaid-kb-save");
    (void)SetThisThreadPriority(ThreadPriority::kIdle);
    p->SaverLoop();
  });
  return std::unique_ptr<KnowledgeBase>(new KnowledgeBase(std::move(impl)));
}

namespace {

// The document of `req`'s collection named as `req` is (null if none); a
// document of that collection with the same content makes `*result` say
// it is unchanged (and, under another name, a duplicate of it).
const DocRec* FindIngested(KnowledgeBase::Impl& m, const IngestRequest& req,
                           const std::string& hash, IngestResult* result) {
  const DocRec* old = nullptr;
  ReaderMutexLock lock(&m.mu);
  for (const auto& d : m.slots) {
    if (!d || d->info.collection != req.collection) continue;
    if (d->info.name == req.name) old = d.get();
    if (d->info.content_hash == hash) {
      result->doc_id = d->info.id;
      result->chunks = d->info.chunks;
      result->pages = d->info.pages;
      result->unchanged = true;
      if (d->info.name != req.name) result->duplicate_of = d->info.name;
    }
  }
  return old;
}

// What the index keeps of a document: its id (of collection, name and
// content), name, format, title, kind, tags, size and times.
DocumentInfo InfoOf(const IngestRequest& req, const ExtractedDoc& doc, const std::string& hash,
                    size_t chunks) {
  DocumentInfo info;
  info.id = "d-" + Sha256Hex(req.collection + '\0' + req.name + '\0' + hash).substr(0, 16);
  info.name = req.name;
  info.collection = req.collection;
  info.format = DocFormatName(doc.format);
  info.title = doc.title;
  info.content_hash = hash;
  info.kind = req.kind.empty() ? (doc.format == DocFormat::kCode ? "code" : "doc") : req.kind;
  info.tags = req.tags;
  info.bytes = static_cast<int64_t>(req.bytes.size());
  info.indexed_us = NowMicros();
  info.modified_us = req.modified_us;
  info.pages = doc.format == DocFormat::kPdf ? static_cast<int>(doc.pages.size()) : 0;
  info.chunks = static_cast<int>(chunks);
  return info;
}

// The chunk records of `rec` (ordinals from `first`, which it notes, with
// their content types): in `batch`, or with commit slices configured in
// slices of about that many bytes.
void PutChunks(const KnowledgeBase::Impl& m, const std::vector<ChunkDraft>& chunks,
               const std::vector<std::vector<float>>& vecs, uint64_t first, DocRec& rec,
               std::deque<WriteBatch>& slices, WriteBatch& batch) {
  int64_t slice_bytes = 0;
  const int64_t now = NowMicros();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const auto& c = chunks[i];
    uint32_t o = static_cast<uint32_t>(first + i);
    rec.ordinals.push_back(o);
    rec.types.push_back(TypeCode(c.content_type));
    json meta = {{"doc_id", rec.info.id},
                 {"title_path", c.title_path},
                 {"page", c.page},
                 {"start_line", c.start_line},
                 {"end_line", c.end_line},
                 {"content_type", c.content_type},
                 {"section", c.section},
                 {"tokens", c.tokens},
                 {"chars", c.text.size()},
                 {"index", i},
                 {"identifiers", FindIdentifiers(c.text, 32)},
                 {"indexed_us", now}};
    std::string value = EncodeChunk(meta, c.text, vecs[i].data(), m.embedder.dimension());
    if (m.options.commit_slice_bytes <= 0) {
      batch.Put(Cf::kChunks, ChunkKey(o), value);
      continue;
    }
    if (slices.empty() || slice_bytes >= m.options.commit_slice_bytes) {
      slices.emplace_back();
      slice_bytes = 0;
    }
    slice_bytes += static_cast<int64_t>(value.size());
    slices.back().Put(Cf::kChunks, ChunkKey(o), value);
  }
}

}  // namespace

absl::StatusOr<IngestResult> KnowledgeBase::Ingest(
    IngestRequest req, const std::function<void(const std::string&)>& progress) {
  Impl& m = *impl_;
  auto stage = [&](const std::string& s) {
    if (progress) progress(s);
  };
  if (req.name.empty()) return absl::InvalidArgumentError("name: required");
  if (req.collection.empty()) req.collection = req.kind == "code" ? "code" : "default";
  if (static_cast<int64_t>(req.bytes.size()) > m.options.max_document_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(req.name, ": ", req.bytes.size() / 1e6, " MB is over the ",
                     m.options.max_document_bytes / (1 << 20), " MB limit"));
  }
  MutexLock writer(&m.ingest_mu);
  const std::string hash = Sha256Hex(req.bytes);
  IngestResult result;
  const DocRec* old = FindIngested(m, req, hash, &result);
  if (result.unchanged) return result;
  stage("extracting");
  ASSIGN_OR_RETURN(ExtractedDoc doc, ExtractDocument(req.name, req.bytes));
  stage("chunking");
  ChunkOptions chunking = m.options.chunking;
  chunking.code_aware = req.kind == "code";
  std::vector<ChunkDraft> chunks = ChunkDocument(doc, chunking);
  if (chunks.empty())
    return absl::InvalidArgumentError(absl::StrCat(req.name, ": no text to index"));
  auto rec = std::make_unique<DocRec>();
  rec->info = InfoOf(req, doc, hash, chunks.size());
  const DocumentInfo& info = rec->info;
  std::vector<std::string> index_texts;
  index_texts.reserve(chunks.size());
  for (const auto& c : chunks) index_texts.push_back(Context(info, c.title_path) + "\n" + c.text);
  stage("embedding");
  ASSIGN_OR_RETURN(auto vecs, m.embedder.Embed(index_texts, false));
  if (vecs.size() != chunks.size())
    return absl::InternalError("embedder returned a wrong number of vectors");
  stage("indexing");
  std::vector<float> flat;
  flat.reserve(chunks.size() * m.embedder.dimension());
  for (auto& v : vecs) flat.insert(flat.end(), v.begin(), v.end());
  // The IVF lists of the new vectors (a search of the coarse centroids) are
  // found on another thread while the terms and records are made and
  // written, and outside the index lock: searches go on meanwhile, and
  // writers wait on ingest_mu, so the index is not rebuilt before the
  // commit uses them.
  std::future<VectorIndex::Assignment> assigning = std::async(std::launch::async, [&m, &flat] {
    ReaderMutexLock lock(&m.mu);
    return m.vectors->Assign(flat);
  });
  std::vector<std::vector<std::string>> terms(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) Tokenize(index_texts[i], &terms[i]);

  uint64_t first;
  uint64_t new_gen;
  {
    ReaderMutexLock lock(&m.mu);
    first = m.next_ordinal;
    new_gen = m.generation + 1;
  }
  // The chunk records go first, in slices: no document names them until the
  // last write, `batch`, stores the document's record, so a crash between
  // slices leaves only records nothing refers to (a rebuild skips them, and
  // the next document, given the same ordinals, overwrites them).
  std::deque<WriteBatch> slices;
  WriteBatch batch;
  if (old) {
    for (uint32_t o : old->ordinals) batch.Delete(Cf::kChunks, ChunkKey(o));
    batch.Delete(Cf::kDocuments, old->info.id);
    result.replaced_doc_id = old->info.id;
  }
  PutChunks(m, chunks, vecs, first, *rec, slices, batch);
  batch.Put(Cf::kDocuments, info.id, DocToJson(*rec).dump());
  stage("writing");
  batch.Put(Cf::kMeta, kNextKey, EncodeU64(first + chunks.size()));
  batch.Put(Cf::kMeta, kGenKey, EncodeU64(new_gen));
  batch.Put(Cf::kMeta, "kb/coll/" + req.collection,
            json({{"embedder", m.embedder.name()}, {"dimension", m.embedder.dimension()}}).dump());
  std::vector<uint32_t> ids(rec->ordinals);
  result.doc_id = info.id;
  result.chunks = info.chunks;
  result.pages = info.pages;
  // The commit: the store's writes, holding RocksDB's write queue that the
  // sessions' event appends wait on (on the committer, at normal priority),
  // then the indexes' update under the writer lock searches wait on (on the
  // indexer, at background priority).
  auto commit = [&]() -> absl::Status {
    // One write a slice: the sessions' event appends queued behind a slice
    // go before the next one.
    for (size_t i = 0; i < slices.size(); ++i) {
      RETURN_IF_ERROR(m.storage.Write(slices[i], /*sync=*/false));
      if (m.options.after_slice_for_test) {
        RETURN_IF_ERROR(m.options.after_slice_for_test(static_cast<int>(i)));
      }
    }
    // Durable before it is acknowledged (the log sync covers the slices),
    // without holding the write queue of the sessions' event appends while
    // the disk syncs.
    return m.storage.WriteThenSync(batch);
  };
  // Runs on the indexer while this thread waits, holding ingest_mu.
  auto add = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(m.ingest_mu) -> absl::Status {
    stage("adding");  // the ingesting thread waits for this meanwhile
    const VectorIndex::Assignment assignment = assigning.get();
    auto t = std::chrono::steady_clock::now();
    auto lap = [&t](double* ms) {
      const auto now = std::chrono::steady_clock::now();
      *ms = std::chrono::duration<double, std::milli>(now - t).count();
      t = now;
    };
    bool build_due;
    {
      WriterMutexLock lock(&m.mu);
      lap(&result.lock_ms);
      if (old) m.RemoveDocLocked(old->info.id);
      lap(&result.remove_ms);
      for (size_t i = 0; i < ids.size(); ++i) m.bm25->Add(ids[i], terms[i]);
      lap(&result.lexical_ms);
      m.vectors->Add(ids, flat, assignment);
      lap(&result.vectors_ms);
      m.AddDocLocked(std::move(rec));
      lap(&result.tables_ms);
      m.next_ordinal = first + chunks.size();
      m.generation = new_gen;
      ++m.changes;
      build_due = m.vectors->NeedsRebuild();
    }
    if (build_due) m.RebuildVectorsAside();
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(m.Commit(commit));
  RETURN_IF_ERROR(Impl::RunOn(m.indexer, add));
  stage("done");
  return result;
}

absl::StatusOr<std::vector<DocumentInfo>> KnowledgeBase::List(const std::string& collection) {
  ReaderMutexLock lock(&impl_->mu);
  std::vector<DocumentInfo> out;
  for (const auto& d : impl_->slots) {
    if (d && (collection.empty() || d->info.collection == collection)) out.push_back(d->info);
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.collection != b.collection ? a.collection < b.collection : a.name < b.name;
  });
  return out;
}

absl::StatusOr<int> KnowledgeBase::Delete(const std::string& doc, const std::string& collection) {
  Impl& m = *impl_;
  MutexLock writer(&m.ingest_mu);
  std::string id;
  std::vector<uint32_t> ordinals;
  uint64_t gen;
  {
    ReaderMutexLock lock(&m.mu);
    const DocRec* d = m.FindDoc(doc, collection);
    if (!d) {
      return absl::NotFoundError(
          absl::StrCat("document '", doc, "' not found",
                       collection.empty() ? "" : " in collection " + collection));
    }
    id = d->info.id;
    ordinals = d->ordinals;
    gen = m.generation + 1;
  }
  WriteBatch batch;
  for (uint32_t o : ordinals) batch.Delete(Cf::kChunks, ChunkKey(o));
  batch.Delete(Cf::kDocuments, id);
  batch.Put(Cf::kMeta, kGenKey, EncodeU64(gen));
  RETURN_IF_ERROR(m.storage.WriteThenSync(batch));
  WriterMutexLock lock(&m.mu);
  m.RemoveDocLocked(id);
  m.generation = gen;
  ++m.changes;
  return static_cast<int>(ordinals.size());
}

absl::StatusOr<std::vector<KbSearchHit>> KnowledgeBase::Search(const KbSearchRequest& r,
                                                               KbSearchInfo* info) {
  const auto t0 = std::chrono::steady_clock::now();
  KbSearchInfo run;
  ASSIGN_OR_RETURN(auto hits, SearchImpl(r, &run));
  run.took_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (r.log && !r.all_candidates) {
    LoggedSearch ls;
    ls.query = r.query;
    ls.rewrites = run.rewrites;
    ls.method = absl::StrCat(
        r.mode == SearchMode::kLexical  ? "lexical"
        : r.mode == SearchMode::kVector ? "vector"
                                        : "hybrid",
        r.rerank
            ? absl::StrCat("+rerank(", (r.reranker ? *r.reranker : impl_->reranker).name(), ")")
            : "",
        r.passage_tokens == 0
            ? "+chunks"
            : absl::StrCat("+passages(",
                           r.passage_tokens < 0 ? impl_->options.passage_tokens : r.passage_tokens,
                           ")"));
    ls.top_k = r.max_results;
    ls.took_ms = run.took_ms;
    ls.origin = r.origin;
    for (const auto& h : hits)
      ls.results.push_back({h.rank, h.score, h.doc, h.title_path, h.chunk_id, h.chunk_ids});
    auto recorded = impl_->log->Record(std::move(ls));
    if (recorded.ok()) {
      run.search_id = *recorded;
    } else {
      spdlog::warn("retrieval log: {}", recorded.status().ToString());
    }
  }
  for (auto& h : hits) h.search_id = run.search_id;
  if (info != nullptr) *info = std::move(run);
  return hits;
}

RetrievalLog& KnowledgeBase::retrieval_log() { return *impl_->log; }

namespace {

using ScoredOrdinals = std::vector<std::pair<uint32_t, float>>;

// A request's bounds, each named in the error.
absl::Status CheckSearchRequest(const KbSearchRequest& r) {
  if (r.query.empty() || r.query.find_first_not_of(" \t\r\n") == std::string::npos) {
    return absl::InvalidArgumentError("query: empty");
  }
  if (r.query.size() > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("query: ", r.query.size(), " characters; at most 4096"));
  }
  if (r.max_results < 1 || r.max_results > 100) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_results: ", r.max_results, "; expected 1..100"));
  }
  if (!(r.threshold >= 0 && r.threshold <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat("threshold: ", r.threshold, "; expected 0..1"));
  }
  if (r.passage_tokens < -1 || r.passage_tokens > kMaxPassageTokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "passage_tokens: ", r.passage_tokens, "; expected 1..", kMaxPassageTokens, " (0: chunks)"));
  }
  return absl::OkStatus();
}

// Best first; ties to the lower ordinal.
bool BetterScored(const std::pair<uint32_t, float>& a, const std::pair<uint32_t, float>& b) {
  return a.second > b.second || (a.second == b.second && a.first < b.first);
}

// A passage's text and position into a hit.
void FillFromPassage(KbSearchHit& h, const Passage& p) {
  h.text = p.text;
  h.tokens = p.tokens;
  h.highlights = p.highlights;
  h.page = p.page;
  h.end_page = p.end_page;
  h.start_line = p.start_line;
  h.end_line = p.end_line;
  h.coverage = p.coverage;
  h.best_sentence = p.best_unit;
  h.begin_chunk = p.begin.chunk;
  h.begin_offset = p.begin.offset;
  h.end_chunk = p.end.chunk;
  h.end_offset = p.end.offset;
}

// One search, stage by stage, in the order Run calls them:
//   1. the query: its vector, terms and weighted terms; with a model, its
//      rewrites and a hypothetical answer (outside the index lock);
//   2. the legs: lexical and vector over the chunks (at once), and in
//      hybrid mode the two document-level views (named by title, matched
//      as a whole text);
//   3. fusion: weighted reciprocal rank of every leg into one pool;
//   4. the pool's records read in one batch, reranked (stage 1);
//   5. chunks as results, or passages widened around them, rescored,
//      fused with window evidence, corrected by feedback and merged where
//      they overlap (stage 2).
// Stages 2 to 5 run under the shared index lock Run takes.
class SearchRun {
 public:
  // Fills `info`'s rewrites and stages.
  SearchRun(KnowledgeBase::Impl& m, const KbSearchRequest& r, KbSearchInfo* info)
      : m_(m),
        r_(r),
        info_(info),
        ov_(r.overrides ? *r.overrides : kNoOverrides),
        passage_tokens_(r.passage_tokens < 0 ? m.options.passage_tokens : r.passage_tokens),
        hybrid_(r.mode == SearchMode::kHybrid),
        // Called by the scorers and the corrections, under the lock Run takes.
        idf_([this](const std::string& t) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) { return Idf(t); }) {}

  absl::StatusOr<std::vector<KbSearchHit>> Run() {
    RETURN_IF_ERROR(PrepareQuery());
    Lap("query");
    AskModel();
    Lap("model");
    ReaderMutexLock lock(&m_.mu);
    Lap("lock");
    if (r_.mode == SearchMode::kVector && m_.vectors->off()) {
      // The reason (the index's lists, its size) is the operator's to read
      // (logs, kb stats), not every searcher's.
      return absl::FailedPreconditionError(
          "vector search is off in this knowledge base (its approximate index could not reach "
          "the recall required); search in hybrid or lexical mode");
    }
    SetFilters();
    RunLegs();
    Lap("legs");
    if (hybrid_) {
      DocumentViews();
      Lap("document views");
    }
    Fuse();
    Lap("fusion");
    RETURN_IF_ERROR(LoadPool());
    MarkNamed();
    Lap("fetch");
    RETURN_IF_ERROR(RerankChunks());
    Lap("rerank");
    if (passage_tokens_ <= 0) {
      std::vector<KbSearchHit> hits = ChunkResults();
      Lap("results");
      return hits;
    }
    RETURN_IF_ERROR(WidenPassages());
    Lap("passages");
    if (r_.all_candidates) return AllCandidates();
    RETURN_IF_ERROR(RescorePassages());
    Lap("rescore");
    RETURN_IF_ERROR(WindowEvidence());
    Lap("window evidence");
    CorrectPassages();
    std::vector<KbSearchHit> hits = MergePassages();
    Lap("merge");
    return hits;
  }

 private:
  struct Cand {
    uint32_t o;
    double fused = 0, lexical = 0, vector = 0;
  };
  struct Loaded {
    Cand c;
    ChunkRec rec;
    const DocRec* doc;
    double score;
    double named = 0;
  };
  struct Widened {
    const Loaded* l;
    uint32_t slot;
    uint32_t index;
    Passage p;
    double score;
  };
  static inline const FusionOverrides kNoOverrides{};

  // Records the time since the previous lap as stage `name`'s.
  void Lap(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    info_->stages_ms.emplace_back(name,
                                  std::chrono::duration<double, std::milli>(now - lap_).count());
    lap_ = now;
  }

  // An override if set (>= 0), else the configured value.
  static double Or(double override_value, double configured) {
    return override_value >= 0 ? override_value : configured;
  }

  // ---- 1. the query ----
  absl::Status PrepareQuery() {
    if (r_.mode != SearchMode::kLexical) {
      ASSIGN_OR_RETURN(auto v, m_.embedder.Embed({r_.query}, true));
      qvec_ = std::move(v[0]);
    }
    Tokenize(r_.query, &qterms_);
    ExpansionWeights ew;
    ew.synonym = static_cast<float>(m_.options.synonym_weight);
    ew.family = static_cast<float>(m_.options.family_weight);
    wq_ = WeightedQuery(r_.query, qterms_, ew);
    return absl::OkStatus();
  }

  // With a model: short or vague queries, and questions asked in other
  // words than a document's (no identifier beyond part names), are rewritten
  // into variants; the latter also get a hypothetical answer (HyDE) whose
  // words and vector are searched too. Both calls run at once, outside locks.
  void AskModel() {
    const bool may_ask = r_.allow_rewrite && hybrid_ && !r_.all_candidates;
    if (!may_ask || !(m_.options.rewrite || m_.options.hyde)) return;
    const std::vector<std::string> ids = FindIdentifiers(r_.query);
    bool paraphrase_like = qterms_.size() >= 3;
    if (paraphrase_like && !ids.empty()) {
      // An identifier no document is named by (a register, a property) makes
      // it a lookup, not a paraphrase.
      ReaderMutexLock lock(&m_.mu);
      for (const auto& id : ids) {
        std::vector<std::string> t;
        Tokenize(id, &t, TokenizerOptions{false, false, false});
        if (t.size() != 1 || m_.doc_titles.DocFreq(t[0]) == 0) paraphrase_like = false;
      }
    }
    const bool vague = qterms_.size() <= 3 && ids.empty();
    std::future<std::vector<std::string>> variants;
    std::future<std::string> answer;
    if (m_.options.rewrite && (vague || paraphrase_like)) {
      variants = std::async(std::launch::async, m_.options.rewrite, r_.query);
    }
    if (m_.options.hyde && paraphrase_like)
      answer = std::async(std::launch::async, m_.options.hyde, r_.query);
    if (variants.valid()) {
      std::vector<std::string> v = variants.get();
      if (v.size() > 3) v.resize(3);
      for (const auto& x : v) AddVariant(x, m_.options.variant_weight);
    }
    if (answer.valid()) AddAnswer(answer.get());
  }

  void AddVariant(const std::string& text, double weight) {
    std::vector<std::string> t;
    Tokenize(text, &t);
    if (t.empty()) return;
    info_->rewrites.push_back(text);
    variant_terms_.push_back(std::move(t));
    auto e = m_.embedder.Embed({text}, true);
    variant_vecs_.push_back(e.ok() ? std::move((*e)[0]) : std::vector<float>());
    variant_weights_.push_back(weight);
  }

  // The hypothetical answer's words join the query at a lower weight (so
  // chunk and document scores, and the passages, count them); its vector is
  // one more leg.
  void AddAnswer(std::string answer) {
    hyde_answer_ = std::move(answer);
    if (hyde_answer_.empty()) return;
    info_->rewrites.push_back("answer: " + hyde_answer_);
    std::vector<std::string> at;
    Tokenize(hyde_answer_, &at);
    std::set<std::string> have;
    for (const auto& [t, w] : wq_) have.insert(t);
    for (const auto& t : at) {
      if (have.insert(t).second) wq_.emplace_back(t, static_cast<float>(m_.options.hyde_weight));
    }
    auto e = m_.embedder.Embed({hyde_answer_}, true);
    if (e.ok()) {
      variant_terms_.emplace_back();
      variant_vecs_.push_back(std::move((*e)[0]));
      variant_weights_.push_back(m_.options.hyde_weight);
    }
  }

  // ---- 2. the legs ----
  bool Accepts(uint32_t o) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    if (o >= m_.chunk_slot.size() || m_.chunk_slot[o] == kNoDoc) return false;
    const DocRec& d = *m_.slots[m_.chunk_slot[o]];
    if (!r_.collection.empty() && d.info.collection != r_.collection) return false;
    if (r_.collection_visible && !r_.collection_visible(d.info.collection)) return false;
    if (!doc_filter_.empty() && !doc_filter_.count(d.info.name) && !doc_filter_.count(d.info.id))
      return false;
    if (!type_filter_.empty() && !type_filter_.count(m_.chunk_type[o])) return false;
    for (const auto& [k, v] : r_.tags) {
      auto it = d.info.tags.find(k);
      if (it == d.info.tags.end() || it->second != v) return false;
    }
    return true;
  }

  void SetFilters() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    doc_filter_.insert(r_.docs.begin(), r_.docs.end());
    for (const auto& t : r_.content_types) type_filter_.insert(TypeCode(t));
    filtered_ = !r_.collection.empty() || r_.collection_visible || !doc_filter_.empty() ||
                !type_filter_.empty() || !r_.tags.empty();
    if (filtered_) {
      acc_ = [this](uint32_t o) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) { return Accepts(o); };
    } else {
      acc_ = [this](uint32_t o) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
        return o < m_.chunk_slot.size() && m_.chunk_slot[o] != kNoDoc;
      };
    }
    n_ = static_cast<size_t>(std::max(m_.options.candidates, r_.max_results));
    // Document-level BM25 is scored in the lexical pass (hybrid only).
    if (!hybrid_) return;
    const auto lens = m_.EnsureSlotLens();
    groups_.group_of = &m_.chunk_slot;
    if (filtered_) {
      filtered_groups_ = m_.chunk_slot;
      for (uint32_t o = 0; o < filtered_groups_.size(); ++o) {
        if (filtered_groups_[o] != kNoDoc && !Accepts(o)) filtered_groups_[o] = kNoDoc;
      }
      groups_.group_of = &filtered_groups_;
    }
    groups_.group_len = lens.len;
    groups_.present = lens.present;
    groups_.avg_len = lens.avg;
    groups_.b = static_cast<float>(m_.options.doc_text_b);
    // A document's chunks are in one group, unless a chunk-level filter
    // (content types) splits it.
    groups_.by_member = type_filter_.empty();
  }

  // The two legs run at once (each is a scan of its own index; at a million
  // chunks either takes tens of ms). Both only read under the shared lock
  // this thread holds. The lexical leg is pruned when the saved index
  // allows it (the same top n and document scores); then DocumentViews
  // reads the chunk scores of the documents it chooses for those documents
  // only, instead of every matching chunk's.
  void RunLegs() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::future<ScoredOrdinals> vec_leg;
    if (r_.mode == SearchMode::kVector) {
      vec_ = m_.vectors->Search(qvec_.data(), n_, acc_);
      return;
    }
    if (r_.mode != SearchMode::kLexical && !m_.vectors->off()) {
      // On another thread, under the shared lock this one holds until it
      // has the result.
      vec_leg = std::async(std::launch::async, [this]() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
        return m_.vectors->Search(qvec_.data(), n_, acc_);
      });
    }
    auto pruned = m_.bm25->SearchPruned(wq_, n_, acc_, hybrid_ ? &groups_ : nullptr);
    if (pruned) {
      lex_ = *std::move(pruned);
      lex_pruned_ = true;
    } else {
      lex_ = m_.bm25->Search(wq_, n_, acc_, hybrid_ ? &lex_all_ : nullptr,
                             hybrid_ ? &groups_ : nullptr);
    }
    if (vec_leg.valid()) vec_ = vec_leg.get();
  }

  // Two document-level views: documents whose name or title the query names
  // (part numbers, driver names), and documents whose whole text matches it
  // best (a small binding or a header read as one unit). Their best chunks
  // join the pool; their scores are reranking features.
  void DocumentViews() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    auto docs =
        m_.doc_titles.Search(wq_, static_cast<size_t>(std::max(m_.options.doc_candidates, 20)));
    const float best = docs.empty() ? 0.f : docs[0].second;
    for (const auto& [slot, score] : docs) doc_match_[slot] = best > 0 ? score / best : 0;
    std::unordered_map<uint32_t, std::pair<float, float>>
        chosen;  // slot -> (title score, text score)
    for (size_t i = 0; i < docs.size() && i < static_cast<size_t>(m_.options.doc_candidates); ++i) {
      if (docs[i].second < 0.5f * best) break;
      chosen[docs[i].first].first = docs[i].second / best;
    }
    ChooseByText(chosen);
    auto in_doc = ChunksOfChosen(chosen);
    const float best_lex_all = lex_.empty() ? 1.f : std::max(lex_[0].second, 1e-9f);
    const size_t per_doc = static_cast<size_t>(std::max(1, m_.options.chunks_per_doc));
    for (auto& [slot, hits] : in_doc) {
      if (hits.size() > per_doc) {
        std::partial_sort(hits.begin(), hits.begin() + per_doc, hits.end(), BetterScored);
        hits.resize(per_doc);
      } else {
        std::sort(hits.begin(), hits.end(), BetterScored);
      }
      const auto [title_score, text_score] = chosen[slot];
      for (const auto& h : hits) {
        const float chunk = h.second / best_lex_all;
        if (title_score > 0) by_doc_.emplace_back(h.first, title_score * (1.0f + chunk));
        if (text_score > 0) by_text_.emplace_back(h.first, text_score * (1.0f + chunk));
      }
    }
    std::sort(by_doc_.begin(), by_doc_.end(), BetterScored);
    std::sort(by_text_.begin(), by_text_.end(), BetterScored);
  }

  // The documents whose whole text scored best (in the lexical pass), ties
  // to the document ingested first (slots are renumbered on load).
  void ChooseByText(std::unordered_map<uint32_t, std::pair<float, float>>& chosen)
      ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    auto& text_docs = groups_.scores;
    auto first_ordinal = [&](uint32_t slot) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
      const auto& d = m_.slots[slot];
      return d && !d->ordinals.empty() ? d->ordinals.front() : ~0u;
    };
    std::sort(text_docs.begin(), text_docs.end(),
              [&](const auto& a, const auto& b) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
                return a.second > b.second ||
                       (a.second == b.second && first_ordinal(a.first) < first_ordinal(b.first));
              });
    const float best_text = text_docs.empty() ? 0.f : text_docs[0].second;
    for (size_t i = 0; i < text_docs.size(); ++i) {
      const double norm = best_text > 0 ? text_docs[i].second / best_text : 0;
      doc_text_[text_docs[i].first] = norm;
      if (i < static_cast<size_t>(m_.options.doc_text_candidates))
        chosen[text_docs[i].first].second = static_cast<float>(norm);
    }
  }

  // The lexical scores of the chosen documents' chunks.
  std::unordered_map<uint32_t, ScoredOrdinals> ChunksOfChosen(
      const std::unordered_map<uint32_t, std::pair<float, float>>& chosen)
      ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::unordered_map<uint32_t, ScoredOrdinals> in_doc;
    if (lex_pruned_) {
      for (const auto& [slot, unused] : chosen) {
        const DocRec* d = slot < m_.slots.size() ? m_.slots[slot].get() : nullptr;
        if (d == nullptr) continue;
        auto hits = m_.bm25->ScoreDocs(wq_, d->ordinals, acc_);
        if (!hits.empty()) in_doc[slot] = std::move(hits);
      }
    } else {
      for (const auto& h : lex_all_) {
        auto it = chosen.find(m_.chunk_slot[h.first]);
        if (it != chosen.end()) in_doc[it->first].push_back(h);
      }
    }
    return in_doc;
  }

  // ---- 3. fusion ----
  void AddLeg(const ScoredOrdinals& leg, double weight, bool lexical, bool at_most) {
    for (size_t i = 0; i < leg.size(); ++i) {
      auto& c = cands_[leg[i].first];
      c.o = leg[i].first;
      c.fused += weight / (rrf_k_ + i + 1);
      double& feature = lexical ? c.lexical : c.vector;
      feature = at_most ? std::max<double>(feature, leg[i].second) : leg[i].second;
    }
  }

  // A document view's chunks are in the rerank pool even at weight 0.
  void AddDocumentView(const ScoredOrdinals& view, double weight) {
    for (size_t i = 0; i < view.size(); ++i) {
      auto& c = cands_[view[i].first];
      c.o = view[i].first;
      c.fused += weight / (rrf_k_ + i + 1) + 1e-9;
    }
  }

  void Fuse() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    rrf_k_ = Or(ov_.rrf_k, m_.options.rrf_k);
    const double wl =
        r_.mode == SearchMode::kVector ? 0 : Or(ov_.lexical_weight, m_.options.lexical_weight);
    const double wv =
        r_.mode == SearchMode::kLexical ? 0 : Or(ov_.vector_weight, m_.options.vector_weight);
    AddLeg(lex_, wl, true, false);
    AddLeg(vec_, wv, false, false);
    for (size_t v = 0; v < variant_terms_.size(); ++v) {
      ScoredOrdinals vl;
      if (!variant_terms_[v].empty()) vl = m_.bm25->Search(variant_terms_[v], n_, acc_);
      AddLeg(vl, variant_weights_[v] * wl, true, true);
      if (!variant_vecs_[v].empty()) {
        AddLeg(m_.vectors->Search(variant_vecs_[v].data(), n_, acc_), variant_weights_[v] * wv,
               false, true);
      }
    }
    const double wd = hybrid_ ? Or(ov_.doc_weight, m_.options.doc_weight) : 0;
    const double wt = hybrid_ ? Or(ov_.doc_text_weight, m_.options.doc_text_weight) : 0;
    AddDocumentView(by_doc_, wd);
    AddDocumentView(by_text_, wt);
    order_.reserve(cands_.size());
    for (auto& [o, c] : cands_) order_.push_back(c);
    std::sort(order_.begin(), order_.end(), [](const Cand& a, const Cand& b) {
      return a.fused > b.fused || (a.fused == b.fused && a.o < b.o);
    });
    max_fused_ = std::max(1e-12, (wl + wv + wd + wt) / (rrf_k_ + 1));
    best_lex_ = lex_.empty() ? 1.0 : std::max<double>(lex_[0].second, 1e-9);
    // Without rerank, a few more than asked: passages that merge leave room.
    const size_t keep = r_.rerank || r_.all_candidates
                            ? std::max<size_t>(m_.options.rerank_top, r_.max_results)
                        : passage_tokens_ > 0 ? static_cast<size_t>(r_.max_results) * 2
                                              : static_cast<size_t>(r_.max_results);
    if (order_.size() > keep) order_.resize(keep);
    top_fused_all_ = order_.empty() ? 1.0 : std::max(order_[0].fused, 1e-12);
  }

  // ---- 4. the pool, reranked ----
  // The pool's records in one batched read (with rerank, 100 of them).
  absl::Status LoadPool() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::vector<std::string> keys;
    keys.reserve(order_.size());
    for (const auto& c : order_) keys.push_back(ChunkKey(c.o));
    ASSIGN_OR_RETURN(auto raws, m_.storage.MultiGet(Cf::kChunks, keys));
    loaded_.reserve(order_.size());
    for (size_t i = 0; i < order_.size(); ++i) {
      if (!raws[i]) continue;
      ASSIGN_OR_RETURN(auto rec, DecodeChunk(*raws[i], false));
      const Cand& c = order_[i];
      loaded_.push_back(
          {c, std::move(rec), m_.slots[m_.chunk_slot[c.o]].get(), c.fused / max_fused_});
      prefetched_.emplace(c.o, *std::move(raws[i]));
    }
    return absl::OkStatus();
  }

  // Identifiers in the query that name a few documents by name or title
  // (a part number, a driver): the share of them a candidate's document
  // or text carries is a reranking feature.
  void MarkNamed() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::vector<std::string> naming;
    for (const auto& id : FindIdentifiers(r_.query)) {
      std::vector<std::string> t;
      Tokenize(id, &t, TokenizerOptions{false, false, false});
      if (t.size() != 1) continue;
      const size_t df = m_.doc_titles.DocFreq(t[0]);
      if (df >= 1 && df <= std::max<size_t>(3, m_.slot_by_id.size() / 200)) naming.push_back(t[0]);
    }
    if (naming.empty()) return;
    for (auto& l : loaded_) {
      const std::string hay = absl::AsciiStrToLower(
          absl::StrCat(l.doc->info.name, "\n", l.doc->info.title, "\n", l.rec.text));
      int hit = 0;
      for (const auto& n : naming) hit += ContainsWord(hay, n) ? 1 : 0;
      l.named = static_cast<double>(hit) / naming.size();
    }
  }

  double DocMatch(uint32_t o) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    auto it = doc_match_.find(m_.chunk_slot[o]);
    return it == doc_match_.end() ? 0 : it->second;
  }
  double DocText(uint32_t o) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    auto it = doc_text_.find(m_.chunk_slot[o]);
    return it == doc_text_.end() ? 0 : it->second;
  }

  RerankCandidate CandidateOf(const Loaded& l) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    RerankCandidate c;
    c.text = l.rec.text;
    c.context = Context(l.doc->info, l.rec.meta.value("title_path", std::vector<std::string>{}));
    c.vector_sim = l.c.vector;
    c.lexical_norm = l.c.lexical / best_lex_;
    c.fused_norm = l.c.fused / top_fused_;
    c.doc_match = DocMatch(l.c.o);
    c.doc_text = DocText(l.c.o);
    c.named = l.named;
    return c;
  }

  // Stage 1: the chunks, reranked. With a hypothetical answer, the built-in
  // reranker reads it as part of the question: its words are the documents'.
  absl::Status RerankChunks() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    top_fused_ = loaded_.empty() ? 1.0 : std::max(loaded_[0].c.fused, 1e-12);
    if (!r_.rerank || loaded_.empty()) return absl::OkStatus();
    Reranker& first_stage = r_.reranker != nullptr ? *r_.reranker
                            : m_.options.first_stage_reranker != nullptr
                                ? *m_.options.first_stage_reranker
                                : m_.reranker;
    std::vector<RerankCandidate> rc;
    rc.reserve(loaded_.size());
    for (const auto& l : loaded_) rc.push_back(CandidateOf(l));
    const std::string rerank_query =
        hyde_answer_.empty() ? r_.query : r_.query + "\n" + hyde_answer_;
    ASSIGN_OR_RETURN(auto scores, first_stage.Score(rerank_query, rc));
    for (size_t i = 0; i < loaded_.size(); ++i) loaded_[i].score = scores[i];
    std::stable_sort(loaded_.begin(), loaded_.end(),
                     [](const Loaded& a, const Loaded& b) { return a.score > b.score; });
    return absl::OkStatus();
  }

  KbSearchHit ChunkHit(const Loaded& l) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    KbSearchHit h;
    h.score = l.score;
    h.first_stage_score = l.score;
    h.doc = l.doc->info.name;
    h.doc_id = l.doc->info.id;
    const auto title_path = l.rec.meta.value("title_path", std::vector<std::string>{});
    h.title_path = absl::StrJoin(title_path, " > ");
    h.page = h.end_page = l.rec.meta.value("page", 0);
    h.start_line = l.rec.meta.value("start_line", 0);
    h.end_line = l.rec.meta.value("end_line", 0);
    h.content_type = l.rec.meta.value("content_type", "text");
    h.text = l.rec.text;
    h.tokens = CountTokens(h.text);
    h.chunk_id = absl::StrCat(l.doc->info.id, "#", l.rec.meta.value("index", 0));
    h.chunk_ids = {h.chunk_id};
    h.context = Context(l.doc->info, title_path);
    h.fused_norm = l.c.fused / top_fused_all_;
    h.lexical_norm = l.c.lexical / best_lex_;
    h.vector_sim = l.c.vector;
    h.doc_match = DocMatch(l.c.o);
    h.doc_text = DocText(l.c.o);
    h.named = l.named;
    return h;
  }

  // ---- 5. results ----
  double Idf(const std::string& t) const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const double n_chunks = static_cast<double>(std::max<size_t>(1, m_.bm25->size()));
    const double df = static_cast<double>(m_.bm25->DocFreq(t));
    return std::log(1.0 + (n_chunks - df + 0.5) / (df + 0.5));
  }
  // Corrections from the retrieval log: results marked bad (good) for
  // queries like this one go down (up).
  bool Corrections() const { return m_.log->has_feedback() && !r_.all_candidates; }

  std::vector<KbSearchHit> ChunkResults() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    if (Corrections()) {
      for (auto& l : loaded_) {
        l.score =
            m_.log->Adjust(l.score, qterms_,
                           {absl::StrCat(l.doc->info.id, "#", l.rec.meta.value("index", 0))}, idf_);
      }
      std::stable_sort(loaded_.begin(), loaded_.end(),
                       [](const Loaded& a, const Loaded& b) { return a.score > b.score; });
    }
    std::vector<KbSearchHit> out;
    for (const auto& l : loaded_) {
      if (static_cast<int>(out.size()) >= r_.max_results) break;
      if (l.score < r_.threshold) continue;
      out.push_back(ChunkHit(l));
      out.back().rank = static_cast<int>(out.size());
    }
    return out;
  }

  // A chunk record: prefetched, else read (a read error is kept in
  // load_error_ for the stage to return).
  std::optional<ChunkRec> Read(const DocRec& d, uint32_t index) {
    auto hit = prefetched_.find(d.ordinals[index]);
    if (hit != prefetched_.end()) {
      auto rec = DecodeChunk(hit->second, false);
      if (!rec.ok()) return std::nullopt;
      return *std::move(rec);
    }
    auto raw = m_.storage.Get(Cf::kChunks, ChunkKey(d.ordinals[index]));
    if (!raw.ok()) {
      load_error_ = raw.status();
      return std::nullopt;
    }
    if (!*raw) return std::nullopt;
    auto rec = DecodeChunk(**raw, false);
    if (!rec.ok()) return std::nullopt;
    return *std::move(rec);
  }

  // Chunk `index` of the document in `slot` as passages read it, with its
  // overlap with the chunk before; cached for the search.
  const PassageChunk* ChunkOf(uint32_t slot, uint32_t index) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const DocRec* d = slot < m_.slots.size() ? m_.slots[slot].get() : nullptr;
    if (d == nullptr || index >= d->ordinals.size()) return nullptr;
    const uint64_t key = (uint64_t{slot} << 32) | index;
    auto it = chunk_cache_.find(key);
    if (it != chunk_cache_.end()) return it->second.get();
    auto rec = Read(*d, index);
    if (!rec) return nullptr;
    auto c = std::make_unique<PassageChunk>();
    c->index = index;
    c->title_path = rec->meta.value("title_path", std::vector<std::string>{});
    c->page = rec->meta.value("page", 0);
    c->start_line = rec->meta.value("start_line", 0);
    c->end_line = rec->meta.value("end_line", 0);
    c->section = rec->meta.value("section", -1);
    c->text = std::move(rec->text);
    if (index > 0) {
      auto prev = chunk_cache_.find(key - 1);
      if (prev != chunk_cache_.end()) {
        c->overlap = OverlapLength(prev->second->text, c->text);
      } else {
        auto t = text_cache_.find(key - 1);
        if (t == text_cache_.end()) {
          auto p = Read(*d, index - 1);
          t = text_cache_.emplace(key - 1, p ? std::move(p->text) : std::string()).first;
        }
        c->overlap = OverlapLength(t->second, c->text);
      }
    }
    return chunk_cache_.emplace(key, std::move(c)).first->second.get();
  }

  PassageSource SourceOf(uint32_t slot) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    PassageSource src;
    src.chunk = [this, slot](uint32_t index)
                    ABSL_SHARED_LOCKS_REQUIRED(m_.mu) { return ChunkOf(slot, index); };
    src.same_section = [](const PassageChunk& a, const PassageChunk& b) {
      return SameSection(a, b);
    };
    return src;
  }

  // Stage 2: the best chunks widened into passages within their sections.
  absl::Status WidenPassages() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    scorer_.emplace(wq_, idf_);
    const int pool_size = ov_.passage_pool >= 0 ? ov_.passage_pool : m_.options.passage_pool;
    const size_t pool =
        r_.all_candidates ? loaded_.size()
                          : std::min(loaded_.size(),
                                     static_cast<size_t>(std::max(pool_size, r_.max_results + 10)));
    budget_ = std::min(passage_tokens_, kMaxPassageTokens);
    const bool forward =
        ov_.passage_forward >= 0 ? ov_.passage_forward > 0 : m_.options.passage_forward;
    growth_ = forward ? PassageGrowth::kForwardFromLeadIn : PassageGrowth::kTowardsQuery;
    {
      // The records passages read first in one batched read: each pooled
      // chunk's neighbours (the one before also for its overlap with the one
      // before it); others are read one by one.
      std::vector<uint32_t> want;
      for (size_t i = 0; i < pool; ++i) {
        const DocRec* d = loaded_[i].doc;
        const uint32_t index = loaded_[i].rec.meta.value("index", 0u);
        if (d == nullptr || index >= d->ordinals.size()) continue;
        for (uint32_t j = index > 1 ? index - 2 : 0; j <= index + 1 && j < d->ordinals.size();
             ++j) {
          want.push_back(d->ordinals[j]);
        }
      }
      RETURN_IF_ERROR(ReadChunksInto(m_.storage, std::move(want), prefetched_));
    }
    widened_.reserve(pool);
    for (size_t i = 0; i < pool; ++i) {
      const Loaded& l = loaded_[i];
      const uint32_t slot = m_.chunk_slot[l.c.o];
      const uint32_t index = l.rec.meta.value("index", 0u);
      Passage p = BuildPassage(SourceOf(slot), index, budget_, *scorer_, growth_);
      if (p.text.empty()) continue;
      widened_.push_back({&l, slot, index, std::move(p), l.score});
    }
    return load_error_;
  }

  // Every widened candidate, unranked by passages (for tuning).
  std::vector<KbSearchHit> AllCandidates() const ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::vector<KbSearchHit> out;
    for (const auto& w : widened_) {
      KbSearchHit h = ChunkHit(*w.l);
      h.chunk_text = w.l->rec.text;
      FillFromPassage(h, w.p);
      h.rank = static_cast<int>(out.size()) + 1;
      out.push_back(std::move(h));
    }
    return out;
  }

  // The passages ranked again: by the model's reranker as a second stage,
  // or with the passage's coverage of the query.
  absl::Status RescorePassages() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const bool model_stage2 =
        r_.rerank && r_.reranker == nullptr && m_.options.first_stage_reranker != nullptr;
    if (model_stage2 && !widened_.empty()) {
      std::vector<RerankCandidate> rc;
      for (const auto& w : widened_) {
        RerankCandidate c = CandidateOf(*w.l);
        c.text = w.p.text;
        rc.push_back(std::move(c));
      }
      ASSIGN_OR_RETURN(auto scores, m_.reranker.Score(r_.query, rc));
      for (size_t i = 0; i < widened_.size(); ++i) widened_[i].score = scores[i];
      return absl::OkStatus();
    }
    if (!r_.rerank) return absl::OkStatus();
    const double wc = Or(ov_.passage_coverage_weight, m_.options.passage_coverage_weight);
    const double ws = Or(ov_.passage_sentence_weight, m_.options.passage_sentence_weight);
    const double within_doc =
        std::clamp(Or(ov_.passage_within_doc, m_.options.passage_within_doc), 0.0, 1.0);
    for (auto& w : widened_)
      w.score = (w.score + wc * w.p.coverage + ws * w.p.best_unit) / (1 + wc + ws);
    if (within_doc > 0) {
      std::unordered_map<uint32_t, double> best;  // slot -> its best passage's score
      for (const auto& w : widened_) best[w.slot] = std::max(best[w.slot], w.score);
      for (auto& w : widened_) {
        w.score = WithinDocScore(w.score, best[w.slot], w.p.coverage, w.p.best_unit, within_doc);
      }
    }
    return absl::OkStatus();
  }

  // Window evidence (questions without an identifier unless configured):
  // the top documents cut into windows scored by BM25; the passages
  // overlapping the best windows are fused into the ranking by weighted
  // reciprocal rank. Before the corrections, so a result marked bad stays
  // demoted.
  absl::Status WindowEvidence() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const int window_docs = ov_.window_docs >= 0 ? ov_.window_docs
                            : m_.options.windows ? m_.options.window_docs
                                                 : 0;
    const bool window_ids =
        ov_.window_identifiers >= 0 ? ov_.window_identifiers > 0 : m_.options.window_identifiers;
    if (!hybrid_ || window_docs <= 0 || widened_.empty() ||
        !(window_ids || FindIdentifiers(r_.query).empty())) {
      return absl::OkStatus();
    }
    std::stable_sort(widened_.begin(), widened_.end(),
                     [](const Widened& a, const Widened& b) { return a.score > b.score; });
    std::vector<uint32_t> top_slots;
    for (const auto& w : widened_) {
      if (static_cast<int>(top_slots.size()) >= window_docs) break;
      if (std::find(top_slots.begin(), top_slots.end(), w.slot) == top_slots.end())
        top_slots.push_back(w.slot);
    }
    ASSIGN_OR_RETURN(auto windows, BestWindows(top_slots));
    const size_t ranked = widened_.size();
    std::vector<int> window_rank(ranked, -1);
    for (size_t j = 0; j < windows.size(); ++j) {
      const auto& [slot, win] = windows[j];
      bool overlapped = false;
      for (size_t i = 0; i < widened_.size(); ++i) {
        const Widened& w = widened_[i];
        if (w.slot != slot || !OverlapsWindow(win, w.p.begin, w.p.end)) continue;
        overlapped = true;
        if (i < window_rank.size() && window_rank[i] < 0) window_rank[i] = static_cast<int>(j);
      }
      if (!overlapped && AddWindowPassage(slot, win)) window_rank.push_back(static_cast<int>(j));
    }
    if (!load_error_.ok()) return load_error_;
    const double ww = Or(ov_.window_weight, m_.options.window_weight);
    const double wk = Or(ov_.window_k, m_.options.window_k);
    for (size_t i = 0; i < widened_.size(); ++i) {
      widened_[i].score = WindowFusedScore(i, window_rank[i], ww, wk);
    }
    return absl::OkStatus();
  }

  // The best windows of the documents in `top_slots`: all of a document's
  // chunks, or in a long one (a manual) those around its candidates.
  absl::StatusOr<std::vector<std::pair<uint32_t, TextWindow>>> BestWindows(
      const std::vector<uint32_t>& top_slots) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    constexpr size_t kWholeDocChunks = 256;
    std::vector<std::pair<uint32_t, std::vector<uint32_t>>> doc_chunks;  // slot -> indexes
    std::vector<uint32_t> want;
    for (uint32_t slot : top_slots) {
      const DocRec& d = *m_.slots[slot];
      std::vector<uint32_t> idx;
      if (d.ordinals.size() <= kWholeDocChunks) {
        for (uint32_t i = 0; i < d.ordinals.size(); ++i) idx.push_back(i);
      } else {
        for (const auto& l : loaded_) {
          if (m_.chunk_slot[l.c.o] != slot) continue;
          const uint32_t at = l.rec.meta.value("index", 0u);
          for (uint32_t i = at > 2 ? at - 2 : 0; i <= at + 2 && i < d.ordinals.size(); ++i)
            idx.push_back(i);
        }
        std::sort(idx.begin(), idx.end());
        idx.erase(std::unique(idx.begin(), idx.end()), idx.end());
      }
      for (uint32_t i : idx) want.push_back(d.ordinals[i]);
      doc_chunks.emplace_back(slot, std::move(idx));
    }
    RETURN_IF_ERROR(ReadChunksInto(m_.storage, std::move(want), prefetched_));
    std::unordered_map<std::string, double> term_weight;
    for (const auto& [t, w] : wq_) {
      double& x = term_weight[t];
      x = std::max(x, std::max(0.0, static_cast<double>(w)) * std::max(0.0, Idf(t)));
    }
    std::vector<std::pair<uint32_t, TextWindow>> windows;  // (slot, window)
    for (const auto& [slot, idx] : doc_chunks) {
      std::vector<const PassageChunk*> chunks;
      for (uint32_t i : idx) chunks.push_back(ChunkOf(slot, i));
      for (const auto& w : ScoreWindows(chunks, term_weight)) windows.emplace_back(slot, w);
    }
    if (!load_error_.ok()) return load_error_;
    std::stable_sort(windows.begin(), windows.end(),
                     [](const auto& a, const auto& b) { return a.second.score > b.second.score; });
    constexpr size_t kTopWindows = 10;
    if (windows.size() > kTopWindows) windows.resize(kTopWindows);
    return windows;
  }

  // No ranked passage shows the window: one grown around its densest chunk.
  bool AddWindowPassage(uint32_t slot, const TextWindow& win) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const DocRec& d = *m_.slots[slot];
    auto rec = Read(d, win.best_chunk);
    if (!rec) return false;
    Passage p = BuildPassage(SourceOf(slot), win.best_chunk, budget_, *scorer_, growth_);
    if (p.text.empty() || !OverlapsWindow(win, p.begin, p.end)) return false;
    window_loaded_.push_back({Cand{d.ordinals[win.best_chunk]}, *std::move(rec), &d, 0.0});
    widened_.push_back({&window_loaded_.back(), slot, win.best_chunk, std::move(p), 0.0});
    return true;
  }

  void CorrectPassages() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    if (Corrections()) {
      for (auto& w : widened_) {
        std::vector<std::string> ids;
        for (uint32_t k : w.p.chunks) ids.push_back(absl::StrCat(w.l->doc->info.id, "#", k));
        w.score = m_.log->Adjust(w.score, qterms_, ids, idf_);
      }
    }
    std::stable_sort(widened_.begin(), widened_.end(),
                     [](const Widened& a, const Widened& b) { return a.score > b.score; });
  }

  struct Taken {
    uint32_t slot;
    Passage p;
    KbSearchHit hit;
  };

  // Whether `w` joins a passage already taken that it overlaps or touches
  // (or, if both would not fit in one passage, keeps only the text that
  // one does not show: nothing, if it lies within it).
  bool Absorbed(Widened& w, std::vector<Taken>& taken) ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    const PassageSource src = SourceOf(w.slot);
    for (bool again = true; again;) {
      again = false;
      for (auto& t : taken) {
        if (t.slot != w.slot) continue;
        const bool overlap = w.p.begin < t.p.end && t.p.begin < w.p.end;
        const bool touch = w.p.end == t.p.begin || t.p.end == w.p.begin;
        if (!overlap && !touch) continue;
        const DocPos ub = std::min(t.p.begin, w.p.begin), ue = std::max(t.p.end, w.p.end);
        if (PassageTokens(src, ub, ue) <= kMaxPassageTokens) {
          t.p = RenderPassage(src, ub, ue, *scorer_);
          for (uint32_t k : w.p.chunks)
            t.hit.chunk_ids.push_back(absl::StrCat(w.l->doc->info.id, "#", k));
          return true;
        }
        if (!overlap) continue;  // adjacent, too long as one: both stay
        const DocPos b = w.p.begin < t.p.begin ? w.p.begin : t.p.end;
        const DocPos e = w.p.begin < t.p.begin ? t.p.begin : w.p.end;
        if (!(b < e) || PassageTokens(src, b, e) == 0) return true;
        w.p = RenderPassage(src, b, e, *scorer_);
        again = true;
        break;
      }
    }
    return false;
  }

  std::vector<KbSearchHit> MergePassages() ABSL_SHARED_LOCKS_REQUIRED(m_.mu) {
    std::vector<Taken> taken;
    for (auto& w : widened_) {
      if (static_cast<int>(taken.size()) >= r_.max_results) break;
      if (w.score < r_.threshold) continue;
      if (Absorbed(w, taken)) continue;
      KbSearchHit h = ChunkHit(*w.l);
      h.score = std::clamp(w.score, 0.0, 1.0);
      h.chunk_ids.clear();
      for (uint32_t k : w.p.chunks) h.chunk_ids.push_back(absl::StrCat(w.l->doc->info.id, "#", k));
      taken.push_back({w.slot, std::move(w.p), std::move(h)});
    }
    std::vector<KbSearchHit> out;
    for (auto& t : taken) {
      KbSearchHit& h = t.hit;
      std::sort(h.chunk_ids.begin(), h.chunk_ids.end());
      h.chunk_ids.erase(std::unique(h.chunk_ids.begin(), h.chunk_ids.end()), h.chunk_ids.end());
      FillFromPassage(h, t.p);
      h.rank = static_cast<int>(out.size()) + 1;
      out.push_back(std::move(h));
    }
    return out;
  }

  KnowledgeBase::Impl& m_;
  const KbSearchRequest& r_;
  KbSearchInfo* info_;
  std::chrono::steady_clock::time_point lap_ = std::chrono::steady_clock::now();
  const FusionOverrides& ov_;
  const int passage_tokens_;
  const bool hybrid_;
  const std::function<double(const std::string&)> idf_;  // Idf, as the scorers take it
  // The query.
  std::vector<float> qvec_;
  std::vector<std::string> qterms_;
  std::vector<std::pair<std::string, float>> wq_;
  std::vector<std::vector<std::string>> variant_terms_;
  std::vector<std::vector<float>> variant_vecs_;
  std::vector<double> variant_weights_;
  std::string hyde_answer_;
  // The legs.
  std::set<std::string> doc_filter_;
  std::set<char> type_filter_;
  bool filtered_ = false;
  std::function<bool(uint32_t)> acc_;
  size_t n_ = 0;
  Bm25Index::Groups groups_;
  std::vector<uint32_t> filtered_groups_;
  ScoredOrdinals lex_, vec_, by_doc_, by_text_, lex_all_;
  bool lex_pruned_ = false;
  std::unordered_map<uint32_t, double> doc_match_;  // slot -> title score / best
  std::unordered_map<uint32_t, double> doc_text_;   // slot -> whole-text score / best
  // Fusion.
  double rrf_k_ = 0;
  std::unordered_map<uint32_t, Cand> cands_;
  std::vector<Cand> order_;
  double max_fused_ = 1, best_lex_ = 1, top_fused_ = 1, top_fused_all_ = 1;
  // The pool and passages.
  std::vector<Loaded> loaded_;
  std::unordered_map<uint32_t, std::string> prefetched_;  // ordinal -> stored record
  absl::Status load_error_;
  std::unordered_map<uint64_t, std::unique_ptr<PassageChunk>> chunk_cache_;  // (slot, index)
  std::unordered_map<uint64_t, std::string> text_cache_;  // texts read for overlaps
  std::optional<QueryTermScorer> scorer_;
  int budget_ = 0;
  PassageGrowth growth_ = PassageGrowth::kTowardsQuery;
  std::vector<Widened> widened_;
  std::deque<Loaded> window_loaded_;  // chunks of passages grown around a window
};

}  // namespace

absl::StatusOr<std::vector<KbSearchHit>> KnowledgeBase::SearchImpl(const KbSearchRequest& r,
                                                                   KbSearchInfo* info) {
  RETURN_IF_ERROR(CheckSearchRequest(r));
  return SearchRun(*impl_, r, info).Run();
}

absl::StatusOr<KbStats> KnowledgeBase::Stats(const std::string& collection) {
  ReaderMutexLock lock(&impl_->mu);
  KbStats s;
  for (const auto& d : impl_->slots) {
    if (!d || (!collection.empty() && d->info.collection != collection)) continue;
    ++s.documents;
    s.chunks += d->info.chunks;
    s.bytes += d->info.bytes;
  }
  s.index_kinds = {
      absl::StrCat("lexical:bm25(k1=", impl_->options.bm25_k1, ",b=", impl_->options.bm25_b, ")"),
      impl_->vectors->off()
          ? absl::StrCat("vector:off (", impl_->vectors->off_reason(), "; the lexical legs alone)")
          : absl::StrCat("vector:faiss-", impl_->vectors->describe())};
  s.embedder = impl_->embedder.name();
  s.dimension = impl_->embedder.dimension();
  s.log = impl_->log->counts();
  return s;
}

absl::Status KnowledgeBase::SaveIndexes() {
  MutexLock sl(&impl_->save_mu);
  {
    ReaderMutexLock lock(&impl_->mu);
    if (impl_->saved_changes == impl_->changes) return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const uint64_t gen, impl_->SaveOnce());
  impl_->AdoptSavedLexical(gen);
  return absl::OkStatus();
}

}  // namespace fwai
