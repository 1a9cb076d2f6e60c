package tier1

import (
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/request"
)

// TestExamplePlatformSchedulers builds the schedulers of the example
// platform's us-east-1a gateway (deploy/examples/platform) exactly as the
// data plane does, feeds them endpoint states, and checks their picks.
func TestExamplePlatformSchedulers(t *testing.T) {
	snap, err := config.LoadDir("../deploy/examples/platform")
	if err != nil {
		t.Fatalf("LoadDir: %v", err)
	}
	gw := snap.Gateway("us-east-1a")
	if gw == nil {
		t.Fatal("no gateway for cluster us-east-1a")
	}
	pools := map[string]*Pool{}
	scheds, err := Schedulers(snap, gw, func(name string) *Pool {
		pools[name] = NewPool()
		return pools[name]
	}, Options{Rand: seeded(3)})
	if err != nil {
		t.Fatalf("Schedulers: %v", err)
	}
	if len(scheds) != len(gw.Spec.Schedulers) {
		t.Fatalf("%d schedulers, want %d", len(scheds), len(gw.Spec.Schedulers))
	}
	// Each pool gets the example's static endpoints its selector picks.
	byModel := map[string][]*Endpoint{}
	for _, sc := range gw.Spec.Schedulers {
		s := scheds[sc.ModelName]
		for _, se := range snap.Endpoints(gw.Spec.Cluster, sc.ModelSelector.MatchLabels) {
			byModel[sc.ModelName] = append(byModel[sc.ModelName], s.Pool().Add(se.Name, se.Address))
		}
		if len(byModel[sc.ModelName]) < 2 {
			t.Fatalf("scheduler %s: %d endpoints in the example, want at least 2", sc.Name, len(byModel[sc.ModelName]))
		}
	}
	scrape := func(ep *Endpoint, m Metrics) {
		m.ScrapedAt = t0
		ep.SetMetrics(&m)
	}
	pick := func(model string, req *Request, body *request.Body) *Endpoint {
		t.Helper()
		s := scheds[model]
		req.Model = model
		if body != nil {
			s.Prepare(req, body)
		}
		got, err := s.Schedule(req, t0, nil)
		if err != nil {
			t.Fatalf("%s: %v", model, err)
		}
		return got[0]
	}
	chat := func(model, system, user string) *request.Body {
		b, err := request.Parse([]byte(`{"model":"`+model+`","messages":[{"role":"system","content":"`+system+
			`"},{"role":"user","content":"`+user+`"}]}`), 0)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}

	t.Run("support-agent follows its cached prefix until that pod is loaded", func(t *testing.T) {
		const model = "support-agent-v3"
		eps, s := byModel[model], scheds[model]
		for _, ep := range eps {
			scrape(ep, Metrics{Waiting: 1, Running: 10, KVCacheUsage: 0.4})
		}
		system := strings.Repeat("You are the support agent for Example Corp. Follow the policy. ", 40)
		first := &Request{Model: model}
		s.Prepare(first, chat(model, system, "my order is late"))
		s.Dispatch(eps[1], first, t0.Add(-time.Second))
		scrape(eps[1], Metrics{Waiting: 1, Running: 10, KVCacheUsage: 0.4})
		for range 10 { // ties would break at random
			if got := pick(model, &Request{}, chat(model, system, "I want a refund")); got != eps[1] {
				t.Fatalf("picked %s, want %s which has the system prompt cached", got.ID, eps[1].ID)
			}
		}
		scrape(eps[1], Metrics{Waiting: 12, Running: 60, KVCacheUsage: 0.9})
		if got := pick(model, &Request{}, chat(model, system, "I want a refund")); got != eps[0] {
			t.Fatalf("picked %s with 12 waiting, want %s", got.ID, eps[0].ID)
		}
	})

	t.Run("doc-summarizer goes where the KV cache is free", func(t *testing.T) {
		const model = "summarizer-long"
		eps := byModel[model]
		scrape(eps[0], Metrics{Waiting: 0, Running: 4, KVCacheUsage: 0.92})
		scrape(eps[1], Metrics{Waiting: 1, Running: 4, KVCacheUsage: 0.35})
		if got := pick(model, &Request{PromptTokens: 30000}, nil); got != eps[1] {
			t.Fatalf("picked %s, want %s (KV 0.35 vs 0.92)", got.ID, eps[1].ID)
		}
	})

	t.Run("autocomplete prices the slower card", func(t *testing.T) {
		const model = "autocomplete-fast"
		eps, s := byModel[model], scheds[model]
		var h100 *Endpoint
		for _, ep := range eps {
			if strings.Contains(ep.ID, "h100") {
				h100 = ep
			}
		}
		// Same load everywhere; the A10Gs have shown TTFTs 4× the H100's.
		for i := range 200 {
			for _, ep := range eps {
				scrape(ep, Metrics{Waiting: 1, Running: 6})
				tk := s.Dispatch(ep, &Request{Model: model, PromptTokens: 300 + i%5*100}, t0)
				ttft := 40 * time.Millisecond
				if ep != h100 {
					ttft *= 4
				}
				tk.FirstToken(ttft)
				tk.Done()
			}
		}
		for _, ep := range eps {
			scrape(ep, Metrics{Waiting: 1, Running: 6})
		}
		if got := pick(model, &Request{PromptTokens: 400}, nil); got != h100 {
			t.Fatalf("picked %s, want the H100 %s", got.ID, h100.ID)
		}
		// A queue on the H100 outweighs its speed.
		scrape(h100, Metrics{Waiting: 10, Running: 30})
		if got := pick(model, &Request{PromptTokens: 400}, nil); got == h100 {
			t.Fatalf("picked the H100 with 10 waiting")
		}
	})

	t.Run("claims (EndpointPickerConfig) prefers the pod running the adapter", func(t *testing.T) {
		const model = "claims-base-llama-8b"
		eps, s := byModel[model], scheds[model]
		if p := s.Policy(); p.Weights.LoraAffinity != 3 || p.Weights.Queue != 2 {
			t.Fatalf("claims policy weights %+v, want those of claims-epp (lora 3, queue 2)", p.Weights)
		}
		scrape(eps[0], Metrics{Waiting: 1, Running: 8, KVCacheUsage: 0.3, MaxLoRA: 2, LoRAReported: true,
			RunningAdapters: []string{"claims-triage-home", "claims-fraud-notes"}})
		scrape(eps[1], Metrics{Waiting: 1, Running: 8, KVCacheUsage: 0.3, MaxLoRA: 2, LoRAReported: true,
			RunningAdapters: []string{"claims-triage-auto"}})
		for range 10 {
			if got := pick(model, &Request{Adapter: "claims-triage-auto"}, nil); got != eps[1] {
				t.Fatalf("picked %s, want %s which runs claims-triage-auto", got.ID, eps[1].ID)
			}
			if got := pick(model, &Request{Adapter: "claims-fraud-notes"}, nil); got != eps[0] {
				t.Fatalf("picked %s, want %s which runs claims-fraud-notes", got.ID, eps[0].ID)
			}
		}
	})
}
