package tier2

import (
	"context"
	"encoding/base64"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier2/gossip/faultnet"
)

// --gossip-key-file: Tier-2s that share a key file gossip encrypted;
// rewriting the file in three steps (new key second, first, alone)
// rotates the key across running instances, after which only the new
// key gets in. A bad file changes nothing and is counted.
func TestGossipKeyFileRotation(t *testing.T) {
	docs, errs := config.Decode("t.yaml", []byte(testkit.Topology(testkit.Cluster{Region: "r1", Name: "c1", Tier1: "http://127.0.0.1:1", Health: "127.0.0.1:1"})))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	snap, err := config.Build(docs, 1)
	if err != nil {
		t.Fatal(err)
	}
	k1 := base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))
	k2 := base64.StdEncoding.EncodeToString([]byte("fedcba9876543210"))
	dir := t.TempDir()
	write := func(name string, lines ...string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	netw := faultnet.NewNetwork()
	var join []string
	start := func(name, keyFile string, reg prometheus.Registerer) (*Instance, error) {
		gt, err := netw.Transport(name, "r1")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		in, err := NewInstance(ctx, InstanceConfig{Region: "r1", Name: name, GossipBind: "127.0.0.1:0", GossipJoin: join,
			GossipProfile: "local", GossipTransport: gt, GossipKeyFile: keyFile, InsecureNoAuth: true, Logger: slog.New(slog.DiscardHandler), Registerer: reg}, snap)
		if err != nil {
			cancel()
			return nil, err
		}
		done := make(chan struct{})
		go func() { in.Run(ctx, nil); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		join = append(join, in.Node.Addr())
		return in, nil
	}
	regs := []*prometheus.Registry{prometheus.NewRegistry(), prometheus.NewRegistry()}
	var ins []*Instance
	for i, name := range []string{"a", "b"} {
		in, err := start(name, write(name, k1), regs[i])
		if err != nil {
			t.Fatal(err)
		}
		ins = append(ins, in)
	}
	testkit.Eventually(t, "both instances see each other", func() bool {
		return ins[0].Node.NumMembers() == 2 && ins[1].Node.NumMembers() == 2
	})
	for _, step := range [][]string{{k1, k2}, {"# rotating", k2, k1}, {k2}} {
		for i, name := range []string{"a", "b"} {
			write(name, step...)
			if err := ins[i].ReloadGossipKeys(); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
	}
	if got := testkit.Metric(t, regs[0], "meridian_tier2_gossip_keys", nil); got != 1 {
		t.Errorf("meridian_tier2_gossip_keys = %v, want 1", got)
	}
	if _, err := start("old", write("old", k1), nil); err == nil {
		t.Fatal("an instance with the retired key joined")
	}
	if _, err := start("plain", "", nil); err == nil {
		t.Fatal("an instance without a key joined")
	}
	write("a", "not a key")
	if err := ins[0].ReloadGossipKeys(); err == nil {
		t.Fatal("a bad key file was accepted")
	}
	if got := testkit.Metric(t, regs[0], "meridian_tier2_gossip_key_errors_total", nil); got != 1 {
		t.Errorf("meridian_tier2_gossip_key_errors_total = %v, want 1", got)
	}
	c, err := start("new", write("new", k2), nil)
	if err != nil {
		t.Fatalf("an instance with the new key: %v", err)
	}
	testkit.Eventually(t, "the new instance is a member everywhere", func() bool {
		return c.Node.NumMembers() == 3 && ins[0].Node.NumMembers() == 3 && ins[1].Node.NumMembers() == 3
	})
	if _, err := start("bad", write("bad", "c2hvcnQ="), nil); err == nil || !strings.Contains(err.Error(), "--gossip-key-file") {
		t.Fatalf("a bad key file at start: %v, want an error naming --gossip-key-file", err)
	}
}
