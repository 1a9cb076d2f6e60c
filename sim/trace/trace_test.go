package trace

import (
	"errors"
	"github.com/meridian-router/meridian/internal/traces"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// sharedTrace opens one of the traces the repository ships in testdata/traces.
func sharedTrace(t testing.TB, name string) *os.File {
	t.Helper()
	f, err := os.Open(traces.Path(name))
	if err != nil {
		t.Fatalf("open trace: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readAll(t *testing.T, r Reader) []Record {
	t.Helper()
	var out []Record
	for {
		rec, err := r.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("record %d: %v", len(out)+1, err)
		}
		out = append(out, rec)
	}
}

func TestMooncakeTrace(t *testing.T) {
	recs := readAll(t, NewMooncake(sharedTrace(t, "conversation_trace.jsonl")))
	if len(recs) != 12031 {
		t.Fatalf("read %d records, want 12031", len(recs))
	}
	first := recs[0]
	if first.Line != 1 || first.Arrival != 0 || first.InputTokens != 6758 || first.OutputTokens != 500 || len(first.HashIDs) != 14 {
		t.Errorf("first record = %+v", first)
	}
	// The published property of this trace: with an infinite cache,
	// 36.64% of block references hit a block seen before.
	seen := make(map[uint64]bool)
	hits, refs := 0, 0
	for _, r := range recs {
		for _, h := range r.HashIDs {
			refs++
			if seen[h] {
				hits++
			}
			seen[h] = true
		}
	}
	if got := 100 * float64(hits) / float64(refs); got < 36.54 || got > 36.74 {
		t.Errorf("infinite-cache block hit ratio = %.2f%%, want 36.64%% ± 0.1", got)
	}
}

func TestAzureTrace(t *testing.T) {
	recs := readAll(t, NewAzure(sharedTrace(t, "AzureLLMInferenceTrace_conv.csv")))
	if len(recs) != 19366 {
		t.Fatalf("read %d records, want 19366", len(recs))
	}
	if r := recs[0]; r.Line != 2 || r.Arrival != 0 || r.InputTokens != 374 || r.OutputTokens != 44 {
		t.Errorf("first record = %+v", r)
	}
	if r := recs[1]; r.Arrival != 4314579*time.Microsecond {
		t.Errorf("second arrival = %v, want 4.314579s", r.Arrival)
	}
	for i := 1; i < len(recs); i++ {
		if recs[i].Arrival < recs[i-1].Arrival {
			t.Fatalf("line %d arrives before line %d", recs[i].Line, recs[i-1].Line)
		}
	}
}

func TestMalformed(t *testing.T) {
	cases := []struct {
		name, in  string
		azure     bool
		line      int
		field     string
		errSubstr string
	}{
		{name: "not json", in: "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [0]}\n{oops\n", line: 2},
		{name: "missing field", in: `{"timestamp": 0, "output_length": 1, "hash_ids": []}`, line: 1, field: "input_length"},
		{name: "wrong type", in: `{"timestamp": 0, "input_length": "x", "output_length": 1, "hash_ids": []}`, line: 1, field: "input_length"},
		{name: "negative id", in: `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [-1]}`, line: 1, field: "hash_ids[0]"},
		{name: "too many ids", in: `{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, 2]}`, line: 1, field: "hash_ids"},
		{name: "zero output", in: "\n" + `{"timestamp": 0, "input_length": 5, "output_length": 0, "hash_ids": []}`, line: 2, field: "output_length"},
		{name: "azure header", azure: true, in: "TIMESTAMP,ContextTokens\r\n", line: 1, field: "GeneratedTokens"},
		{name: "azure time", azure: true, in: "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46,1,1\r\n", line: 2, field: "TIMESTAMP"},
		{name: "azure tokens", azure: true, in: "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,1,1\r\n2023-11-16 18:15:47.6805900,x,1\r\n", line: 3, field: "ContextTokens"},
		{name: "azure columns", azure: true, in: "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,1\r\n", line: 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Reader = NewMooncake(strings.NewReader(c.in))
			if c.azure {
				r = NewAzure(strings.NewReader(c.in))
			}
			var err error
			for err == nil {
				_, err = r.Next()
			}
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("error = %v, want a *LineError", err)
			}
			if le.Line != c.line || le.Field != c.field {
				t.Errorf("error at line %d field %q, want line %d field %q (%v)", le.Line, le.Field, c.line, c.field, err)
			}
		})
	}
}

func TestJitter(t *testing.T) {
	// The first 3,000 lines are plenty and keep the race-enabled run short.
	data, err := io.ReadAll(sharedTrace(t, "conversation_trace.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfterN(string(data), "\n", 3001)
	head := strings.Join(lines[:3000], "")
	run := func(seed uint64) []Record {
		return readAll(t, NewJitter(NewMooncake(strings.NewReader(head)), 3*time.Second, seed))
	}
	a, b, c := run(7), run(7), run(8)
	if len(a) != 3000 {
		t.Fatalf("jittered %d records, want 3000", len(a))
	}
	same, differ := true, false
	distinct := make(map[time.Duration]bool)
	for i := range a {
		if a[i].Arrival != b[i].Arrival || a[i].Line != b[i].Line {
			same = false
		}
		if a[i].Arrival != c[i].Arrival {
			differ = true
		}
		if i > 0 && a[i].Arrival < a[i-1].Arrival {
			t.Fatalf("record %d (line %d) out of order", i, a[i].Line)
		}
		distinct[a[i].Arrival] = true
	}
	if !same {
		t.Error("same seed gave different arrivals")
	}
	if !differ {
		t.Error("different seeds gave identical arrivals")
	}
	// The raw lines have a few hundred distinct arrival times; jitter
	// spreads them.
	if len(distinct) < 2990 {
		t.Errorf("%d distinct arrivals after jitter, want nearly all 3000", len(distinct))
	}
	// Each record stays inside its 3 s bucket.
	raw := readAll(t, NewMooncake(strings.NewReader(head)))
	orig := make(map[int]time.Duration, len(raw))
	for _, r := range raw {
		orig[r.Line] = r.Arrival
	}
	for _, r := range a {
		if d := r.Arrival - orig[r.Line]; d < 0 || d >= 3*time.Second {
			t.Fatalf("line %d moved by %v, outside [0, 3s)", r.Line, d)
		}
	}
}

func TestZipfAdapters(t *testing.T) {
	a, err := NewZipfAdapters(40, 2.3, 1)
	if err != nil {
		t.Fatal(err)
	}
	if s := a.Share(3); s < 0.895 || s > 0.905 {
		t.Errorf("top-3 share %.3f, want 0.90", s)
	}
	names := a.Names()
	if len(names) != 40 || names[0] != "adapter-00" || names[39] != "adapter-39" {
		t.Errorf("names %v", names)
	}
	count := map[string]int{}
	const n = 20000
	for range n {
		count[a.Pick()]++
	}
	top3 := float64(count[names[0]]+count[names[1]]+count[names[2]]) / n
	if top3 < 0.88 || top3 > 0.92 {
		t.Errorf("top 3 drew %.3f of picks", top3)
	}
	b, _ := NewZipfAdapters(40, 2.3, 1)
	a2, _ := NewZipfAdapters(40, 2.3, 1)
	for range 100 {
		if b.Pick() != a2.Pick() {
			t.Fatal("same seed, different picks")
		}
	}
	if _, err := NewZipfAdapters(0, 1, 1); err == nil {
		t.Error("n = 0 accepted")
	}
}
