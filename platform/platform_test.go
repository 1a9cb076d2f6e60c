package platform_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform/platformtest"
	"github.com/meridian-router/meridian/sim"
)

func TestPlatformEndToEnd(t *testing.T) {
	t.Parallel() // its own platform on its own ports; mostly waiting on the network
	p := platformtest.Start(t, nil)
	ctx := context.Background()
	us := platformtest.Client(p, "us-east-1", p.Token)

	t.Run("non-streaming", func(t *testing.T) {
		var resp *http.Response
		out, err := us.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&resp))
		if err != nil {
			t.Fatal(err)
		}
		if out.Model != "fast" || len(out.Choices) == 0 || out.Usage.TotalTokens == 0 {
			t.Fatalf("response %+v", out)
		}
		if resp.Header.Get("x-ratelimit-limit-requests") != "" {
			t.Fatal("rate-limit headers for a tenant without limits")
		}
		// Nothing in the answer names the pod: not its address, not its
		// name in the id.
		if !regexp.MustCompile(`^chatcmpl-[0-9a-f]{32}$`).MatchString(out.ID) {
			t.Fatalf("response id %q: want an opaque chatcmpl-<32 hex>", out.ID)
		}
		if v := resp.Header.Get("x-gateway-destination-endpoint-served"); v != "" {
			t.Fatalf("pod address %q shown to the caller", v)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		params := platformtest.Ask("fast")
		params.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		s := us.Chat.Completions.NewStreaming(ctx, params)
		chunks, text := 0, ""
		for s.Next() {
			c := s.Current()
			chunks++
			if len(c.Choices) > 0 {
				text += c.Choices[0].Delta.Content
			}
			if c.Model != "fast" {
				t.Fatalf("chunk model %q", c.Model)
			}
		}
		if err := s.Err(); err != nil || chunks < 3 || text == "" {
			t.Fatalf("stream: %d chunks, text %q, err %v", chunks, text, err)
		}
	})

	t.Run("streaming without usage requested", func(t *testing.T) {
		// Tier-2 asks upstream for usage (token limits settle on real
		// counts) but must not show the caller a chunk it did not ask for.
		s := us.Chat.Completions.NewStreaming(ctx, platformtest.Ask("fast"))
		for s.Next() {
			if c := s.Current(); len(c.Choices) == 0 {
				t.Fatalf("unrequested usage chunk relayed: %+v", c)
			}
		}
		if err := s.Err(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("canary split answers with the public name", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 16 {
			var resp *http.Response
			out, err := us.Chat.Completions.New(ctx, platformtest.Ask("chat"), option.WithResponseInto(&resp),
				option.WithHeader("x-session-id", fmt.Sprint(i)))
			if err != nil {
				t.Fatal(err)
			}
			if out.Model != "chat" {
				t.Fatalf("response model %q, want the public name chat", out.Model)
			}
			seen[resp.Header.Get("x-meridian-cluster")] = true
		}
		// chat-v1 lives in use1 and chat-v2 in euw1: a 50/50 split by
		// tenant is sticky, so one tenant sees one cluster.
		if len(seen) != 1 {
			t.Fatalf("one tenant's requests went to clusters %v; the split must be sticky per tenant", seen)
		}
	})

	t.Run("401 for bad tokens", func(t *testing.T) {
		for _, tok := range []string{"", "not-a-jwt", p.Token[:len(p.Token)-4] + "AAAA"} {
			c := platformtest.Client(p, "us-east-1", tok)
			_, err := c.Chat.Completions.New(ctx, platformtest.Ask("fast"))
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
				t.Fatalf("token %q: err %v, want 401", tok, err)
			}
		}
	})

	t.Run("unknown model 404", func(t *testing.T) {
		_, err := us.Chat.Completions.New(ctx, platformtest.Ask("gpt-nine"))
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
			t.Fatalf("err %v, want 404", err)
		}
	})

	t.Run("rate limit 429 with headers", func(t *testing.T) {
		tok := platformtest.Token(t, p, "tiny")
		c := platformtest.Client(p, "us-east-1", tok)
		var last error
		var resp *http.Response
		for range 4 {
			_, last = c.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&resp))
		}
		var apiErr *openai.Error
		if !errors.As(last, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("4th request of a 2-per-hour tenant: %v, want 429", last)
		}
		h := apiErr.Response.Header
		if h.Get("Retry-After") == "" || h.Get("x-ratelimit-limit-requests") != "2" || h.Get("x-ratelimit-remaining-requests") == "" {
			t.Fatalf("429 headers %v", h)
		}
	})

	// A cluster whose pods answer 5xx stops getting traffic — through Tier-2's
	// retry on the next cluster at once, then the error rate in its health
	// digest or an outlier ejection, whichever comes first — and gets it back
	// once it recovers. (Ejection on its own is covered in regions.)
	t.Run("failing cluster avoided and readmitted", func(t *testing.T) {
		bad := podsNamed(p, "us-fast")
		if len(bad) != 2 {
			t.Fatalf("found %d us-fast pods", len(bad))
		}
		for _, lp := range bad {
			lp.SetFaults(sim.Faults{ErrorRate: 1})
		}
		for i := range 30 {
			var resp *http.Response
			if _, err := us.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&resp)); err != nil {
				t.Fatalf("request %d failed while use1 returned 5xx: %v", i, err)
			}
			if c := resp.Header.Get("x-meridian-cluster"); c != "euw1" {
				t.Fatalf("request %d served by %s while it fails", i, c)
			}
		}
		for _, lp := range bad {
			lp.SetFaults(sim.Faults{})
		}
		testkit.Eventually(t, "use1 readmitted and serving again", func() bool {
			var resp *http.Response
			_, err := us.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&resp))
			return err == nil && resp.Header.Get("x-meridian-cluster") == "use1"
		})
	})

	t.Run("Region failover", func(t *testing.T) {
		// Concurrent traffic while us-east-1's only cluster dies: requests
		// that had not started streaming must not fail.
		var failed, ok atomic.Int64
		var firstErr atomic.Value
		stop := testkit.Loop(4, func(_, _ int) {
			if _, err := us.Chat.Completions.New(ctx, platformtest.Ask("fast")); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
			} else {
				ok.Add(1)
			}
		})
		testkit.Eventually(t, "some traffic before the failure", func() bool { return ok.Load() > 20 })
		if !p.Stop("tier1/use1") {
			t.Fatal("no component tier1/use1")
		}
		before := ok.Load()
		testkit.Eventually(t, "traffic served from eu-west-1", func() bool { return ok.Load() > before+40 })
		stop()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%d requests failed during the failover (first: %v)", n, firstErr.Load())
		}
		var resp *http.Response
		if _, err := us.Chat.Completions.New(ctx, platformtest.Ask("fast"), option.WithResponseInto(&resp)); err != nil {
			t.Fatal(err)
		}
		if got := resp.Header.Get("x-meridian-region"); got != "eu-west-1" {
			t.Fatalf("after the failure served by %q, want eu-west-1", got)
		}
	})
}
