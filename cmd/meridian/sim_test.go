package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSimCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // start the pods, print them, and return at once
	out := filepath.Join(t.TempDir(), "endpoints.yaml")
	cmd := newSimCmd()
	var stdout bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetArgs([]string{"--profile", "a10g", "--pods", "2", "--port", "0", "--adapters", "x,y", "--labels", "region=r1", "--endpoints-out", out})
	if err := cmd.ExecuteContext(ctx); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "# a10g-0 http://127.0.0.1:") || !strings.Contains(lines[1], `region="r1"`) || !strings.Contains(lines[1], "adapters=x,y") {
		t.Errorf("output:\n%s", stdout.String())
	}
	b, err := os.ReadFile(out)
	if err != nil || !strings.Contains(string(b), "kind: StaticEndpoints") || !strings.Contains(string(b), "name: a10g-1") {
		t.Errorf("endpoints file: %v\n%s", err, b)
	}

	for _, args := range [][]string{
		{"--fleet", "x.yaml", "--pods", "2"},
		{"--profile", "b200"},
		{"--metrics", "tgi"},
	} {
		cmd := newSimCmd()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs(args)
		if err := cmd.ExecuteContext(ctx); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
