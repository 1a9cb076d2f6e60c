package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/meridian-router/meridian/internal/testkit"
)

// TestTwoUpsSideBySide starts the embedded example platform twice, one
// after the other, as two `meridian up` would: the second finds every
// configured port taken by the first and moves to free ones. Each answers
// a chat completion on the endpoint it printed, with the token it printed.
func TestTwoUpsSideBySide(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type up struct {
		out  bytes.Buffer
		done chan error
	}
	start := func(f upFlags) *up {
		u := &up{done: make(chan error, 1)}
		p, err := startUp(ctx, f, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("up: %v", err)
		}
		printUp(&u.out, f, p)
		go func() { u.done <- p.run(ctx) }()
		return u
	}
	flags := upFlags{timeScale: 50, crossDelay: time.Millisecond, tenant: "support-team"}
	first := start(flags)
	second := start(flags)
	defer func() {
		cancel()
		for _, u := range []*up{first, second} {
			if err := <-u.done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("platform stopped with: %v", err)
			}
		}
	}()

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
	ep1, ep2 := printed(first, "endpoint"), printed(second, "endpoint")
	if ep1 == ep2 {
		t.Fatalf("both platforms print %s", ep1)
	}
	if !strings.Contains(second.out.String(), "moved tier2/") {
		t.Errorf("the second platform did not report a moved Tier-2:\n%s", second.out.String())
	}
	for _, u := range []*up{first, second} {
		ep, tok := printed(u, "endpoint"), printed(u, "token")
		c := openai.NewClient(option.WithBaseURL(ep+"/v1/"), option.WithAPIKey(tok), option.WithMaxRetries(0))
		testkit.Eventually(t, ep+" answers", func() bool {
			out, err := c.Chat.Completions.New(ctx, ask("support-agent"))
			return err == nil && len(out.Choices) > 0
		})
	}
}

// TestPortsAutoMovesEverything checks the plan of --ports auto, and that a
// taken port is moved in the default mode while a free one stays.
func TestPortsAutoMovesEverything(t *testing.T) {
	snap, _, _, err := loadUpConfig(context.Background(), upFlags{ports: portsAuto})
	if err != nil {
		t.Fatal(err)
	}
	want := len(upListeners(snap, ""))
	moves, err := planPorts(snap, "", portsAuto)
	if err != nil {
		t.Fatal(err)
	}
	if len(moves) != want {
		t.Fatalf("--ports auto moved %d of %d listeners", len(moves), want)
	}
	seen := map[string]bool{}
	for _, m := range moves {
		if seen[m.To] {
			t.Fatalf("port %s handed out twice", m.To)
		}
		seen[m.To] = true
	}

	// Default mode: hold the first Region's Tier-2 address; only it moves
	// (unless some other process holds more of the example's ports).
	tier2 := snap.Topology.Spec.Regions[0].Tier2[0]
	l, err := net.Listen("tcp", tier2)
	if err != nil {
		t.Fatalf("the auto-moved address %s should be free: %v", tier2, err)
	}
	defer l.Close()
	moves, err = planPorts(snap, "", portsConfig)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range moves {
		found = found || m.From == tier2
	}
	if !found {
		t.Fatalf("the taken address %s was not moved: %+v", tier2, moves)
	}
	if _, err := planPorts(snap, "", "fixed"); err == nil {
		t.Fatal("--ports fixed accepted")
	}
}
