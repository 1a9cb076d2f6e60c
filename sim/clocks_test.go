package sim

import (
	"context"
	"testing"
	"testing/synctest"
	"time"
)

// TestClocksAgree drives the same requests through a live pod's wall-clock
// driver (on synctest's fake clock, ten times faster than real time) and
// through the virtual engine: both clocks run the same model, so every
// outcome matches in model time, and the live pod takes exactly a tenth of
// it in wall time.
func TestClocksAgree(t *testing.T) {
	prof := mustProfile(t, "l40s")
	cfg := PodConfig{Name: "p", Profile: prof, Adapters: []string{"a"}}
	newReqs := func() []*Request {
		return []*Request{
			{ID: "first", PromptTokens: 3000, OutputTokens: 40, PrefixHashes: []uint64{1, 2, 3, 4, 5}, HashBlockTokens: 512},
			{ID: "second", PromptTokens: 3000, OutputTokens: 30, PrefixHashes: []uint64{1, 2, 3, 4, 5}, HashBlockTokens: 512},
			{ID: "adapter", PromptTokens: 700, OutputTokens: 50, Adapter: "a"},
		}
	}

	// Virtual: the first request arrives alone, the others while its
	// first step runs.
	virtual := make([]Outcome, 3)
	e := NewEngine(0)
	p, err := e.AddPod(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range newReqs() {
		e.Submit(p, r, func(o Outcome) { virtual[i] = o })
	}
	e.Run()

	synctest.Test(t, func(t *testing.T) {
		const scale = 10
		lp, _, err := newLivePod(PodSpec{Pod: cfg, TimeScale: scale})
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(context.Background())
		lp.stop, lp.stopping = stop, ctx.Done()
		lp.start = time.Now()
		go lp.drive(ctx)
		synctest.Wait() // the driver is idle

		var lrs []*liveRequest
		for i, r := range newReqs() {
			lr := &liveRequest{req: *r, notify: make(chan struct{}, 1)}
			if err := lp.submit(lr, false); err != nil {
				t.Fatal(err)
			}
			lrs = append(lrs, lr)
			if i == 0 {
				synctest.Wait() // the first step has begun with the first request alone
			}
		}
		live := make([]Outcome, len(lrs))
		for i, lr := range lrs {
			for {
				<-lr.notify
				if _, done, out := lp.progress(lr); done {
					live[i] = out
					break
				}
			}
		}
		last := time.Duration(0)
		for i, v := range virtual {
			l := live[i]
			if l.Err != nil || v.Err != nil || l.Arrival != v.Arrival || l.FirstToken != v.FirstToken ||
				l.Finish != v.Finish || l.CachedTokens != v.CachedTokens || l.OutputTokens != v.OutputTokens {
				t.Errorf("%s: live %+v\nvirtual %+v", v.Request.ID, l, v)
			}
			last = max(last, v.Finish)
		}
		if got, want := time.Since(lp.start), time.Duration(float64(last)/scale); got != want {
			t.Errorf("live run took %v of wall time, want %v (model %v / %d)", got, want, last, scale)
		}
		stop()
		<-lp.driven
	})
	if virtual[1].CachedTokens == 0 {
		t.Errorf("second request did not hit the prefix cache: %+v", virtual[1])
	}
}
