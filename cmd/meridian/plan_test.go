package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/internal/traces"
)

// TestPlanCommand runs `meridian plan capacity` end to end on a prefix of
// the Azure trace: JSON on stdout, a fleet file `meridian replay` then
// replays, a plot; and a bad GPU is refused.
func TestPlanCommand(t *testing.T) {
	dir := t.TempDir()
	out, plot := filepath.Join(dir, "planned.yaml"), filepath.Join(dir, "plan.svg")
	root := newRootCmd()
	var stdout bytes.Buffer
	root.SetOut(&stdout)
	root.SetErr(&bytes.Buffer{})
	root.SetArgs([]string{"plan", "capacity", "--trace", traces.Path(traces.Azure), "--limit", "1500",
		"--fleet", "../../deploy/examples/fleets/uniform-h100.yaml", "--slo-ttft-p99", "2s", "--peak-scale", "3",
		"--out", out, "--plot", plot, "--json"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Plan struct {
			Pools []struct {
				GPU   string `json:"gpu"`
				Count int    `json:"count"`
			} `json:"pools"`
			Met bool `json:"meets_slo"`
		} `json:"plan"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
		t.Fatalf("%v:\n%s", err, stdout.String())
	}
	if !doc.Plan.Met || len(doc.Plan.Pools) != 1 || doc.Plan.Pools[0].Count < 1 {
		t.Errorf("plan %+v", doc.Plan)
	}
	if b, err := os.ReadFile(plot); err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Errorf("plot: %v", err)
	}

	replay := newRootCmd()
	stdout.Reset()
	replay.SetOut(&stdout)
	replay.SetArgs([]string{"replay", "--trace", traces.Path(traces.Azure), "--limit", "1500", "--fleet", out,
		"--policy", "meridian", "--rate-scale", "3", "--json"})
	if err := replay.Execute(); err != nil {
		t.Fatalf("meridian replay of the planned fleet: %v", err)
	}

	bad := newRootCmd()
	bad.SetOut(&bytes.Buffer{})
	bad.SetArgs([]string{"plan", "capacity", "--trace", traces.Path(traces.Azure), "--fleet", out,
		"--slo-ttft-p99", "2s", "--gpus", "h100,tpu"})
	if err := bad.Execute(); err == nil || !strings.Contains(err.Error(), `unknown GPU profile "tpu"`) {
		t.Errorf("unknown GPU: %v", err)
	}
}
