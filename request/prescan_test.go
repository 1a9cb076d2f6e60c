package request

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/internal/testkit"
)

// prescanBodies are bodies whose strings take every path of the prescan:
// plain, every escape, multi-byte UTF-8, the cases it leaves to Parse
// (surrogate pairs, invalid escapes and UTF-8, control characters), long
// keys and strings in fields Parse skips, and bodies Parse refuses.
var prescanBodies = []string{
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("plain text ", 40) + `"}]}`,
	`{"messages":[{"role":"system","content":"a\n\t\r\b\f\/\\\"b\u0041\u00e9\u20ac é€x"},{"role":"user","content":"` + strings.Repeat(`r\u00e9sum\u00e9\n`, 30) + `"}],"model":"m","stream":true}`,
	`{"model":"m","messages":[{"role":"user","content":"a\u00e9\ud83d\ude00b\ud800c` + strings.Repeat("x", 300) + `"}]}`,
	"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\\n\xff\xfe\\u00e9" + strings.Repeat("y", 300) + "\"}]}",
	`{"model":"m","messages":[{"role":"user","content":"a\n\q"}]}`,
	"{\"model\":\"m\",\"prompt\":\"bad \x01 control\"}",
	`{"model":"m","prompt":"` + strings.Repeat("completion ", 50) + `","cache_salt":"salt","max_tokens":7}`,
	`{"` + strings.Repeat("k", 300) + `":"` + strings.Repeat("v", 300) + `","model":"m","prompt":"p"}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"` + strings.Repeat("part ", 80) + `"}]}]}`,
	`{"model":"m","prompt":"unterminated ` + strings.Repeat("z", 300),
	`{"model":"m","prompt":"x"} trailing "` + strings.Repeat("t", 300) + `"`,
	`{"model":"m","prompt":"` + strings.Repeat(`\"`, 200) + `\\"}`,
}

// parsedEqual compares what callers read of two parse results.
func parsedEqual(t *testing.T, what string, got *Body, gotErr error, want *Body, wantErr error) {
	t.Helper()
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		t.Fatalf("%s: error %v, Parse's %v", what, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	type view struct {
		Model, CacheSalt, Prompt string
		Stream                   bool
		Kind                     Kind
		MaxTokens                int
		TokenIDs                 []int64
		Messages                 []Message
	}
	g := view{got.Model, got.CacheSalt, got.Prompt, got.Stream, got.Kind, got.MaxTokens, got.TokenIDs, got.Messages}
	w := view{want.Model, want.CacheSalt, want.Prompt, want.Stream, want.Kind, want.MaxTokens, want.TokenIDs, want.Messages}
	if !reflect.DeepEqual(g, w) {
		t.Fatalf("%s: parsed %+v, Parse's %+v", what, g, w)
	}
}

// fed is ParseScanned after data was fed to a Prescan in chunks cut at cuts
// (increasing offsets), each Feed given everything received so far.
func fed(data []byte, cuts []int, keepMin int) (*Body, error, *Prescan) {
	pre := &Prescan{keepMin: keepMin}
	for _, c := range cuts {
		pre.Feed(data[:c])
	}
	pre.Feed(data)
	b, err := ParseScanned(data, 0, pre)
	return b, err, pre
}

// Cut anywhere, in two or three chunks or byte by byte, a body parses as
// Parse parses it whole.
func TestPrescanMatchesParse(t *testing.T) {
	for i, s := range prescanBodies {
		data := []byte(s)
		want, wantErr := Parse(data, 0)
		for _, keep := range []int{-1, 0} {
			for c := 0; c <= len(data); c++ {
				got, err, _ := fed(data, []int{c}, keep)
				parsedEqual(t, fmt.Sprintf("body %d cut at %d (keep %d)", i, c, keep), got, err, want, wantErr)
			}
			for c := 0; c+7 <= len(data); c += 5 {
				got, err, _ := fed(data, []int{c, c + 7}, keep)
				parsedEqual(t, fmt.Sprintf("body %d cut at %d and %d (keep %d)", i, c, c+7, keep), got, err, want, wantErr)
			}
			var every []int
			for c := range len(data) {
				every = append(every, c)
			}
			got, err, _ := fed(data, every, keep)
			parsedEqual(t, fmt.Sprintf("body %d byte by byte (keep %d)", i, keep), got, err, want, wantErr)
		}
	}
}

// The long strings of a body fed in chunks are decoded once, as they
// arrive: ParseScanned takes every one, and the short ones it decodes
// itself.
func TestPrescanTakesLongStrings(t *testing.T) {
	long := strings.Repeat(`Clause 14.2 applies.\n`, 40)
	data := []byte(`{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"` + long + `"}]}`)
	var cuts []int
	for c := 100; c < len(data); c += 100 {
		cuts = append(cuts, c)
	}
	got, err, pre := fed(data, cuts, 0)
	want, wantErr := Parse(data, 0)
	parsedEqual(t, "chunked", got, err, want, wantErr)
	if len(pre.strs) != 2 || pre.next != 2 {
		t.Fatalf("prescanned %d strings, ParseScanned took %d; want both contents (2) taken", len(pre.strs), pre.next)
	}
	// Reset keeps the buffers for the next body.
	pre.Reset()
	if len(pre.strs) != 0 || pre.pos != 0 || cap(pre.out) == 0 {
		t.Fatalf("Reset left %+v", pre)
	}
	pre.Feed(data)
	again, err := ParseScanned(data, 0, pre)
	parsedEqual(t, "after Reset", again, err, want, wantErr)
}

// FuzzPrescan checks ParseScanned after a Prescan fed in chunks against
// Parse on every body and every cut.
func FuzzPrescan(f *testing.F) {
	for _, s := range prescanBodies {
		f.Add([]byte(s), uint16(len(s)/3), uint8(7))
	}
	f.Fuzz(func(t *testing.T, data []byte, first uint16, step uint8) {
		want, wantErr := Parse(data, 0)
		var cuts []int
		for c := int(first); c < len(data); c += int(step) + 1 {
			cuts = append(cuts, c)
		}
		got, err, _ := fed(data, cuts, -1)
		parsedEqual(t, fmt.Sprintf("cuts %v", cuts), got, err, want, wantErr)
	})
}

// A reused Prescan decodes a long prompt's chunks and ParseScanned takes
// them without allocating beyond Parse's one (the Body): the picker feeds
// every chunk of every long body through one.
func TestPrescanAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items: allocation counts mean nothing under it")
	}
	data := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat(`Clause 14.2 applies.\n`, 10000) + `"}]}`)
	pre := new(Prescan)
	allocs := testkit.AllocsPerRun(20, func() {
		pre.Reset()
		for c := 16 << 10; c < len(data); c += 16 << 10 {
			pre.Feed(data[:c])
		}
		pre.Feed(data)
		b, err := ParseScanned(data, 0, pre)
		if err != nil {
			t.Fatal(err)
		}
		b.Release()
	})
	if allocs > 1 {
		t.Fatalf("Feed and ParseScanned: %v allocations, want 1 (the Body; the buffers are reused)", allocs)
	}
}
