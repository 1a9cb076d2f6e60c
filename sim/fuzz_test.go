package sim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// FuzzParse: any request body becomes a model request or a client error,
// never a panic.
func FuzzParse(f *testing.F) {
	f.Add(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`, true)
	f.Add(`{"messages":[{"role":"user","content":[{"type":"text","text":"a"}]},{"role":"assistant","content":null}]}`, true)
	f.Add(`{"prompt":[1,2,3],"max_completion_tokens":1}`, false)
	f.Add(`{"prompt":["x"],"n":2}`, false)
	prof, _ := LookupProfile("a10g")
	lp, err := StartPod(context.Background(), PodSpec{Pod: PodConfig{Name: "f", Profile: prof, Model: "m", Adapters: []string{"a"}}}, 0)
	if err != nil {
		f.Fatal(err)
	}
	defer lp.Close()
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		r := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		req, status, err := lp.parse(httptest.NewRecorder(), r, chat)
		if err != nil {
			if status != http.StatusBadRequest && status != http.StatusNotFound {
				t.Fatalf("status %d for %v", status, err)
			}
			return
		}
		mr := lp.modelRequest(req)
		if mr.PromptTokens < 1 || mr.OutputTokens < 1 {
			t.Fatalf("model request %+v from %q", mr, body)
		}
		lp.mu.Lock()
		err = lp.pod.admissible(&mr)
		lp.mu.Unlock()
		_ = err // may be refused (too long); must not panic
	})
}
