package extproc

// Codec is the server's codec, for the tests' Go client playing Envoy:
// with gRPC's own, every 62,000-byte chunk the client receives is
// materialised into a 1 MiB buffer zeroed whole, a cost Envoy (C++) does
// not have and the picker's benchmarks should not carry.
var Codec = codec{}
