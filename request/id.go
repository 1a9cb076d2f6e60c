package request

import (
	"encoding/hex"
	"math/rand/v2"
	"net/http"
	"unsafe"
)

// HeaderID is the request id header: every answer of both tiers carries
// it, each tier passes it on to the next hop, and logs name requests by
// it (the OpenAI SDKs surface it as the request id).
const HeaderID = "X-Request-Id"

// MaxIDLen is the longest caller-sent request id kept.
const MaxIDLen = 128

// ValidID reports whether a caller's request id is kept: 1 to MaxIDLen
// bytes of letters, digits and "-_.:" (UUIDs, OpenAI's req_… ids,
// Envoy's). Anything else (longer, spaces, quotes, control characters
// that would forge log lines) is replaced by a generated id.
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > MaxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// IDLen is the length of a generated request id: "req_" and 32 hex digits.
const IDLen = 4 + 32

// ID holds one request's id and the header value slice that names it, so
// that setting it allocates nothing when an ID lives in a per-request
// struct.
type ID struct {
	buf [IDLen]byte
	val [1]string
}

// Take sets id to the request id of a request with headers in: the
// caller's when it sent exactly one valid id (ValidID), else a generated
// one. It returns it; Values is it as a header value.
func (id *ID) Take(in http.Header) string {
	if vs := in[HeaderID]; len(vs) == 1 && ValidID(vs[0]) {
		id.val[0] = vs[0]
		return vs[0]
	}
	copy(id.buf[:], "req_")
	var r [16]byte
	a, b := rand.Uint64(), rand.Uint64()
	for i := range 8 {
		r[i], r[8+i] = byte(a>>(8*i)), byte(b>>(8*i))
	}
	hex.Encode(id.buf[4:], r[:])
	id.val[0] = unsafe.String(&id.buf[0], IDLen)
	return id.val[0]
}

// Values is the id Take set, as a header's values (one string), without
// allocating.
func (id *ID) Values() []string { return id.val[:1:1] }

// Use is Take, setting the id in in (so that it goes on to the next hop)
// and in out (the response's headers).
func (id *ID) Use(in, out http.Header) string {
	s := id.Take(in)
	in[HeaderID] = id.Values()
	out[HeaderID] = id.Values()
	return s
}

// UseID is ID.Use for a caller without a per-request struct to keep the ID
// in (one allocation).
func UseID(in, out http.Header) string { return new(ID).Use(in, out) }
