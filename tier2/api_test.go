package tier2

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/meridian-router/meridian/request"
)

// TestEmbeddingsAndResponsesCharged: /v1/embeddings and /v1/responses go
// through the stages to a simulated pod, and the tenant is charged the
// usage each answer reports: an embedding's prompt tokens, a response's
// input and output tokens, whole or streamed (from response.completed).
func TestEmbeddingsAndResponsesCharged(t *testing.T) {
	pod := startSim(t)
	d := newDoor(t, nil, pod.URL())
	tok := d.token(t, "team", nil)
	charge := func(path, body string) (charged float64, resp *http.Response, raw string) {
		t.Helper()
		before := d.charged("team")
		resp = d.post(t, t.Context(), tok, path, body, nil)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%s: %d %v: %s", path, resp.StatusCode, err, b)
		}
		<-d.handled
		return d.charged("team") - before, resp, string(b)
	}

	got, _, raw := charge("/v1/embeddings", `{"model":"chat-model","input":["`+strings.Repeat("abcd", 30)+`","abcd"]}`)
	var emb struct {
		Model string
		Data  []struct{ Embedding []float64 }
		Usage struct {
			PromptTokens float64 `json:"prompt_tokens"`
			TotalTokens  float64 `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(raw), &emb); err != nil || len(emb.Data) != 2 {
		t.Fatalf("embeddings: %v %s", err, raw)
	}
	if got != 31 || emb.Usage.TotalTokens != 31 {
		t.Errorf("embeddings charged %.0f, usage %+v; want 31", got, emb.Usage)
	}

	body := `{"model":"chat-model","instructions":"Be brief.","input":"` + strings.Repeat("hello ", 20) + `","max_output_tokens":6`
	got, _, raw = charge("/v1/responses", body+`}`)
	var res struct {
		Status string
		Usage  struct {
			InputTokens  float64 `json:"input_tokens"`
			OutputTokens float64 `json:"output_tokens"`
			TotalTokens  float64 `json:"total_tokens"`
		}
	}
	if err := json.Unmarshal([]byte(raw), &res); err != nil || res.Status != "completed" || res.Usage.OutputTokens != 6 {
		t.Fatalf("responses: %v %s", err, raw)
	}
	if got != res.Usage.TotalTokens {
		t.Errorf("response charged %.0f, usage %+v", got, res.Usage)
	}

	got, resp, raw := charge("/v1/responses", body+`,"stream":true}`)
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") || !strings.Contains(raw, "event: response.completed\n") {
		t.Fatalf("stream: %s", raw)
	}
	if got != res.Usage.TotalTokens {
		t.Errorf("streamed response charged %.0f, want the whole one's %.0f", got, res.Usage.TotalTokens)
	}
}

// TestResponsesStreamCutCharged: a Response stream cut before
// response.completed is charged its prompt estimate and one token per
// text delta relayed.
func TestResponsesStreamCutCharged(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"usage\":null}}\n\n"))
		for range 5 {
			w.Write([]byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\" x\"}\n\n"))
		}
		// No response.completed: the pod failed.
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	resp := d.post(t, t.Context(), d.token(t, "team", nil), "/v1/responses", `{"model":"chat-model","input":"`+strings.Repeat("abcd", 40)+`","stream":true}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	<-d.handled
	// The input as one user message: (4+160)/4 tokens and 4 of its
	// template; then 5 deltas.
	if got := d.charged("team"); got != 50 {
		t.Errorf("charged %.0f, want 50", got)
	}
}

// TestRequestIDs: every answer carries x-request-id; a caller's valid id
// is kept and reaches Tier-1, an invalid one is replaced; the caller's
// traceparent reaches Tier-1 unchanged when Tier-2 does not trace.
func TestRequestIDs(t *testing.T) {
	var mu sync.Mutex
	var seen []http.Header
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.Header().Set("X-Request-Id", "from-tier1")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"object":"list","data":[],"model":"chat-model","usage":{"prompt_tokens":1,"total_tokens":1}}`))
	}))
	defer up.Close()
	d := newDoor(t, nil, up.URL)
	tok := d.token(t, "team", nil)
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, tc := range []struct {
		name, tok, path, callerID string
		status                    int
		keep                      bool
	}{
		{"served, caller's id", tok, "/v1/embeddings", "caller-id-1", 200, true},
		{"served, invalid id replaced", tok, "/v1/embeddings", "two words", 200, false},
		{"served, no id", tok, "/v1/embeddings", "", 200, false},
		{"refused: no token", "", "/v1/embeddings", "caller-id-2", 401, true},
		{"refused: bad body", tok, "/v1/embeddings", "", 400, false},
		{"unrouted", tok, "/v1/nope", "caller-id-3", 404, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{"Traceparent": tp}
			if tc.callerID != "" {
				hdr["X-Request-Id"] = tc.callerID
			}
			body := `{"model":"chat-model","input":"hello"}`
			if tc.status == 400 {
				body = `{"model":"chat-model"}`
			}
			mu.Lock()
			seen = nil
			mu.Unlock()
			resp := d.post(t, t.Context(), tc.tok, tc.path, body, hdr)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if tc.path != "/v1/nope" {
				<-d.handled
			}
			id := resp.Header.Values("X-Request-Id")
			if resp.StatusCode != tc.status || len(id) != 1 || !request.ValidID(id[0]) || (id[0] == tc.callerID) != tc.keep {
				t.Fatalf("status %d, x-request-id %q (caller's %q)", resp.StatusCode, id, tc.callerID)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.status != 200 {
				if len(seen) != 0 {
					t.Errorf("a refused request reached Tier-1")
				}
				return
			}
			if len(seen) != 1 || seen[0].Get("X-Request-Id") != id[0] || seen[0].Get("Traceparent") != tp {
				t.Errorf("Tier-1 saw %v, want x-request-id %q and the caller's traceparent", seen, id[0])
			}
		})
	}
}
