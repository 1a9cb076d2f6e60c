package gateway_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/request"
	"github.com/meridian-router/meridian/tier1/gateway"
	"github.com/meridian-router/meridian/tier1/hygiene"
)

// stampedBodies are chat requests whose 4 KB system prompt starts with a
// different timestamp each.
func stampedBodies(n int) []*request.Body {
	static := strings.Repeat("Answer politely and cite the policy section that applies. ", 70)
	out := make([]*request.Body, n)
	for i := range out {
		out[i] = &request.Body{Model: "chat-model", Kind: request.Chat, Messages: []request.Message{
			{Role: "system", Content: fmt.Sprintf("Now: 2026-12-01T08:%02d:%02d.%06dZ\n", i/60%60, i%60, i) + static},
			{Role: "user", Content: "hello"}}}
	}
	return out
}

func TestDecideFeedsPrompts(t *testing.T) {
	// The sketch reads the scheduler's text and hashes (its default
	// config), or, when they do not cover what it compares, builds the
	// text itself with the scheduler's hashes (a longer head) or without
	// them (another block size).
	for _, cfg := range []hygiene.Config{{}, {MaxBlocks: 512}, {BlockSize: 32}} {
		cfg.Samples = true
		t.Run(fmt.Sprintf("blocks=%dx%d", cfg.BlockSize, cfg.MaxBlocks), func(t *testing.T) { testDecideFeedsPrompts(t, cfg) })
	}
}

func testDecideFeedsPrompts(t *testing.T, cfg hygiene.Config) {
	prompts := hygiene.New(cfg)
	gw, _, _ := newGateway(t, gateway.Config{Prompts: prompts}, "")
	bodies := stampedBodies(5)
	for _, b := range bodies {
		if _, err := gw.Decide(b, gateway.Meta{Header: header("x-meridian-tenant", "acme")}); err != nil {
			t.Fatal(err)
		}
		// Without Tier-2, the fairness id names the tenant.
		if _, err := gw.Decide(b, gateway.Meta{Header: header("x-gateway-inference-fairness-id", "team-9")}); err != nil {
			t.Fatal(err)
		}
	}
	// A refused request is not a prompt the pool served.
	if _, err := gw.Decide(&request.Body{Model: "nope", Kind: request.Chat, Messages: bodies[0].Messages}, gateway.Meta{Header: header("x-meridian-tenant", "acme")}); err == nil {
		t.Fatal("unknown model routed")
	}
	rep := prompts.Report(time.Now(), "", gw.PrefillSeconds)
	if len(rep.Entries) != 2 {
		t.Fatalf("%+v", rep.Entries)
	}
	for _, e := range rep.Entries {
		if e.Model != "chat-model" || e.Requests != 5 || e.EarlyDivergences != 4 || e.DivergenceOffset != 0 || !e.Breaking() {
			t.Errorf("%+v", e)
		}
		if e.LostPrefillSeconds <= 0 || !strings.Contains(e.Sample, "Now: 2026-12-01T08:00:04") {
			t.Errorf("%+v", e)
		}
	}
	if gw.PrefillSeconds("chat-model", 1000) <= 0 || gw.PrefillSeconds("nope", 1000) <= 0 {
		t.Error("no price for prefill")
	}
}

// TestPromptsAddNoAllocations pins the hook's allocations on the decision
// path at zero: Decide allocates the same with and without a sketch.
func TestPromptsAddNoAllocations(t *testing.T) {
	if promptsRaceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts mean nothing under it")
	}
	bodies := stampedBodies(64)
	meta := gateway.Meta{Header: header("x-meridian-tenant", "acme")}
	allocs := func(cfg gateway.Config) float64 {
		gw, _, _ := newGateway(t, cfg, "")
		i := 0
		return testing.AllocsPerRun(500, func() {
			i++
			if _, err := gw.Decide(bodies[i%len(bodies)], meta); err != nil {
				t.Fatal(err)
			}
		})
	}
	off := allocs(gateway.Config{})
	on := allocs(gateway.Config{Prompts: hygiene.New(hygiene.Config{Samples: true})})
	if on != off {
		t.Fatalf("Decide allocates %.1f times with the prompt sketch, %.1f without", on, off)
	}
}

// BenchmarkDecidePrompts is the decision path with and without the
// prompt sketch, on 4 KB chat prompts that all diverge early (the
// costlier case); the difference is the hook's overhead. cpu-ns/op is
// the process's CPU time per decision, steadier than wall time on a
// shared machine.
func BenchmarkDecidePrompts(b *testing.B) {
	bodies := stampedBodies(64)
	meta := gateway.Meta{Header: header("x-meridian-tenant", "acme")}
	snap := testkit.Snapshot(b, 1, testkit.ChatGateway+twoPodsYAML)
	for _, on := range []bool{false, true} {
		name := "off"
		cfg := gateway.Config{Cluster: "c1", Logger: quiet}
		if on {
			name, cfg.Prompts = "on", hygiene.New(hygiene.Config{Samples: true})
		}
		b.Run(name, func(b *testing.B) {
			gw, err := gateway.New(cfg, snap)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			cpu := testkit.StartCPU()
			i := 0
			for b.Loop() {
				i++
				if _, err := gw.Decide(bodies[i%len(bodies)], meta); err != nil {
					b.Fatal(err)
				}
			}
			cpu.Report(b)
		})
	}
}
