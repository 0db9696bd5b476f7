// The AuthMetadataProcessor of fwaid's TCP listeners (TLS, or loopback with
// local credentials): every call must carry a valid bearer token
// ("authorization: Bearer fwai_…") or come with a client certificate that
// maps to a user. The first principal verified on a connection is bound to
// it (gRPC shares one auth context among a connection's calls); a call with
// another identity on that connection is refused. Internal to server/api.
#pragma once

#include <grpcpp/security/auth_metadata_processor.h>

#include <memory>

namespace fwai {

class Gate;

std::shared_ptr<grpc::AuthMetadataProcessor> MakeAuthProcessor(Gate& gate);

}  // namespace fwai
