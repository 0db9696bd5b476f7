# Makes a copy of one of etcd's v3 API protos (Debian: golang-etcd-server-dev)
# that Debian's protoc compiles without etcd's Go-only dependencies: the
# gogoproto and google.api imports, every `option (gogoproto...)` line, every
# `[(gogoproto...)]` field option and each rpc's `option (google.api.http)`
# body are dropped. Nothing else changes, so the wire format is etcd's own.
#   cmake -DIN=.../rpc.proto -DOUT=.../rpc.proto -P strip_etcd_proto.cmake
file(READ "${IN}" text)
string(REGEX REPLACE "import \"gogoproto/gogo.proto\";\n" "" text "${text}")
string(REGEX REPLACE "import \"google/api/annotations.proto\";\n" "" text "${text}")
string(REGEX REPLACE "option \\(gogoproto\\.[a-z_]+\\) = [a-z]+;\n" "" text "${text}")
string(REGEX REPLACE " *\\[\\(gogoproto\\.[^]]*\\]" "" text "${text}")
# (a body may hold one level of nested braces: additional_bindings { ... })
string(REGEX REPLACE "option \\(google\\.api\\.http\\) = {([^{}]|{[^{}]*})*};" "" text "${text}")
if(text MATCHES "gogoproto|google\\.api\\.")
  file(WRITE "${OUT}.rejected" "${text}")
  message(FATAL_ERROR "${IN}: annotations left after stripping (see ${OUT}.rejected); this etcd version's protos need a look")
endif()
file(WRITE "${OUT}.tmp" "${text}")
file(RENAME "${OUT}.tmp" "${OUT}")
