package main

import (
	"bytes"
	"encoding/json"
	"github.com/meridian-router/meridian/internal/traces"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplayCommand(t *testing.T) {
	plot := filepath.Join(t.TempDir(), "cdf.svg")
	cmd := newReplayCmd()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs([]string{"--trace", traces.Path(traces.Azure), "--limit", "60",
		"--fleet", "../../deploy/examples/fleets/mixed-h100-a10g.yaml", "--compare", "round-robin,meridian",
		"--weights", "queue=2,kvCache=2,prefix=3,predictedLatency=1", "--json", "--plot", plot})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Results []struct {
			Policy    string `json:"policy"`
			Requests  int    `json:"requests"`
			Completed int    `json:"completed"`
		} `json:"results"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if len(doc.Results) != 2 || doc.Results[0].Policy != "round-robin" || doc.Results[1].Requests != 60 || doc.Results[1].Completed != 60 {
		t.Errorf("results %+v", doc.Results)
	}
	if b, err := os.ReadFile(plot); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}

	cmd = newReplayCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetArgs([]string{"--trace", "x.csv", "--fleet", "f.yaml", "--policy", "least-conn"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), "least-request") {
		t.Errorf("unknown policy: %v", err)
	}
}
