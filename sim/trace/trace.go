// Package trace reads public LLM request traces one record at a time: the
// Mooncake JSONL format (arrival time, token counts and one hash id per
// 512-token prefix block) and the Azure LLM inference CSV format (arrival
// time and token counts only).
//
// Readers stream: they hold one line at a time, so a trace of any length
// can be replayed. They reject malformed input with an error naming the
// line and the field. They decide nothing about what a record costs or
// where it goes; the simulator and the replay tool do that.
package trace

import (
	"bufio"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MooncakeBlockTokens is the number of prompt tokens each Mooncake hash id
// covers.
const MooncakeBlockTokens = 512

// Record is one request of a trace.
type Record struct {
	// Line is the 1-based line of the record in its file.
	Line int
	// Arrival is the time since the trace's first record (Azure) or the
	// trace's own zero (Mooncake timestamps are already relative).
	Arrival time.Duration
	// InputTokens and OutputTokens are the prompt and generated lengths.
	InputTokens, OutputTokens int
	// HashIDs identify prompt prefix blocks of MooncakeBlockTokens tokens;
	// equal ids mean an identical prefix up to that block. Empty for Azure.
	HashIDs []uint64
}

// Reader yields records in file order. Next returns io.EOF after the last
// record, and a *LineError for malformed input.
type Reader interface {
	Next() (Record, error)
}

// LineError is a malformed record.
type LineError struct {
	Line  int
	Field string // "" when the line as a whole is bad
	Err   error
}

func (e *LineError) Error() string {
	if e.Field == "" {
		return fmt.Sprintf("trace: line %d: %v", e.Line, e.Err)
	}
	return fmt.Sprintf("trace: line %d: field %q: %v", e.Line, e.Field, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// Mooncake reads the Mooncake trace format: one JSON object per line with
// timestamp (ms), input_length, output_length and hash_ids.
type Mooncake struct {
	sc   *bufio.Scanner
	line int
}

// NewMooncake returns a reader of Mooncake JSONL from r.
func NewMooncake(r io.Reader) *Mooncake {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	return &Mooncake{sc: sc}
}

type mooncakeLine struct {
	Timestamp    *json.Number `json:"timestamp"`
	InputLength  *int         `json:"input_length"`
	OutputLength *int         `json:"output_length"`
	HashIDs      *[]int64     `json:"hash_ids"`
}

// Next returns the next record. Blank lines are skipped.
func (m *Mooncake) Next() (Record, error) {
	for m.sc.Scan() {
		m.line++
		b := m.sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		return m.parse(b)
	}
	if err := m.sc.Err(); err != nil {
		return Record{}, &LineError{Line: m.line + 1, Err: err}
	}
	return Record{}, io.EOF
}

func (m *Mooncake) parse(b []byte) (Record, error) {
	var l mooncakeLine
	if err := json.Unmarshal(b, &l); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Record{}, &LineError{Line: m.line, Field: te.Field, Err: fmt.Errorf("want %v, got JSON %s", te.Type, te.Value)}
		}
		return Record{}, &LineError{Line: m.line, Err: err}
	}
	switch {
	case l.Timestamp == nil:
		return Record{}, &LineError{Line: m.line, Field: "timestamp", Err: errors.New("missing")}
	case l.InputLength == nil:
		return Record{}, &LineError{Line: m.line, Field: "input_length", Err: errors.New("missing")}
	case l.OutputLength == nil:
		return Record{}, &LineError{Line: m.line, Field: "output_length", Err: errors.New("missing")}
	case l.HashIDs == nil:
		return Record{}, &LineError{Line: m.line, Field: "hash_ids", Err: errors.New("missing")}
	}
	ms, err := l.Timestamp.Float64()
	if err != nil || ms < 0 {
		return Record{}, &LineError{Line: m.line, Field: "timestamp", Err: fmt.Errorf("want a non-negative number of milliseconds, got %s", l.Timestamp.String())}
	}
	if *l.InputLength < 1 {
		return Record{}, &LineError{Line: m.line, Field: "input_length", Err: fmt.Errorf("want at least 1, got %d", *l.InputLength)}
	}
	if *l.OutputLength < 1 {
		return Record{}, &LineError{Line: m.line, Field: "output_length", Err: fmt.Errorf("want at least 1, got %d", *l.OutputLength)}
	}
	ids := make([]uint64, len(*l.HashIDs))
	for i, id := range *l.HashIDs {
		if id < 0 {
			return Record{}, &LineError{Line: m.line, Field: fmt.Sprintf("hash_ids[%d]", i), Err: fmt.Errorf("negative id %d", id)}
		}
		ids[i] = uint64(id)
	}
	if max := (*l.InputLength + MooncakeBlockTokens - 1) / MooncakeBlockTokens; len(ids) > max {
		return Record{}, &LineError{Line: m.line, Field: "hash_ids", Err: fmt.Errorf("%d ids for %d input tokens (at most %d blocks of %d)", len(ids), *l.InputLength, max, MooncakeBlockTokens)}
	}
	return Record{
		Line:         m.line,
		Arrival:      time.Duration(ms * float64(time.Millisecond)),
		InputTokens:  *l.InputLength,
		OutputTokens: *l.OutputLength,
		HashIDs:      ids,
	}, nil
}

// AzureTimeLayout is the layout of the Azure trace's TIMESTAMP column.
const AzureTimeLayout = "2006-01-02 15:04:05.0000000"

// Azure reads the Azure LLM inference trace CSV: a header naming
// TIMESTAMP, ContextTokens and GeneratedTokens (in any order), then one
// request per line. Arrivals are relative to the first record.
type Azure struct {
	r                 *csv.Reader
	ts, ctx, gen      int
	first             time.Time
	started, readHead bool
}

// NewAzure returns a reader of Azure CSV from r.
func NewAzure(r io.Reader) *Azure {
	c := csv.NewReader(r)
	c.ReuseRecord = true
	return &Azure{r: c}
}

func (a *Azure) header() error {
	a.readHead = true
	h, err := a.r.Read()
	if err == io.EOF {
		return &LineError{Line: 1, Err: errors.New("empty file: want a header TIMESTAMP,ContextTokens,GeneratedTokens")}
	}
	if err != nil {
		return a.csvError(err)
	}
	a.ts, a.ctx, a.gen = -1, -1, -1
	for i, name := range h {
		switch strings.TrimSpace(strings.TrimPrefix(name, "\ufeff")) {
		case "TIMESTAMP":
			a.ts = i
		case "ContextTokens":
			a.ctx = i
		case "GeneratedTokens":
			a.gen = i
		}
	}
	for _, c := range []struct {
		idx  int
		name string
	}{{a.ts, "TIMESTAMP"}, {a.ctx, "ContextTokens"}, {a.gen, "GeneratedTokens"}} {
		if c.idx < 0 {
			return &LineError{Line: 1, Field: c.name, Err: errors.New("missing from header")}
		}
	}
	return nil
}

func (a *Azure) csvError(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return &LineError{Line: pe.Line, Err: pe.Err}
	}
	return &LineError{Err: err}
}

// Next returns the next record.
func (a *Azure) Next() (Record, error) {
	if !a.readHead {
		if err := a.header(); err != nil {
			return Record{}, err
		}
	}
	row, err := a.r.Read()
	if err == io.EOF {
		return Record{}, io.EOF
	}
	if err != nil {
		return Record{}, a.csvError(err)
	}
	line, _ := a.r.FieldPos(0)
	t, err := time.Parse(AzureTimeLayout, strings.TrimSpace(row[a.ts]))
	if err != nil {
		return Record{}, &LineError{Line: line, Field: "TIMESTAMP", Err: fmt.Errorf("want layout %q: %w", AzureTimeLayout, err)}
	}
	in, err := strconv.Atoi(strings.TrimSpace(row[a.ctx]))
	if err != nil || in < 1 {
		return Record{}, &LineError{Line: line, Field: "ContextTokens", Err: fmt.Errorf("want a positive integer, got %q", row[a.ctx])}
	}
	out, err := strconv.Atoi(strings.TrimSpace(row[a.gen]))
	if err != nil || out < 1 {
		return Record{}, &LineError{Line: line, Field: "GeneratedTokens", Err: fmt.Errorf("want a positive integer, got %q", row[a.gen])}
	}
	if !a.started {
		a.first, a.started = t, true
	}
	if t.Before(a.first) {
		return Record{}, &LineError{Line: line, Field: "TIMESTAMP", Err: fmt.Errorf("%s is before the first record's %s", t.Format(AzureTimeLayout), a.first.Format(AzureTimeLayout))}
	}
	return Record{Line: line, Arrival: t.Sub(a.first), InputTokens: in, OutputTokens: out}, nil
}

// Jitter spreads records that share a quantised arrival time uniformly
// over their bucket, so a replay does not see every bucket as one burst.
// Records with equal Arrival form a group; each gets Arrival + U[0, w)
// where w is Bucket or the gap to the next group, whichever is smaller, so
// the output stays in arrival order. It holds one group in memory at a
// time. The same seed gives the same times.
type Jitter struct {
	src    Reader
	bucket time.Duration
	rng    *rand.Rand

	group []Record
	next  *Record // first record of the following group
	err   error   // deferred error from src
	out   int
}

// NewJitter wraps src. A bucket of 0 or less passes records through.
func NewJitter(src Reader, bucket time.Duration, seed uint64) *Jitter {
	return &Jitter{src: src, bucket: bucket, rng: rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))}
}

// Next returns the next record in (jittered) arrival order.
func (j *Jitter) Next() (Record, error) {
	if j.bucket <= 0 {
		return j.src.Next()
	}
	if j.out < len(j.group) {
		j.out++
		return j.group[j.out-1], nil
	}
	if j.err != nil {
		return Record{}, j.err
	}
	if err := j.fill(); err != nil && len(j.group) == 0 {
		return Record{}, err
	}
	j.out = 1
	return j.group[0], nil
}

// fill reads the next group of equal arrivals and jitters it.
func (j *Jitter) fill() error {
	j.group = j.group[:0]
	if j.next != nil {
		j.group = append(j.group, *j.next)
		j.next = nil
	} else {
		r, err := j.src.Next()
		if err != nil {
			j.err = err
			return err
		}
		j.group = append(j.group, r)
	}
	start := j.group[0].Arrival
	width := j.bucket
	for {
		r, err := j.src.Next()
		if err != nil {
			j.err = err
			break
		}
		if r.Arrival == start {
			j.group = append(j.group, r)
			continue
		}
		if gap := r.Arrival - start; gap > 0 && gap < width {
			width = gap
		}
		j.next = &r
		break
	}
	for i := range j.group {
		j.group[i].Arrival = start + time.Duration(j.rng.Int64N(int64(width)))
	}
	sort.SliceStable(j.group, func(a, b int) bool { return j.group[a].Arrival < j.group[b].Arrival })
	return nil
}
