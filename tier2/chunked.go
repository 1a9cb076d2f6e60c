package tier2

import (
	"bytes"
	"errors"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// chunkDecoder reads a chunked body (RFC 9112 §7.1) as its bytes arrive,
// in whatever pieces: the event loops have no reader to block on. A line
// (a chunk's size, a trailer) that has not arrived whole is left
// unconsumed for the next call.
type chunkDecoder struct {
	state int
	size  int64 // bytes left in the current chunk
}

const (
	chunkSize = iota
	chunkData
	chunkCR
	chunkLF
	chunkTrailer
	chunkDone
)

// maxChunkLine bounds a chunk-size or trailer line.
const maxChunkLine = 4096

var (
	errChunked       = errors.New("malformed chunked encoding")
	errChunkTooLarge = errors.New("chunked body longer than the limit")
)

// feed consumes what it can of b, passing chunk data to data (whose slice
// is b's: valid during the call). It reports the bytes consumed and
// whether the body ended (the last chunk and its trailers).
func (d *chunkDecoder) feed(b []byte, data func([]byte) error) (n int, done bool, err error) {
	for n < len(b) && d.state != chunkDone {
		switch d.state {
		case chunkSize, chunkTrailer:
			i := bytes.IndexByte(b[n:], '\n')
			if i < 0 {
				if len(b)-n > maxChunkLine {
					return n, false, errChunked
				}
				return n, false, nil
			}
			if i > maxChunkLine {
				return n, false, errChunked
			}
			line := bytes.TrimRight(b[n:n+i], "\r")
			n += i + 1
			if d.state == chunkTrailer {
				if len(line) == 0 {
					d.state = chunkDone
				}
				continue
			}
			if j := bytes.IndexByte(line, ';'); j >= 0 {
				line = line[:j] // extensions are ignored
			}
			line = bytes.TrimRight(line, " \t")
			if len(line) == 0 || len(line) > 15 {
				return n, false, errChunked
			}
			size, perr := strconv.ParseInt(string(line), 16, 64)
			if perr != nil || size < 0 {
				return n, false, errChunked
			}
			if size == 0 {
				d.state = chunkTrailer
			} else {
				d.size, d.state = size, chunkData
			}
		case chunkData:
			k := int(min(int64(len(b)-n), d.size))
			if err := data(b[n : n+k]); err != nil {
				return n, false, err
			}
			n += k
			if d.size -= int64(k); d.size == 0 {
				d.state = chunkCR
			}
		case chunkCR:
			switch b[n] {
			case '\r':
				d.state = chunkLF
			case '\n':
				d.state = chunkSize
			default:
				return n, false, errChunked
			}
			n++
		case chunkLF:
			if b[n] != '\n' {
				return n, false, errChunked
			}
			n++
			d.state = chunkSize
		}
	}
	return n, d.state == chunkDone, nil
}

// decode is feed appending the data to *out, at most limit bytes in all
// (errChunkTooLarge beyond).
func (d *chunkDecoder) decode(b []byte, out *[]byte, limit int64) (int, bool, error) {
	return d.feed(b, func(p []byte) error {
		if int64(len(*out)+len(p)) > limit {
			return errChunkTooLarge
		}
		*out = append(*out, p...)
		return nil
	})
}

// upstreamHead is what the event loops read of a Tier-1's response head.
type upstreamHead struct {
	status int
	// fields are the header lines in order, keys canonical, values
	// substrings of one copy of the head.
	fields      []hfield
	contentType string // the first Content-Type value
	date        bool   // a Date line is among the fields
	length      int64  // Content-Length; -1: none
	chunked     bool
	close       bool // the connection ends with this response
}

// hfield is one header line.
type hfield struct{ k, v string }

var errResponseHead = errors.New("malformed response head")

// parseResponseHead reads an HTTP/1.x response head (ending in its blank
// line) without net/http's reader: the status, the headers (keys in
// canonical form, as Tier-1's net/http writes them; keys interns them)
// and the body's framing. Anything it does not expect (a header line
// folded, a transfer coding other than chunked, two lengths) is an error:
// the attempt fails, as it would on a malformed response.
//
// The fields are appended to fields[:0] (the caller's array: no map is
// built, the loop writes them to the caller's head as they are).
func parseResponseHead(b []byte, keys map[string]string, fields []hfield) (upstreamHead, error) {
	h := upstreamHead{length: -1, fields: fields[:0]}
	i := bytes.Index(b, []byte("\r\n"))
	if i < 12 || !bytes.HasPrefix(b, []byte("HTTP/1.")) || b[8] != ' ' {
		return h, errResponseHead
	}
	line := b[:i]
	minor := line[7]
	if minor != '0' && minor != '1' {
		return h, errResponseHead
	}
	h.close = minor == '0'
	code := line[9:12]
	for _, ch := range code {
		if ch < '0' || ch > '9' {
			return h, errResponseHead
		}
	}
	if len(line) > 12 && line[12] != ' ' {
		return h, errResponseHead
	}
	h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if h.status < 100 {
		return h, errResponseHead
	}
	// The header lines are copied once; every value is a substring.
	rest := string(b[i+2:])
	lengths := 0
	for {
		line, r, ok := strings.Cut(rest, "\r\n")
		if !ok {
			return h, errResponseHead
		}
		rest = r
		if len(line) == 0 {
			break
		}
		k, v, found := strings.Cut(line, ":")
		if !found || len(k) == 0 || line[0] == ' ' || line[0] == '\t' || !httpguts.ValidHeaderFieldName(k) {
			return h, errResponseHead
		}
		key, ok := keys[k]
		if !ok {
			key = strings.Clone(textproto.CanonicalMIMEHeaderKey(k)) // kept in keys: not the head's
			if len(keys) < 256 {
				keys[key] = key
				keys[strings.Clone(k)] = key
			}
		}
		val := strings.Trim(v, " \t")
		if !httpguts.ValidHeaderFieldValue(val) {
			return h, errResponseHead
		}
		switch key {
		case "Content-Length":
			lengths++
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 0 || h.length >= 0 && h.length != n {
				return h, errResponseHead
			}
			h.length = n
		case "Transfer-Encoding":
			if !strings.EqualFold(val, "chunked") || h.chunked {
				return h, errResponseHead
			}
			h.chunked = true
		case "Connection":
			if httpguts.HeaderValuesContainsToken([]string{val}, "close") {
				h.close = true
			} else if minor == '0' && httpguts.HeaderValuesContainsToken([]string{val}, "keep-alive") {
				h.close = false
			}
		case "Content-Type":
			if h.contentType == "" {
				h.contentType = val
			}
		case "Date":
			h.date = true
		}
		h.fields = append(h.fields, hfield{key, val})
	}
	switch {
	case h.status < 200 || h.status == http.StatusNoContent || h.status == http.StatusNotModified:
		h.length, h.chunked = 0, false
	case h.chunked:
		h.length = -1 // chunked wins over a length (RFC 9112 §6.3)
		h.close = h.close || lengths > 0
	}
	return h, nil
}

// parseRequestHead reads the common request head without net/http's
// reader: GET or POST of a plain path (letters, digits, "-._~/") over
// HTTP/1.1, one Host, at most one Content-Length, no Transfer-Encoding,
// no folded lines. For anything else ok is false and net/http's parser
// reads the head, so what is accepted here is read exactly as it would
// read it (TestParseRequestHead compares the two).
//
// The head is copied once: the path and every value are substrings of
// that copy, and the request, its URL and the first values' slices are
// one allocation (a value kept past the request pins the head, at most
// MaxHeaderBytes: what is kept for long, such as a cached token, is
// cloned by its keeper). reuse, when not nil, is an ended request's
// parsedRequest, its header map with it, which this one overwrites.
func parseRequestHead(b []byte, keys map[string]string, reuse *parsedRequest) (h *parsedRequest, ok bool) {
	text := string(b)
	line, rest, found := strings.Cut(text, "\r\n")
	if !found {
		return nil, false
	}
	var method string
	switch {
	case strings.HasPrefix(line, "POST "):
		method, line = http.MethodPost, line[5:]
	case strings.HasPrefix(line, "GET "):
		method, line = http.MethodGet, line[4:]
	default:
		return nil, false
	}
	path, proto, found := strings.Cut(line, " ")
	if !found || proto != "HTTP/1.1" || len(path) == 0 || path[0] != '/' {
		return nil, false
	}
	for i := 0; i < len(path); i++ {
		if !plainPathByte(path[i]) {
			return nil, false
		}
	}
	h = reuse
	var hdr http.Header
	if h == nil {
		h, hdr = new(parsedRequest), make(http.Header, 8)
	} else {
		hdr = h.req.Header
		clear(hdr)
		*h = parsedRequest{}
	}
	h.url.Path = path
	req := &h.req
	*req = http.Request{Method: method, URL: &h.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: hdr, RequestURI: path, Body: http.NoBody}
	hosts, nvals := 0, 0
	for {
		line, rest, found = strings.Cut(rest, "\r\n")
		if !found {
			return nil, false
		}
		if len(line) == 0 {
			break
		}
		k, v, found := strings.Cut(line, ":")
		if !found || len(k) == 0 {
			return nil, false
		}
		for i := 0; i < len(k); i++ {
			if !httpguts.IsTokenRune(rune(k[i])) {
				return nil, false
			}
		}
		key, known := keys[k]
		if !known {
			key = strings.Clone(textproto.CanonicalMIMEHeaderKey(k)) // kept in keys: not the head's
			if len(keys) < 256 {
				keys[strings.Clone(k)] = key
			}
		}
		val := strings.Trim(v, " \t")
		if !httpguts.ValidHeaderFieldValue(val) {
			return nil, false
		}
		switch key {
		case "Host":
			hosts++
			req.Host = val
			continue // http.ReadRequest keeps it out of the map
		case "Content-Length":
			if len(req.Header["Content-Length"]) > 0 || len(val) == 0 || len(val) > 18 {
				return nil, false
			}
			for i := 0; i < len(val); i++ {
				if val[i] < '0' || val[i] > '9' {
					return nil, false
				}
			}
			req.ContentLength, _ = strconv.ParseInt(val, 10, 64)
		case "Transfer-Encoding", "Trailer":
			return nil, false
		case "Connection":
			if httpguts.HeaderValuesContainsToken([]string{val}, "close") {
				req.Close = true
			}
		}
		if vs := req.Header[key]; len(vs) > 0 || nvals == len(h.vals) {
			req.Header[key] = append(vs, val)
		} else {
			h.vals[nvals] = val
			req.Header[key] = h.vals[nvals : nvals+1 : nvals+1]
			nvals++
		}
	}
	if hosts != 1 || !httpguts.ValidHostHeader(req.Host) {
		return nil, false
	}
	return h, true // the body is the caller's to set
}

// parsedRequest is a request parseRequestHead read, its URL and its first
// header values, allocated together.
type parsedRequest struct {
	req  http.Request
	url  url.URL
	vals [12]string
}

// plainPathByte: a byte of a path that needs no unescaping or cleaning.
func plainPathByte(ch byte) bool {
	return 'a' <= ch && ch <= 'z' || 'A' <= ch && ch <= 'Z' || '0' <= ch && ch <= '9' || ch == '-' || ch == '.' || ch == '_' || ch == '~' || ch == '/'
}
