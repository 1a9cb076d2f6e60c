package sim_test

import (
	"fmt"
	"time"

	"github.com/meridian-router/meridian/sim"
)

// Two pods on virtual time: the same request is slower on an A10G than on
// an H100, and a repeated prompt prefix is served from the prefix cache.
func ExampleEngine() {
	e := sim.NewEngine(1)
	h100, _ := sim.LookupProfile("h100")
	a10g, _ := sim.LookupProfile("a10g")
	fast, _ := e.AddPod(sim.PodConfig{Name: "fast", Profile: h100})
	slow, _ := e.AddPod(sim.PodConfig{Name: "slow", Profile: a10g})

	report := func(o sim.Outcome) {
		fmt.Printf("%s on %s: TTFT %v, cached %d tokens\n",
			o.Request.ID, o.Pod, o.TTFT().Round(time.Millisecond), o.CachedTokens)
	}
	prompt := func(id string) *sim.Request {
		return &sim.Request{ID: id, PromptTokens: 2048, OutputTokens: 50,
			PrefixHashes: []uint64{7, 8, 9, 10}, HashBlockTokens: 512}
	}
	e.Submit(fast, prompt("a"), report)
	e.Submit(slow, prompt("b"), report)
	e.At(10*time.Second, func() { e.Submit(fast, prompt("c"), report) })
	e.Run()
	// Output:
	// a on fast: TTFT 70ms, cached 0 tokens
	// b on slow: TTFT 778ms, cached 0 tokens
	// c on fast: TTFT 19ms, cached 1536 tokens
}
