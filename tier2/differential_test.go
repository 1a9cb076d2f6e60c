package tier2

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
)

// wireDoor is a front door served as in production (NewServer) over a
// recording stand-in for Tier-1, for raw-bytes cases (testkit.Wire). The
// recorder names each request that reaches it MARKER@TENANT (the first
// message's content and the identity Tier-2 sent), with +expect,
// +authorization or +trailer when the request carried one of those.
type wireDoor struct {
	*door
	testkit.Wire
}

func newWireDoor(t *testing.T) *wireDoor {
	t.Helper()
	rec := testkit.NewWireRecorder(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"chat.completion","model":"chat-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`)
	}), func(r *http.Request, body []byte) string {
		var b struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		name := "unparsed"
		if json.Unmarshal(body, &b) == nil && len(b.Messages) > 0 {
			name = b.Messages[0].Content
		}
		name += "@" + r.Header.Get("X-Meridian-Tenant")
		for _, h := range []string{"Expect", "Authorization"} {
			if r.Header.Get(h) != "" {
				name += "+" + strings.ToLower(h)
			}
		}
		if len(r.Trailer) > 0 {
			name += "+trailer"
		}
		return name
	})
	up := httptest.NewServer(rec)
	t.Cleanup(up.Close)
	d := newDoorRouter(t, func(c *Config) { c.BodyReadTimeout = 2 * time.Second }, up.URL)
	front := testkit.Track(d.r.Handler())
	srv := httptest.NewUnstartedServer(front)
	srv.Config = NewServer(front)
	srv.Config.ReadHeaderTimeout = 2 * time.Second // the stalled-head case waits this long
	srv.Config.ErrorLog = log.New(panicWriter{t}, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	d.url = srv.URL
	return &wireDoor{door: d, Wire: testkit.Wire{
		Addr: srv.Listener.Addr().String(), Front: front, Upstream: rec,
		Sentinel: "GET /healthz HTTP/1.1\r\nHost: t2\r\n\r\n", SentinelBody: "ok\n",
		ReadFor: 20 * time.Second,
	}}
}

// panicWriter fails the test on a handler's panic, which net/http
// recovers and logs (http.ErrAbortHandler, the deliberate one, is not
// logged).
type panicWriter struct{ t *testing.T }

func (w panicWriter) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("panic")) {
		w.t.Errorf("front door: %s", p)
	}
	return len(p), nil
}

// chat is a chat request body whose first message is marker, padded with
// spaces to at least size bytes.
func chat(marker string, size int) string {
	b := `{"model":"chat-model","messages":[{"role":"user","content":"` + marker + `"}]}`
	if len(b) < size {
		b = b[:len(b)-1] + strings.Repeat(" ", size-len(b)) + "}"
	}
	return b
}

// TestFrontDoorDifferential sends the front door raw bytes an attacker or
// a broken client would (smuggling variants of Content-Length and
// Transfer-Encoding, split lines, pipelining, 100-continue, oversized
// heads, stalled and half-closed connections) and checks what the caller
// reads and what reaches Tier-1: each request exactly once, with its own
// identity and body, or nothing. The expectations are HTTP/1.1's (RFC 9112)
// as net/http implements it; every case once failed, or would fail, on a
// server that frames requests differently from the proxies in front of it.
func TestFrontDoorDifferential(t *testing.T) {
	d := newWireDoor(t)
	team, claims := d.token(t, "team", nil), d.token(t, "claims-team", nil)
	head := func(tok string, extra ...string) string {
		h := "POST /v1/chat/completions HTTP/1.1\r\nHost: t2\r\nContent-Type: application/json\r\nAuthorization: " + tok + "\r\n"
		for _, e := range extra {
			h += e + "\r\n"
		}
		return h
	}
	post := func(tok, marker string) string {
		b := chat(marker, 0)
		return head(tok, fmt.Sprintf("Content-Length: %d", len(b))) + "\r\n" + b
	}
	chunkedHead := head(team, "Transfer-Encoding: chunked") + "\r\n"
	body256 := chat("C", 0x100)
	inner := post(team, "SMUGGLED")
	contentType := func(want string) func(*testing.T, int, *http.Response, []byte) {
		return func(t *testing.T, i int, r *http.Response, _ []byte) {
			if got := r.Header.Get("Content-Type"); !strings.HasPrefix(got, want) {
				t.Errorf("response %d: Content-Type %q, want %q", i, got, want)
			}
		}
	}
	cases := []testkit.WireCase{
		{Name: "one request", Pieces: testkit.Pieces(post(team, "A")), Statuses: []int{200}, Upstream: []string{"A@team"}},
		{Name: "two tenants on one connection", Pieces: testkit.Pieces(post(team, "A") + post(claims, "B")),
			Statuses: []int{200, 200}, Upstream: []string{"A@team", "B@claims-team"}},
		{Name: "tenants alternate over keep-alive", Pieces: testkit.Pieces(post(claims, "A"), post(team, "B"), post(claims, "C")),
			Statuses: []int{200, 200, 200}, Upstream: []string{"A@claims-team", "B@team", "C@claims-team"}},
		{Name: "pipelined after a GET", Pieces: testkit.Pieces("GET /healthz HTTP/1.1\r\nHost: t2\r\n\r\n" + post(team, "A")),
			Methods: []string{"GET"}, Statuses: []int{200, 200}, Upstream: []string{"A@team"}},
		{Name: "pipelined after a POST without a body", Pieces: testkit.Pieces(head(team, "Content-Length: 0") + "\r\n" + post(team, "B")),
			Statuses: []int{400, 200}, Upstream: []string{"B@team"}},
		{Name: "head after a pipelined GET, body (itself a request) in a later write",
			Pieces:   testkit.Pieces("GET /healthz HTTP/1.1\r\nHost: t2\r\n\r\n"+head(team, fmt.Sprintf("Content-Length: %d", len(inner)))+"\r\n", inner),
			Methods:  []string{"GET"},
			Statuses: []int{200, 400}},
		{Name: "chunk size line split across writes, a request in the chunk", // 0x1000 bytes announced: the rest is body, never a request
			Pieces: testkit.Pieces(chunkedHead, "1", "000\r\n\r\n"+inner), HalfClose: true, Statuses: []int{400}},
		{Name: "chunk size line split across writes", Check: closes, Pieces: testkit.Pieces(chunkedHead, "1", "00\r\n"+body256+"\r\n0\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@team"}},
		{Name: "chunked body in many small writes", Pieces: testkit.Pieces(append([]string{chunkedHead}, splitEvery("100\r\n"+body256+"\r\n0\r\n\r\n", 32)...)...),
			Statuses: []int{200}, Upstream: []string{"C@team"}},
		{Name: "chunked, a zero chunk then a pipelined request", Pieces: testkit.Pieces(chunkedHead + "0\r\n\r\n" + post(claims, "B")),
			Statuses: []int{400}, Check: closes},
		{Name: "16-digit chunk size", Pieces: testkit.Pieces(chunkedHead + "0000000000000100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@team"}},
		{Name: "chunk size with a sign", Pieces: testkit.Pieces(chunkedHead + "+100\r\n" + body256 + "\r\n0\r\n\r\n"), Statuses: []int{400}},
		{Name: "bare LF after a chunk size", Pieces: testkit.Pieces(chunkedHead + "100\n" + body256 + "\r\n0\r\n\r\n"), Statuses: []int{400}},
		{Name: "trailer after the last chunk", Pieces: testkit.Pieces(chunkedHead + "100\r\n" + body256 + "\r\n0\r\nX-Trailer: v\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@team"}},
		// RFC 9112 §6.3: Transfer-Encoding overrides Content-Length, and
		// the connection closes after the response (a proxy in front that
		// framed by Content-Length sent what follows as another request).
		{Name: "Content-Length and Transfer-Encoding", Pieces: testkit.Pieces(head(team, "Content-Length: 5", "Transfer-Encoding: chunked") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{200}, Upstream: []string{"C@team"}, Check: closes},
		{Name: "Transfer-Encoding twice", Pieces: testkit.Pieces(head(team, "Transfer-Encoding: chunked", "Transfer-Encoding: chunked") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{501}},
		{Name: "Transfer-Encoding xchunked", Pieces: testkit.Pieces(head(team, "Transfer-Encoding: xchunked") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{501}},
		{Name: "Transfer-Encoding chunked, identity", Pieces: testkit.Pieces(head(team, "Transfer-Encoding: chunked, identity") + "\r\n100\r\n" + body256 + "\r\n0\r\n\r\n"),
			Statuses: []int{501}},
		{Name: "space before the colon of Transfer-Encoding", Pieces: testkit.Pieces(head(team, "Transfer-Encoding : chunked", "Content-Length: 5") + "\r\nxxxxx"),
			Statuses: []int{400}},
		{Name: "conflicting Content-Lengths", Pieces: testkit.Pieces(head(team, "Content-Length: 10", "Content-Length: 20") + "\r\n" + chat("A", 20)),
			Statuses: []int{400}},
		{Name: "LF-only request head", Pieces: testkit.Pieces(strings.ReplaceAll(post(team, "A"), "\r\n", "\n")),
			Statuses: []int{200}, Upstream: []string{"A@team"}},
		{Name: "encoded slash in the path", Pieces: testkit.Pieces(strings.Replace(post(team, "A"), "/v1/chat/", "/v1%2Fchat/", 1)),
			Statuses: []int{404}},
		{Name: "HTTP/1.0", Pieces: testkit.Pieces(strings.Replace(post(team, "A"), "HTTP/1.1", "HTTP/1.0", 1)),
			Statuses: []int{200}, Upstream: []string{"A@team"},
			Check: func(t *testing.T, _ int, r *http.Response, _ []byte) {
				if len(r.TransferEncoding) > 0 || !r.Close {
					t.Errorf("an HTTP/1.0 request was answered with %v framing, close %v", r.TransferEncoding, r.Close)
				}
			}},
		{Name: "HEAD", Pieces: testkit.Pieces("HEAD /healthz HTTP/1.1\r\nHost: t2\r\n\r\n"), Methods: []string{"HEAD"}, Statuses: []int{200}},
		{Name: "Expect: 100-continue", Pieces: []testkit.WirePiece{
			{Bytes: []byte(head(team, "Expect: 100-continue", fmt.Sprintf("Content-Length: %d", len(chat("E", 3000)))) + "\r\n")},
			{Bytes: []byte(chat("E", 3000)), AwaitInterim: true}},
			Interim: 1, Statuses: []int{200}, Upstream: []string{"E@team"}},
		{Name: "Expect: 100-continue with a bad token", Pieces: []testkit.WirePiece{
			{Bytes: []byte(head("Bearer nope", "Expect: 100-continue", "Content-Length: 100") + "\r\n")},
			{Bytes: []byte(chat("E", 100)), AwaitInterim: true}},
			Statuses: []int{401}, Check: contentType("application/json")},
		{Name: "oversized head", Pieces: testkit.Pieces(head(team, "X-Big: "+strings.Repeat("a", 80<<10)) + "Content-Length: 2\r\n\r\n{}"),
			Statuses: []int{431}},
		{Name: "too many header values", Pieces: testkit.Pieces(head(team, strings.Repeat("X-H: v\r\n", 150)+"Content-Length: 2") + "\r\n{}"),
			Statuses: []int{431}, Check: contentType("application/json")},
		{Name: "internal headers from the caller", Pieces: testkit.Pieces(head(team, "X-Meridian-Tenant: claims-team", "x-gateway-model-name: other-model",
			fmt.Sprintf("Content-Length: %d", len(chat("A", 0)))) + "\r\n" + chat("A", 0)),
			Statuses: []int{200}, Upstream: []string{"A@team"}},
		{Name: "stalled body", Pieces: testkit.Pieces(head(team, "Content-Length: 100") + "\r\n" + `{"model":`), Stall: true,
			Statuses: []int{408}},
		{Name: "stalled head", Pieces: testkit.Pieces("POST /v1/chat/completions HTTP/1.1\r\nHost: t2\r\n"), Stall: true},
		{Name: "half-closed after the head", Pieces: testkit.Pieces(head(team, "Content-Length: 100") + "\r\n"), HalfClose: true,
			Statuses: []int{400}},
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { d.Check(t, c) })
	}
}

// closes checks that a response ends its connection.
func closes(t *testing.T, i int, r *http.Response, _ []byte) {
	if !r.Close {
		t.Errorf("response %d leaves the connection open", i)
	}
}

// splitEvery cuts s into pieces of n bytes.
func splitEvery(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	return append(out, s)
}

// FuzzFrontDoorRaw sends arbitrary bytes to the front door over one
// connection ("{TOKEN}" in them becomes a valid token of tenant team) and
// checks that no handler panics and that whatever reaches Tier-1 is a
// request net/http's own reading of the same bytes finds, in order,
// each at most once: the front door never makes up, splits or merges
// requests. Its seeds are TestFrontDoorDifferential's kinds of input.
func FuzzFrontDoorRaw(f *testing.F) {
	post := func(marker string, extra string) string {
		b := chat(marker, 0)
		return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: t2\r\nAuthorization: {TOKEN}\r\n%sContent-Length: %d\r\n\r\n%s", extra, len(b), b)
	}
	chunked := "POST /v1/chat/completions HTTP/1.1\r\nHost: t2\r\nAuthorization: {TOKEN}\r\nTransfer-Encoding: chunked\r\n\r\n"
	for _, seed := range []string{
		post("A", ""),
		post("A", "") + post("B", ""),
		"GET /healthz HTTP/1.1\r\nHost: t2\r\n\r\n" + post("A", ""),
		chunked + fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(chat("C", 0)), chat("C", 0)),
		chunked + "0\r\n\r\n" + post("B", ""),
		post("A", "Transfer-Encoding: chunked\r\n"),
		post("A", "Expect: 100-continue\r\n"),
		strings.ReplaceAll(post("A", ""), "\r\n", "\n"),
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		d := newWireDoor(t)
		in := bytes.ReplaceAll(raw, []byte("{TOKEN}"), []byte(d.token(t, "team", nil)))
		d.Send(t, testkit.WireCase{Name: "fuzz", Pieces: []testkit.WirePiece{{Bytes: in}}, HalfClose: true})
		d.Front.Wait()
		d.Upstream.Wait()
		want := referenceMarkers(in)
		seen := d.Upstream.Seen()
		j := 0
		for _, s := range seen {
			marker, _, _ := strings.Cut(s, "@")
			for j < len(want) && want[j] != marker {
				j++
			}
			if j == len(want) {
				t.Fatalf("Tier-1 saw %q, which net/http's reading of the bytes does not find in order (it finds %q; Tier-1 saw %q)", s, want, seen)
			}
			j++
		}
	})
}

// referenceMarkers reads raw as net/http reads a connection's requests
// (http.ReadRequest, then the body) and returns the first message's
// content of each request whose body is a chat request.
func referenceMarkers(raw []byte) []string {
	br := bufio.NewReader(bytes.NewReader(raw))
	var out []string
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return out
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return out
		}
		var b struct {
			Messages []struct{ Content string } `json:"messages"`
		}
		if json.Unmarshal(body, &b) == nil && len(b.Messages) > 0 {
			out = append(out, b.Messages[0].Content)
		}
	}
}
