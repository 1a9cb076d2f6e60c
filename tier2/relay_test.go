package tier2

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// Events are flushed in batches (those that arrived together leave in one
// write), but never held behind a read: here the first event arrives with
// the start of the second, and the upstream sends the rest only once the
// caller has the first. A relay that waited for more before flushing
// would never deliver it (the test's 30 s bound fails it).
func TestStreamEventNotHeldBehindARead(t *testing.T) {
	got := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte(`data: {"id":"c","model":"chat-model","choices":[{"index":0,"delta":{"content":"hi"}}]}` + "\n\n" + `data: {"id":"c",`))
		w.(http.Flusher).Flush()
		select {
		case <-got:
		case <-r.Context().Done():
			return
		}
		w.Write([]byte(`"model":"chat-model","choices":[{"index":0,"delta":{"content":"there"}}]}` + "\n\n" + "data: [DONE]\n\n"))
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp := d.post(t, ctx, d.token(t, "team", nil), "/v1/chat/completions",
		`{"model":"chat-model","stream":true,"messages":[{"role":"user","content":"x"}]}`, nil)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	if err != nil || !strings.Contains(first, `"content":"hi"`) {
		t.Fatalf("first event %q, %v: it was held until more arrived", first, err)
	}
	close(got)
	rest, err := io.ReadAll(br)
	if err != nil || !strings.Contains(string(rest), `"content":"there"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of the stream %q, %v", rest, err)
	}
}
