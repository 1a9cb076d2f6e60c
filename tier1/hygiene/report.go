package hygiene

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
)

// Path is where a Tier-1's metrics listener serves the report
// (Handler): GET, optional ?tenant=.
const Path = "/admin/prompts"

// Report is the ranked list `meridian diagnose prompts` prints.
type Report struct {
	// BlockSize is the characters per block of DivergenceOffset.
	BlockSize int `json:"blockSize"`
	// Window is the sliding window the counts cover, in seconds.
	WindowSeconds float64 `json:"windowSeconds"`
	// Entries are ranked by LostTokens, worst first.
	Entries []Entry `json:"entries"`
}

// Entry is one tenant and model over the window.
type Entry struct {
	Tenant string `json:"tenant"`
	Model  string `json:"model"`
	// Requests are the prompts seen; EarlyDivergences those that shared
	// at least MinSharedBlocks of content with a recent prompt of the
	// same tenant and model yet lost at least half of it to an earlier
	// divergence.
	Requests         uint64 `json:"requests"`
	EarlyDivergences uint64 `json:"earlyDivergences"`
	// LostTokens are the prompt tokens shared with a recent prompt but
	// after the divergence: prefill a cache could have skipped had the
	// changing part come last. SharedTokens are all tokens shared with a
	// recent prompt, the most that could have been cached.
	LostTokens   uint64 `json:"lostTokens"`
	SharedTokens uint64 `json:"sharedTokens"`
	// LostPrefillSeconds prices LostTokens with the pool's latency model
	// (its learned seconds per uncached token); 0 when not priced.
	LostPrefillSeconds float64 `json:"lostPrefillSeconds"`
	// DivergenceOffset is the median block offset of the early
	// divergences (rounded down to 0, 1, 2, 4, 8, …); -1 when none.
	DivergenceOffset int `json:"divergenceOffset"`
	// Sample is a short window of the latest early divergence's prompt
	// bytes around the first changed byte, when samples are on.
	Sample string `json:"sample,omitempty"`
}

// Breaking reports whether the entry's prompts break the prefix cache:
// most of what they share with earlier prompts is lost to divergence.
func (e Entry) Breaking() bool {
	return e.EarlyDivergences > 0 && 2*e.LostTokens >= e.SharedTokens
}

// PrefillPrice prices uncached prompt tokens for a model, in seconds
// (tier1/gateway.Gateway.PrefillSeconds).
type PrefillPrice func(model string, tokens float64) float64

// Report returns the entries over the window ending at now, of tenant
// only when it is not empty, worst first. price may be nil.
func (s *Sketch) Report(now time.Time, tenant string, price PrefillPrice) Report {
	rep := Report{BlockSize: s.cfg.BlockSize, WindowSeconds: s.cfg.Window.Seconds(), Entries: []Entry{}}
	nowNs := now.UnixNano()
	width := max(int64(s.cfg.Window)/numBuckets, 1)
	oldest := nowNs/width - numBuckets + 1
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.entries {
			if tenant != "" && e.tenant != tenant {
				continue
			}
			out := Entry{Tenant: e.tenant, Model: e.model, DivergenceOffset: -1}
			var offsets [offsetClasses]uint64
			for _, b := range e.buckets {
				if b.epoch < oldest || b.epoch > nowNs/width {
					continue
				}
				out.Requests += uint64(b.requests)
				out.EarlyDivergences += uint64(b.early)
				out.LostTokens += b.lostTokens
				out.SharedTokens += b.sharedTokens
				for c, n := range b.offsets {
					offsets[c] += uint64(n)
				}
			}
			if out.Requests == 0 {
				continue
			}
			if out.EarlyDivergences > 0 {
				seen := uint64(0)
				for c, n := range offsets {
					seen += n
					if 2*seen >= out.EarlyDivergences {
						out.DivergenceOffset = classLow(c)
						break
					}
				}
				if e.sampleN > 0 && e.sampleAge/width >= oldest {
					out.Sample = redact(e.sample[:e.sampleN])
				}
			}
			rep.Entries = append(rep.Entries, out)
		}
		sh.mu.Unlock()
	}
	if price != nil {
		for i := range rep.Entries {
			e := &rep.Entries[i]
			e.LostPrefillSeconds = price(e.Model, float64(e.LostTokens))
		}
	}
	sortEntries(rep.Entries)
	return rep
}

func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(b.LostTokens, a.LostTokens), cmp.Compare(b.EarlyDivergences, a.EarlyDivergences),
			strings.Compare(a.Tenant, b.Tenant), strings.Compare(a.Model, b.Model))
	})
}

// redact renders sampled bytes as printable text: control bytes (the
// prompt text's message separators among them) and bytes of a character
// cut by the window become '·'.
func redact(b []byte) string {
	var sb strings.Builder
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		switch {
		case r == utf8.RuneError && size <= 1, r < 0x20, r == 0x7f:
			sb.WriteRune('·')
		default:
			sb.WriteRune(r)
		}
		b = b[size:]
	}
	return sb.String()
}

// Handler serves the report as JSON at Path; ?tenant= filters. price may
// be nil.
func (s *Sketch) Handler(price PrefillPrice) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, http.StatusMethodNotAllowed, "use GET")
			return
		}
		tenant := r.URL.Query().Get("tenant")
		if len(tenant) > 256 {
			writeError(w, http.StatusBadRequest, "tenant: longer than 256 bytes")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(s.Report(time.Now(), tenant, price))
	})
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": "invalid_request_error", "param": nil, "code": nil}})
}

// Fetch reads the report of the Tier-1 whose metrics listener is at base
// (a URL, or host:port as `meridian up --prometheus-targets` lists them),
// of tenant when not empty. Each request waits at most timeout.
func Fetch(ctx context.Context, base, tenant string, timeout time.Duration) (Report, error) {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return Report{}, fmt.Errorf("hygiene: Tier-1 URL %q: want http://host:port of its metrics listener", base)
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/metrics") + Path
	if tenant != "" {
		u.RawQuery = url.Values{"tenant": {tenant}}.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return Report{}, fmt.Errorf("hygiene: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return Report{}, fmt.Errorf("hygiene: %s: %w", u.Redacted(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return Report{}, fmt.Errorf("hygiene: %s: %w", u.Redacted(), err)
	}
	if resp.StatusCode != http.StatusOK {
		return Report{}, fmt.Errorf("hygiene: %s: %s: %s", u.Redacted(), resp.Status, strings.TrimSpace(string(body[:min(len(body), 512)])))
	}
	var rep Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return Report{}, fmt.Errorf("hygiene: %s: not a prompt report: %w", u.Redacted(), err)
	}
	return rep, nil
}

// Merge combines the reports of several Tier-1s (replicas or clusters) of
// the same block size: counts add up per tenant and model, the offset of
// the entry with the most early divergences and its sample are kept.
func Merge(reps ...Report) (Report, error) {
	out := Report{Entries: []Entry{}}
	idx := map[[2]string]int{}
	most := map[[2]string]uint64{}
	for _, r := range reps {
		if out.BlockSize == 0 {
			out.BlockSize, out.WindowSeconds = r.BlockSize, r.WindowSeconds
		} else if r.BlockSize != out.BlockSize {
			return Report{}, errors.New("hygiene: reports with different block sizes cannot be merged")
		}
		for _, e := range r.Entries {
			k := [2]string{e.Tenant, e.Model}
			i, ok := idx[k]
			if !ok {
				idx[k] = len(out.Entries)
				most[k] = e.EarlyDivergences
				out.Entries = append(out.Entries, e)
				continue
			}
			m := &out.Entries[i]
			m.Requests += e.Requests
			m.EarlyDivergences += e.EarlyDivergences
			m.LostTokens += e.LostTokens
			m.SharedTokens += e.SharedTokens
			m.LostPrefillSeconds += e.LostPrefillSeconds
			if e.EarlyDivergences > most[k] {
				most[k] = e.EarlyDivergences
				m.DivergenceOffset = e.DivergenceOffset
				m.Sample = cmp.Or(e.Sample, m.Sample)
			} else if m.Sample == "" {
				m.Sample = e.Sample
			}
		}
	}
	sortEntries(out.Entries)
	return out, nil
}

// WriteText prints the report as a table, worst first.
func (r Report) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "TENANT\tMODEL\tREQUESTS\tEARLY\tLOST TOKENS\tLOST PREFILL\tDIVERGES AT\tVERDICT\tSAMPLE\n")
	for _, e := range r.Entries {
		verdict, at := "healthy", "-"
		if e.Breaking() {
			verdict = "breaks cache"
		}
		if e.DivergenceOffset >= 0 {
			at = fmt.Sprintf("block %d (char %d)", e.DivergenceOffset, e.DivergenceOffset*r.BlockSize)
		}
		lost := fmt.Sprintf("%d of %d", e.LostTokens, e.SharedTokens)
		sample := "-"
		if e.Sample != "" {
			sample = strconv.Quote(e.Sample)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", cmp.Or(e.Tenant, "(none)"), e.Model, e.Requests,
			e.EarlyDivergences, lost, (time.Duration(e.LostPrefillSeconds * float64(time.Second))).Round(time.Millisecond), at, verdict, sample)
	}
	return tw.Flush()
}

// Collector exports the sketch's cumulative counters for the tenants and
// models that diverged early at least once (others add nothing to read).
// Series of forgotten keys disappear with them, so the tenant label is
// bounded by Config.MaxKeys.
func (s *Sketch) Collector() prometheus.Collector { return collector{s} }

var (
	descRequests = prometheus.NewDesc("meridian_prompt_requests_total",
		"Prompts compared for prefix-cache hygiene, by tenant and model (exported once the pair has diverged early).",
		[]string{"tenant", "model"}, nil)
	descEarly = prometheus.NewDesc("meridian_prompt_early_divergence_total",
		"Prompts that shared most of their content with a recent prompt of the same tenant and model but diverged early.",
		[]string{"tenant", "model"}, nil)
	descLost = prometheus.NewDesc("meridian_prompt_lost_prefill_tokens_total",
		"Prompt tokens shared with a recent prompt but after an early divergence: prefill the prefix cache could have skipped.",
		[]string{"tenant", "model"}, nil)
)

type collector struct{ s *Sketch }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRequests
	ch <- descEarly
	ch <- descLost
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	type row struct {
		tenant, model         string
		requests, early, lost uint64
	}
	var rows []row
	for i := range c.s.shards {
		sh := &c.s.shards[i]
		sh.mu.Lock()
		for _, e := range sh.entries {
			if e.early > 0 {
				rows = append(rows, row{e.tenant, e.model, e.requests, e.early, e.lostTokens})
			}
		}
		sh.mu.Unlock()
	}
	for _, r := range rows {
		// A label value that is not UTF-8 is refused by the client
		// library; such a pair is left out rather than failing the scrape.
		for _, m := range []struct {
			d *prometheus.Desc
			v uint64
		}{{descRequests, r.requests}, {descEarly, r.early}, {descLost, r.lost}} {
			if cm, err := prometheus.NewConstMetric(m.d, prometheus.CounterValue, float64(m.v), r.tenant, r.model); err == nil {
				ch <- cm
			}
		}
	}
}
