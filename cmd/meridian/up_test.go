package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/platform"
	"github.com/meridian-router/meridian/platform/platformtest"
)

// TestTwoUpsSideBySide starts the embedded example platform twice, one
// after the other, as two `meridian up` would: the second finds every
// configured port taken by the first and moves to free ones. Each answers
// a chat completion on the endpoint it printed, with the token it printed.
func TestTwoUpsSideBySide(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type up struct {
		out  lockedBuffer
		done chan error
	}
	printed := func(u *up, key string) string {
		var v string
		testkit.Eventually(t, "the "+key+" line", func() bool {
			m := regexp.MustCompile(`(?m)^` + key + `: (\S+)$`).FindStringSubmatch(u.out.String())
			if m != nil {
				v = m[1]
			}
			return m != nil
		})
		return v
	}
	start := func() *up {
		u := &up{done: make(chan error, 1)}
		f := upFlags{platform: platform.Config{TimeScale: 50, CrossRegionDelay: time.Millisecond, Tenant: "support-team"}}
		go func() { u.done <- runUp(ctx, f, &u.out, slog.New(slog.DiscardHandler)) }()
		return u
	}
	first := start()
	printed(first, "endpoint") // the first holds the configured ports before the second starts
	second := start()
	defer func() {
		cancel()
		for _, u := range []*up{first, second} {
			if err := <-u.done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("platform stopped with: %v", err)
			}
		}
	}()

	ep1, ep2 := printed(first, "endpoint"), printed(second, "endpoint")
	if ep1 == ep2 {
		t.Fatalf("both platforms print %s", ep1)
	}
	if !strings.Contains(second.out.String(), "moved tier2/") {
		t.Errorf("the second platform did not report a moved Tier-2:\n%s", second.out.String())
	}
	for _, u := range []*up{first, second} {
		ep, tok := printed(u, "endpoint"), printed(u, "token")
		c := openai.NewClient(option.WithBaseURL(ep+"/v1/"), option.WithAPIKey(tok), option.WithMaxRetries(0),
			// One shared transport: each client otherwise builds its own, whose
			// idle connection is never closed (a request a client: a socket
			// pair leaked per request, thousands in TestCanaryEndToEnd).
			option.WithHTTPClient(http.DefaultClient))
		testkit.Eventually(t, ep+" answers", func() bool {
			out, err := c.Chat.Completions.New(ctx, platformtest.Ask("support-agent"))
			return err == nil && len(out.Choices) > 0
		})
	}
}

// lockedBuffer is a bytes.Buffer that a running command writes while the
// test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// up refuses a tenant the configuration does not know (its token would be
// refused with 403) before anything starts, and the sample request it
// prints names a model the printed tenant may call: for claims-team, whose
// Tenant lists its models, the request printed succeeds.
func TestUpTenantAndSampleRequest(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	err := runUp(ctx, upFlags{platform: platform.Config{TimeScale: 50, Ports: platform.PortsAuto, Tenant: "nosuch-team"}}, &lockedBuffer{}, slog.New(slog.DiscardHandler))
	if !errors.Is(err, platform.ErrUsage) || !strings.Contains(err.Error(), `"nosuch-team"`) {
		t.Fatalf("up --tenant nosuch-team: %v, want a usage error naming the tenant", err)
	}

	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- runUp(ctx, upFlags{platform: platform.Config{TimeScale: 50, Ports: platform.PortsAuto, Tenant: "claims-team"}}, &out, slog.New(slog.DiscardHandler))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("platform stopped with: %v", err)
		}
	}()
	var ep, tok, model string
	testkit.Eventually(t, "the sample request", func() bool {
		s := out.String()
		e := regexp.MustCompile(`(?m)^endpoint: (\S+)$`).FindStringSubmatch(s)
		k := regexp.MustCompile(`(?m)^token: (\S+)$`).FindStringSubmatch(s)
		m := regexp.MustCompile(`"model":"([^"]+)"`).FindStringSubmatch(s)
		if e == nil || k == nil || m == nil {
			return false
		}
		ep, tok, model = e[1], k[1], m[1]
		return true
	})
	if !strings.Contains(out.String(), "admin ") {
		t.Errorf("up printed no Tier-2 admin listener:\n%s", out.String())
	}
	req, _ := http.NewRequest(http.MethodPost, ep+"/v1/chat/completions", strings.NewReader(`{"model":"`+model+`","max_tokens":4,"messages":[{"role":"user","content":"Hello!"}]}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the printed sample request for claims-team (model %s): status %d", model, resp.StatusCode)
	}
}
