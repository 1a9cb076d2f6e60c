package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/tier1/hygiene"
)

// hygienePrompt is the static part of the test tenants' system prompt:
// about 4 KB that never changes.
func hygienePrompt() string {
	var b strings.Builder
	for i := 0; b.Len() < 4000; i++ {
		fmt.Fprintf(&b, "Policy %d: answer politely, cite the section, never invent order numbers. ", i)
	}
	return b.String()
}

// reorderedTool is a tool schema whose keys a client library emits in a
// different order on each call. No order repeats within 90 calls: the
// first key changes on every call, and the pair of the first two keys is
// new each time, so every prompt diverges from the earlier ones within
// its first two keys (a cyclic rotation would repeat every 10 calls, and
// a Tier-1 that saw calls i and i+10 but few in between would find a
// match).
func reorderedTool(call int) string {
	kv := []string{`"name":"lookup_order"`, `"description":"Find an order by number; return status and items."`,
		`"strict":true`, `"type":"function"`, `"parameters":{"type":"object","properties":{"order":{"type":"string"}}}`,
		`"required":["order"]`, `"owner":"orders-team"`, `"version":"2024-06-01"`, `"timeout":30`, `"idempotent":true`}
	n := len(kv)
	first, second := call%n, (call%n+1+(call/n)%(n-1))%n
	order := []int{first, second}
	for i := range n {
		if k := (first + i) % n; k != first && k != second {
			order = append(order, k)
		}
	}
	var b strings.Builder
	b.WriteString("Tools:\n{")
	for i, k := range order {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kv[k])
	}
	b.WriteString("}\n")
	return b.String()
}

// TestDiagnosePromptsEndToEnd sends three tenants' prompts through the
// local platform, for two models, and reads the ranking back with
// `meridian diagnose prompts` from the Tier-1s' metrics listeners: A's
// system prompt starts with a fresh timestamp, B's ends with it, C's
// starts with a tool schema whose keys are reordered on each call.
func TestDiagnosePromptsEndToEnd(t *testing.T) {
	p := platformtest.Start(t, nil)
	ctx := context.Background()
	static := hygienePrompt()
	system := map[string]func(i int) string{
		"prompt-a": func(int) string { return "Current time: " + time.Now().Format(time.RFC3339Nano) + "\n" + static },
		"prompt-b": func(int) string { return static + "\nCurrent time: " + time.Now().Format(time.RFC3339Nano) },
		"prompt-c": func(i int) string { return reorderedTool(i) + static },
	}
	models := []string{"chat-v1", "fast"} // chat-v1 is served by use1 only, fast by both clusters
	const perTenantAndModel = 40
	seen := map[string]bool{}
	for i := range perTenantAndModel {
		if tool := reorderedTool(i); seen[tool] {
			t.Fatalf("reorderedTool(%d) repeats an earlier order: C's prompts would hit the cache", i)
		} else {
			seen[tool] = true
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(system)*len(models))
	// A request Tier-2 refuses because no cluster is healthy for the model
	// never reached a Tier-1, so its sketch did not see it; on a loaded
	// machine under -race a pool's digest can briefly go stale (chat-v1 has
	// one pod), and such a request is sent again, as a client would, for
	// at most 2 minutes. Anything else fails the test.
	var resent atomic.Int64
	send := func(c openai.Client, params openai.ChatCompletionNewParams) error {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			_, err := c.Chat.Completions.New(ctx, params)
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) {
				return err
			}
			if apiErr.StatusCode != http.StatusServiceUnavailable || !strings.Contains(apiErr.RawJSON(), `"no_cluster"`) || time.Now().After(deadline) {
				return fmt.Errorf("%w: %s", err, apiErr.RawJSON())
			}
			resent.Add(1)
			time.Sleep(100 * time.Millisecond) // backoff before resending, not synchronisation
		}
	}
	for tenant, sys := range system {
		c := platformtest.Client(p, "us-east-1", platformtest.Token(t, p, tenant))
		for _, model := range models {
			wg.Go(func() {
				for i := range perTenantAndModel {
					err := send(c, openai.ChatCompletionNewParams{Model: model, MaxTokens: openai.Int(2),
						Messages: []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(sys(i)), openai.UserMessage("Where is my order?")}})
					if err != nil {
						errs <- fmt.Errorf("%s %s request %d: %w", tenant, model, i, err)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := resent.Load(); n > 0 {
		t.Logf("%d requests resent after a 503 no_cluster (a stale digest under load)", n)
	}

	var args []string
	var tier1Metrics []string
	for _, m := range p.Metrics {
		if m.Labels["job"] == "meridian-tier1" {
			args = append(args, "--tier1", m.Addr)
			tier1Metrics = append(tier1Metrics, m.Addr)
		}
	}
	run := func(extra ...string) string {
		t.Helper()
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs(append(append([]string{"diagnose", "prompts"}, args...), extra...))
		if err := root.ExecuteContext(ctx); err != nil {
			t.Fatalf("diagnose prompts %v: %v", extra, err)
		}
		return out.String()
	}
	var rep hygiene.Report
	if err := json.Unmarshal([]byte(run("--json")), &rep); err != nil {
		t.Fatal(err)
	}
	rank := map[string]int{}
	for i, e := range rep.Entries {
		if _, ok := system[e.Tenant]; !ok {
			continue
		}
		rank[e.Tenant+"/"+e.Model] = i
		t.Logf("%+v", e)
		if e.Requests != perTenantAndModel {
			t.Errorf("%s/%s: %d requests, want %d", e.Tenant, e.Model, e.Requests, perTenantAndModel)
		}
		switch e.Tenant {
		case "prompt-a", "prompt-c":
			if !e.Breaking() || e.DivergenceOffset != 0 {
				t.Errorf("%s/%s: %+v, want breaking at block 0", e.Tenant, e.Model, e)
			}
			if 10*e.LostTokens <= 9*e.SharedTokens || e.LostPrefillSeconds <= 0 {
				t.Errorf("%s/%s: lost %d of %d shared tokens (%.3fs), want > 90%%", e.Tenant, e.Model, e.LostTokens, e.SharedTokens, e.LostPrefillSeconds)
			}
		case "prompt-b":
			if e.Breaking() || e.EarlyDivergences != 0 || e.SharedTokens == 0 {
				t.Errorf("%s/%s: %+v, want healthy", e.Tenant, e.Model, e)
			}
		}
	}
	if len(rank) != len(system)*len(models) {
		t.Fatalf("report %+v, want every tenant and model", rep.Entries)
	}
	for _, model := range models {
		for _, bad := range []string{"prompt-a", "prompt-c"} {
			for _, m := range models {
				if rank[bad+"/"+m] > rank["prompt-b/"+model] {
					t.Errorf("%s/%s ranked below prompt-b/%s", bad, m, model)
				}
			}
		}
	}
	stamp := regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`)
	for _, e := range rep.Entries {
		if e.Tenant == "prompt-a" && !stamp.MatchString(e.Sample) {
			t.Errorf("A's sample %q does not show the timestamp", e.Sample)
		}
	}

	// One tenant, as a table.
	text := run("--tenant", "prompt-c")
	if !strings.Contains(text, "prompt-c") || strings.Contains(text, "prompt-a") || !strings.Contains(text, "breaks cache") {
		t.Errorf("table:\n%s", text)
	}

	// The counters are on the same listener.
	resp, err := http.Get("http://" + tier1Metrics[0] + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`meridian_prompt_early_divergence_total{model="chat-v1",tenant="prompt-a"}`,
		`meridian_prompt_lost_prefill_tokens_total{model="chat-v1",tenant="prompt-c"}`} {
		if !bytes.Contains(body, []byte(want)) {
			t.Errorf("no %s in /metrics", want)
		}
	}
	// Other Tier-1 series carry every tenant; the hygiene ones only those
	// that broke the cache.
	for line := range bytes.Lines(body) {
		if bytes.HasPrefix(line, []byte("meridian_prompt_")) && bytes.Contains(line, []byte(`tenant="prompt-b"`)) {
			t.Errorf("a healthy tenant exported: %s", line)
		}
	}
}

func TestDiagnosePromptsNeedsTier1(t *testing.T) {
	root := newRootCmd()
	root.SetOut(io.Discard)
	root.SetArgs([]string{"diagnose", "prompts"})
	err := root.ExecuteContext(context.Background())
	var ee *exitError
	if err == nil || !strings.Contains(err.Error(), "--tier1") || !errors.As(err, &ee) || ee.code != 2 {
		t.Fatalf("err %v", err)
	}
}
