package sim

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// With no arrivals after the decision, the projection is the future: the
// request's first token comes exactly when PredictFirstToken said, on a
// pod mid-step with a queue, a running batch and a warm prefix cache; and
// predicting changes nothing in the pod.
func TestPredictFirstTokenIsExactWithoutLaterArrivals(t *testing.T) {
	reqs, at := loadMooncake(t, 60)
	for _, profile := range []string{"h100", "a10g"} {
		t.Run(profile, func(t *testing.T) {
			e := NewEngine(1)
			pod, err := e.AddPod(PodConfig{Name: profile, Profile: mustProfile(t, profile)})
			if err != nil {
				t.Fatal(err)
			}
			// Squeeze 59 requests into 2 s so that the pod is busy.
			var fits []*Request
			for _, r := range reqs {
				if pod.admissible(r) == nil {
					fits = append(fits, r)
				}
			}
			last := fits[len(fits)-1]
			for i, r := range fits[:len(fits)-1] {
				e.At(at[i]/time.Duration(len(at)), func() { e.Submit(pod, r, func(Outcome) {}) })
			}
			var predicted time.Duration
			var got Outcome
			decide := 2*time.Second + 7*time.Millisecond
			e.At(decide, func() {
				if !pod.stepping || pod.InFlight() == 0 {
					t.Errorf("pod idle at the decision (stepping %v, in flight %d): the test proves nothing", pod.stepping, pod.InFlight())
				}
				before := fmt.Sprintf("%+v", pod.Metrics())
				var err error
				predicted, err = pod.PredictFirstToken(last, 0)
				if err != nil {
					t.Fatalf("PredictFirstToken: %v", err)
				}
				if after := fmt.Sprintf("%+v", pod.Metrics()); after != before {
					t.Errorf("predicting changed the pod:\n%s\n%s", before, after)
				}
				e.Submit(pod, last, func(o Outcome) { got = o })
			})
			e.Run()
			if got.Err != nil || got.FirstToken != predicted {
				t.Errorf("first token at %v (err %v), predicted %v", got.FirstToken, got.Err, predicted)
			}
			if predicted <= decide {
				t.Errorf("predicted %v, not after the decision at %v", predicted, decide)
			}
		})
	}
}

func TestPredictFirstTokenRefusalsAndLimit(t *testing.T) {
	e := NewEngine(1)
	a10g, err := e.AddPod(PodConfig{Name: "a10g", Profile: mustProfile(t, "a10g"), Adapters: []string{"x"}})
	if err != nil {
		t.Fatal(err)
	}
	long := &Request{ID: "long", PromptTokens: 40000, OutputTokens: 10}
	if _, err := a10g.PredictFirstToken(long, 0); !errors.Is(err, ErrContextLength) {
		t.Errorf("40k-token prompt on an A10G: %v, want ErrContextLength", err)
	}
	if _, err := a10g.PredictFirstToken(&Request{PromptTokens: 10, OutputTokens: 1, Adapter: "y"}, 0); !errors.Is(err, ErrUnknownAdapter) {
		t.Errorf("unknown adapter: %v, want ErrUnknownAdapter", err)
	}
	r := &Request{ID: "r", PromptTokens: 30000, OutputTokens: 10}
	at, err := a10g.PredictFirstToken(r, 0)
	if err != nil || at <= 0 {
		t.Fatalf("30k prompt on an idle A10G: %v, %v", at, err)
	}
	if got, err := a10g.PredictFirstToken(r, at/2); !errors.Is(err, ErrBeyondLimit) || got != at/2 {
		t.Errorf("limit %v below the answer %v: %v, %v; want the limit and ErrBeyondLimit", at/2, at, got, err)
	}
	if a10g.InFlight() != 0 {
		t.Errorf("predicting queued a request")
	}
	var free Pod
	if _, err := free.PredictFirstToken(r, 0); !errors.Is(err, ErrInvalidRequest) {
		t.Errorf("pod without an engine: %v", err)
	}
}
