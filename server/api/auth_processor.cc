#include "server/api/auth_processor.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/api/gate.h"

namespace fwai {
namespace {

// A refusal's message as it goes on the wire: gRPC sends an authentication
// refusal's text as it is, and clients drop a message that is not printable
// ASCII (leaving a bare UNAUTHENTICATED), so anything else becomes '?'.
std::string WireText(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else if (c >= 0xc0) {  // the first byte of one UTF-8 character
      out += '?';
    } else if (c < 0x80) {
      out += ' ';
    }
  }
  return out;
}

std::string Prop(const grpc::AuthContext& a, const char* name) {
  auto v = a.FindPropertyValues(name);
  return v.empty() ? std::string() : std::string(v.front().data(), v.front().size());
}

class Processor final : public grpc::AuthMetadataProcessor {
 public:
  explicit Processor(Gate& gate) : gate_(gate) {}
  // Token checks are in memory: no need for gRPC's blocking thread.
  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& md, grpc::AuthContext* ctx, OutputMetadata* consumed,
                       OutputMetadata*) override {
    const std::string peer = Prop(*ctx, "peer_ip").empty() ? "tcp" : Prop(*ctx, "peer_ip");
    absl::StatusOr<Principal> p = absl::UnauthenticatedError(
        "no credentials: give a token (FWAI_TOKEN or --token-file; an admin makes one with fwai "
        "token create) "
        "or a client certificate");
    std::string token_id, subject;
    auto auth = md.find("authorization");
    if (auth != md.end()) {
      std::string value(auth->second.data(), auth->second.size());
      consumed->insert({"authorization", value});  // never seen by handlers or logs
      if (!absl::StartsWithIgnoreCase(value, "bearer ")) {
        p = absl::UnauthenticatedError("authorization: expected 'Bearer <token>'");
      } else {
        p = gate_.identities().ForToken(value.substr(7), peer);
        if (p.ok()) token_id = p->token_id;
      }
    } else if (ctx->IsPeerAuthenticated() && !Prop(*ctx, GRPC_X509_SUBJECT_PROPERTY_NAME).empty()) {
      subject = Prop(*ctx, GRPC_X509_SUBJECT_PROPERTY_NAME);
      p = gate_.identities().ForCertificate(subject, Prop(*ctx, GRPC_X509_CN_PROPERTY_NAME), peer);
    }
    if (!p.ok()) {
      gate_.RecordRefusal("(authentication)", "", peer, p.status());
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          WireText(std::string(p.status().message())));
    }
    // One principal per connection.
    const std::string bound = Prop(*ctx, "fwai_principal");
    if (!bound.empty() && bound != p->id) {
      gate_.RecordRefusal("(authentication)", p->id, peer,
                          absl::UnauthenticatedError("second identity on one connection"));
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          WireText(absl::StrCat("this connection is already used by ", bound,
                                                "; another identity needs its own connection")));
    }
    if (bound.empty()) {
      ctx->AddProperty("fwai_principal", p->id);
      if (!token_id.empty()) ctx->AddProperty("fwai_token", token_id);
      if (!subject.empty()) ctx->AddProperty("fwai_subject", subject);
    } else if (!token_id.empty() && Prop(*ctx, "fwai_token") != token_id) {
      // Same person, another token: the call is checked against the bound
      // token, so it must be the same one.
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          "this connection is bound to another token; use one token per connection");
    }
    return grpc::Status::OK;
  }

 private:
  Gate& gate_;
};

}  // namespace

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthProcessor(Gate& gate) {
  return std::make_shared<Processor>(gate);
}

}  // namespace fwai
