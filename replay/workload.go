package replay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meridian-router/meridian/sim/trace"
)

// Trace formats.
const (
	FormatMooncake = "mooncake"
	FormatAzure    = "azure"
)

// Workload is a trace held in memory so that it can be replayed many
// times (policies, sweeps, the goodput search) without re-reading it.
// Replays only read it; several may share one concurrently.
type Workload struct {
	// Records are the requests in arrival order.
	Records []trace.Record
	// Adapters holds each record's LoRA adapter ("" for the base model);
	// nil when the workload has none. Always synthetic: see AdapterNote.
	Adapters []string
	// AdapterNames lists the synthetic adapters, most popular first.
	AdapterNames []string
	// AdapterNote describes the synthetic adapter popularity for output;
	// "" when there is none.
	AdapterNote string
}

// LoadOptions choose how a trace becomes a workload.
type LoadOptions struct {
	// Format is FormatMooncake or FormatAzure; "" infers it from the file
	// name (.jsonl Mooncake, .csv Azure).
	Format string
	// Jitter spreads records sharing a quantised arrival time over their
	// bucket (Mooncake's timestamps come in ~3 s steps), seeded by Seed.
	// Without it each bucket arrives as one burst.
	Jitter bool
	// Duration keeps only records arriving within this much of the trace's
	// start, on the trace's own clock (before any rate scaling, so that
	// every rate replays the same requests); 0 keeps all.
	Duration time.Duration
	// Limit keeps at most this many records; 0 keeps all.
	Limit int
	// UniquePrompts drops the Mooncake hash ids, so that every prompt is
	// unique (a "long unique documents" workload from the same lengths and
	// arrivals).
	UniquePrompts bool
	// ZipfAdapters, when positive, gives every request one of this many
	// synthetic LoRA adapters, popularity Zipf with exponent ZipfS (no
	// public trace carries adapter ids). ZipfS 0 means 2.3, which puts
	// 90% of requests on the top 3 of 40.
	ZipfAdapters int
	ZipfS        float64
	// Seed seeds the jitter and the adapter draw.
	Seed uint64
}

// LoadTrace reads a trace file into a workload.
func LoadTrace(path string, o LoadOptions) (*Workload, error) {
	if o.Format == "" {
		switch strings.ToLower(filepath.Ext(path)) {
		case ".jsonl", ".json":
			o.Format = FormatMooncake
		case ".csv":
			o.Format = FormatAzure
		default:
			return nil, fmt.Errorf("replay: %s: cannot tell the trace format from the name; set --format %s or %s", path, FormatMooncake, FormatAzure)
		}
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer f.Close()
	w, err := ReadTrace(f, o)
	if err != nil {
		return nil, fmt.Errorf("replay: %s: %w", path, err)
	}
	return w, nil
}

// ReadTrace reads a trace in o.Format (which must be set) from r. A
// malformed record is an error naming its line and field (*trace.LineError).
func ReadTrace(r io.Reader, o LoadOptions) (*Workload, error) {
	var src trace.Reader
	switch o.Format {
	case FormatMooncake:
		src = trace.NewMooncake(r)
	case FormatAzure:
		src = trace.NewAzure(r)
	default:
		return nil, fmt.Errorf("unknown trace format %q (valid: %s, %s)", o.Format, FormatMooncake, FormatAzure)
	}
	if o.Jitter {
		src = trace.NewJitter(src, 3*time.Second, o.Seed)
	}
	w := &Workload{}
	for o.Limit <= 0 || len(w.Records) < o.Limit {
		rec, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if o.Duration > 0 && rec.Arrival >= o.Duration {
			// Jitter keeps arrival order, so nothing later qualifies.
			break
		}
		if o.UniquePrompts {
			rec.HashIDs = nil
		}
		w.Records = append(w.Records, rec)
	}
	if len(w.Records) == 0 {
		return nil, errors.New("the trace has no records (in the selected duration)")
	}
	if o.ZipfAdapters > 0 {
		s := o.ZipfS
		if s == 0 {
			s = 2.3
		}
		a, err := trace.NewZipfAdapters(o.ZipfAdapters, s, o.Seed)
		if err != nil {
			return nil, err
		}
		w.AdapterNames = a.Names()
		w.Adapters = make([]string, len(w.Records))
		for i := range w.Adapters {
			w.Adapters[i] = a.Pick()
		}
		w.AdapterNote = fmt.Sprintf("LoRA adapters are SYNTHETIC: %d adapters, Zipf s=%g (top 3 carry %.0f%% of requests); no public trace carries adapter ids",
			o.ZipfAdapters, s, 100*a.Share(3))
	}
	return w, nil
}

// Span is the time from the first arrival to the last, on the trace's
// clock.
func (w *Workload) Span() time.Duration {
	return w.Records[len(w.Records)-1].Arrival - w.Records[0].Arrival
}

// OfferedRate is the workload's request rate at a rate scale, in requests
// per second of arrival time.
func (w *Workload) OfferedRate(scale float64) float64 {
	span := w.Span().Seconds()
	if span <= 0 {
		return 0
	}
	return float64(len(w.Records)) / span * scale
}
