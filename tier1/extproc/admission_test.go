package extproc_test

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/sim"
)

// At a saturated pool the picker answers a Sheddable request (GIE's
// negative priority) with an immediate 429 and Retry-After, and holds a
// Standard one, choosing no endpoint, until the pool has room again.
func TestAdmissionAtSaturation(t *testing.T) {
	p := newPlatform(t, nil, 50)
	pods := p.pods["chat"]
	// Saturate the chat pool: its pods stop making progress and five
	// requests sent to each straight (not through the picker) wait there.
	for _, lp := range pods {
		if err := lp.SetFaults(sim.Faults{Hang: true}); err != nil {
			t.Fatal(err)
		}
	}
	var direct sync.WaitGroup
	for _, lp := range pods {
		for range 5 {
			direct.Add(1)
			go func() {
				defer direct.Done()
				resp, err := p.http.Post("http://"+lp.Addr()+"/v1/chat/completions", "application/json", bytes.NewReader(chat("chat-model", "hold", false)))
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
	}
	recovered := false
	defer func() {
		if !recovered {
			for _, lp := range pods {
				lp.SetFaults(sim.Faults{})
			}
		}
		direct.Wait()
	}()
	gate := p.gw.Gate("chat")
	testkit.Eventually(t, "the chat pool scraped as saturated", func() bool {
		for _, lp := range pods {
			if m := p.endpoint(lp.Addr()).Metrics(); m == nil || m.Waiting < 5 {
				return false
			}
		}
		// One more observation after the scrapes landed.
		p.gw.ObservePools()
		return true
	})

	pk := p.request(t, t.Context(), call{header: map[string]string{"x-gateway-inference-objective": "-1"}, body: chat("chat-model", "later", false)})
	if pk.immediate == nil || pk.immediate.GetStatus().GetCode() != http.StatusTooManyRequests {
		t.Fatalf("Sheddable at a saturated pool: immediate %v, destination %q; want 429", pk.immediate, pk.dest)
	}
	retry := ""
	for _, h := range pk.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if n, err := strconv.Atoi(retry); err != nil || n < 1 {
		t.Errorf("Retry-After %q; want whole seconds ≥ 1", retry)
	}
	if _, code, _ := errorBody(t, pk.immediate); code != "shed" {
		t.Errorf("error code %q, want shed", code)
	}

	// A Standard request waits in the Gate; the pods recover once it is
	// there, and only then is its endpoint chosen.
	go func() {
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for gate.Len() == 0 {
			<-tick.C
		}
		for _, lp := range pods {
			lp.SetFaults(sim.Faults{})
		}
	}()
	pk = p.request(t, t.Context(), call{body: chat("chat-model", "standard", false)})
	recovered = true
	if pk.immediate != nil || pk.dest == "" {
		t.Fatalf("Standard request: immediate %v, destination %q; want routed once the pool recovered", pk.immediate, pk.dest)
	}
	if code, out := p.respond(t, pk, "", nil, pk.primary(), ""); code != 200 {
		t.Fatalf("pod answered %d: %s", code, out)
	}
	direct.Wait()
	testkit.Eventually(t, "nothing in flight", func() bool { return p.inFlight() == 0 })
}
