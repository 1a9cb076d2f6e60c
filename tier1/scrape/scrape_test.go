package scrape

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/meridian-router/meridian/sim"
	"github.com/meridian-router/meridian/tier1"
)

const vllmText = `# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 7
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.42
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="4",running_lora_adapters="a,b",waiting_lora_adapters=""} 1.7e9
vllm:lora_requests_info{max_lora="4",running_lora_adapters="old",waiting_lora_adapters="x"} 1.6e9
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",num_gpu_blocks="8192"} 1
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{model_name="m"} 120
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="m"} 400
`

func TestParseVariants(t *testing.T) {
	now := time.Unix(100, 0)
	cases := []struct {
		name, text, flavor         string
		waiting, running           int
		kv                         float64
		running0                   string
		maxLoRA, blockSize, blocks int
		prefix                     bool
	}{
		{"vllm", vllmText, "vllm", 3, 7, 0.42, "a", 4, 16, 8192, true},
		{"vllm legacy kv name", "vllm:num_requests_waiting 1\nvllm:num_requests_running 2\nvllm:gpu_cache_usage_perc 0.5\nvllm:prefix_cache_hits 1\nvllm:prefix_cache_queries 2\n", "vllm-legacy", 1, 2, 0.5, "", 0, 0, 0, true},
		{"sglang", "sglang:num_queue_reqs 5\nsglang:num_running_reqs 9\nsglang:token_usage 0.3\n", "sglang", 5, 9, 0.3, "", 0, 0, 0, false},
		{"kv clamped", "vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.7\n", "vllm", 0, 0, 1, "", 0, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, err := Parse(strings.NewReader(tc.text), now)
			if err != nil {
				t.Fatal(err)
			}
			m := s.Metrics
			if s.Flavor != tc.flavor || m.Waiting != tc.waiting || m.Running != tc.running || m.KVCacheUsage != tc.kv {
				t.Errorf("got flavor %q waiting %d running %d kv %v", s.Flavor, m.Waiting, m.Running, m.KVCacheUsage)
			}
			if tc.running0 != "" && (len(m.RunningAdapters) == 0 || m.RunningAdapters[0] != tc.running0 || len(m.WaitingAdapters) != 0) {
				t.Errorf("adapters running %v waiting %v: the newest lora_requests_info series must win", m.RunningAdapters, m.WaitingAdapters)
			}
			if m.MaxLoRA != tc.maxLoRA || m.BlockSize != tc.blockSize || m.GPUBlocks != tc.blocks {
				t.Errorf("max_lora %d block %d blocks %d", m.MaxLoRA, m.BlockSize, m.GPUBlocks)
			}
			if s.HasPrefix != tc.prefix || !m.ScrapedAt.Equal(now) {
				t.Errorf("prefix %v scrapedAt %v", s.HasPrefix, m.ScrapedAt)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	if _, err := Parse(strings.NewReader("up 1\n"), time.Now()); !errors.Is(err, ErrNoMetrics) {
		t.Errorf("non-model-server exposition: err = %v, want ErrNoMetrics", err)
	}
	if _, err := Parse(strings.NewReader("vllm:num_requests_waiting{ 3\n"), time.Now()); err == nil {
		t.Error("malformed exposition parsed")
	}
}

// handlerTransport serves requests from an http.Handler in memory, so the
// scrape loop can run on synctest's fake clock.
type handlerTransport struct{ h http.Handler }

func (ht handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	ht.h.ServeHTTP(rec, r)
	return rec.Result(), nil
}

func TestRunBacksOffAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		failing := true
		var hits []time.Time
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			hits = append(hits, time.Now())
			if failing {
				http.Error(w, "down", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, vllmText)
		})
		var samples, errs atomic.Int64
		ctx, cancel := context.WithCancel(t.Context())
		cfg := Config{Interval: 50 * time.Millisecond, MaxBackoff: time.Second, Client: &http.Client{Transport: handlerTransport{h}}}
		go Run(ctx, cfg, NewMetrics(nil), Target{Pool: "p", URL: "http://pod/metrics",
			OnSample: func(*Sample) { samples.Add(1) }, OnError: func(error) { errs.Add(1) }})

		time.Sleep(10 * time.Second)
		synctest.Wait()
		mu.Lock()
		n := len(hits)
		failing = false
		mu.Unlock()
		// Backing off to at most 1s (with jitter ≥ half): far fewer than the
		// 200 attempts a fixed 50ms interval would make in 10s, and at
		// least one attempt per second once capped.
		if n > 30 || n < 8 {
			t.Fatalf("%d attempts in 10s of failures; want backoff between 8 and 30", n)
		}
		if int(errs.Load()) != n || samples.Load() != 0 {
			t.Fatalf("errors %d samples %d after %d failing attempts", errs.Load(), samples.Load(), n)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if samples.Load() == 0 {
			t.Fatal("no sample after the pod recovered")
		}
		before := samples.Load()
		time.Sleep(time.Second)
		synctest.Wait()
		if got := samples.Load() - before; got < 15 || got > 21 {
			t.Fatalf("%d samples in 1s after recovery, want about 20 (50ms interval)", got)
		}
		cancel()
		synctest.Wait()
	})
}

// ParseModels reads /v1/models as vLLM writes it; here a simulated pod's,
// which follows vLLM's shape (max_model_len on every entry, adapters with
// their parent).
func TestParseModelsFromSimulatedPod(t *testing.T) {
	prof, err := sim.LookupProfile("a10g")
	if err != nil {
		t.Fatal(err)
	}
	pods, err := sim.StartPods(context.Background(), sim.PodSpec{
		Pod: sim.PodConfig{Name: "lora", Profile: prof, Model: "base", Adapters: []string{"claims", "fraud"}}}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pods[0].Close()
	resp, err := http.Get(pods[0].URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	c, err := ParseModels(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := tier1.Capabilities{Models: []string{"base"}, Adapters: []string{"claims", "fraud"}, MaxModelLen: 32768}
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("got %+v, want %+v", *c, want)
	}
}

func TestParseModelsVariants(t *testing.T) {
	cases := []struct {
		name, body string
		want       *tier1.Capabilities
		err        bool
	}{
		{"sglang: names only", `{"object":"list","data":[{"id":"qwen","object":"model"}]}`,
			&tier1.Capabilities{Models: []string{"qwen"}}, false},
		{"two names, smallest context wins", `{"data":[{"id":"a","max_model_len":8192,"parent":null},{"id":"b","max_model_len":4096}]}`,
			&tier1.Capabilities{Models: []string{"a", "b"}, MaxModelLen: 4096}, false},
		{"a root names what was loaded", `{"data":[{"id":"llama","root":"/models/llama-3.1-8b-v2","max_model_len":8192},{"id":"b","root":"b"}]}`,
			&tier1.Capabilities{Models: []string{"llama", "b"}, MaxModelLen: 8192, Roots: []string{"/models/llama-3.1-8b-v2", ""}}, false},
		{"adapter only", `{"data":[{"id":"x","parent":"base"}]}`, nil, true},
		{"not json", `<html>`, nil, true},
		{"empty", `{"data":[]}`, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseModels(strings.NewReader(tc.body))
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if !tc.err && !reflect.DeepEqual(c, tc.want) {
				t.Errorf("got %+v, want %+v", c, tc.want)
			}
		})
	}
}

// Run reads /v1/models with the first good scrape and again every
// ModelsInterval, and keeps the last answer when a read fails.
func TestRunReadsModels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		adapters := `{"id":"a","parent":"base"}`
		modelsUp := true
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if r.URL.Path == "/v1/models" {
				if !modelsUp {
					http.Error(w, "down", http.StatusInternalServerError)
					return
				}
				io.WriteString(w, `{"data":[{"id":"base","max_model_len":4096},`+adapters+`]}`)
				return
			}
			io.WriteString(w, vllmText)
		})
		var got []*tier1.Capabilities
		var gotMu sync.Mutex
		ctx, cancel := context.WithCancel(t.Context())
		cfg := Config{Interval: 50 * time.Millisecond, ModelsInterval: 10 * time.Second, Client: &http.Client{Transport: handlerTransport{h}}}
		go Run(ctx, cfg, nil, Target{Pool: "p", URL: "http://pod/metrics", ModelsURL: "http://pod/v1/models",
			OnCapabilities: func(c *tier1.Capabilities) { gotMu.Lock(); got = append(got, c); gotMu.Unlock() }})
		count := func() int { gotMu.Lock(); defer gotMu.Unlock(); return len(got) }

		time.Sleep(time.Second)
		synctest.Wait()
		if n := count(); n != 1 {
			t.Fatalf("%d reads of /v1/models in the first second, want 1", n)
		}
		mu.Lock()
		adapters = `{"id":"a","parent":"base"},{"id":"b","parent":"base"}`
		mu.Unlock()
		time.Sleep(10 * time.Second)
		synctest.Wait()
		gotMu.Lock()
		last := got[len(got)-1]
		gotMu.Unlock()
		if n := count(); n != 2 || !reflect.DeepEqual(last.Adapters, []string{"a", "b"}) {
			t.Fatalf("after 11s: %d reads, last adapters %v; want 2 reads listing a and b", n, last.Adapters)
		}
		mu.Lock()
		modelsUp = false
		mu.Unlock()
		time.Sleep(30 * time.Second)
		synctest.Wait()
		if n := count(); n != 2 {
			t.Fatalf("a failing /v1/models was reported: %d reads", n)
		}
		cancel()
		synctest.Wait()
	})
}
