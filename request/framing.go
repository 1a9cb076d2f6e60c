package request

import "net/http"

// CloseAfterChunked ends an HTTP/1 connection after the response to a
// request framed by Transfer-Encoding. net/http reads such a body by its
// chunks and drops a Content-Length sent beside them (RFC 9112 §6.3); a
// proxy in front that framed the same bytes by Content-Length would take
// what follows the body for another request, so the connection must not
// carry one (the RFC's MUST). Clients of the OpenAI API send a
// Content-Length; a chunked upload costs a new connection. Call it before
// the response's headers are written.
func CloseAfterChunked(w http.ResponseWriter, req *http.Request) {
	if req.ProtoMajor == 1 && len(req.TransferEncoding) > 0 {
		w.Header().Set("Connection", "close")
	}
}
