// Command soak runs mixed streaming traffic through a local platform
// (`meridian up`, started as a child process) for a bounded time while
// faults are injected into its simulated pods on a schedule, and reports
// what callers saw and how the process held up:
//
//   - every request's outcome by cause: completed, refused before any byte
//     (429 with an OpenAI error body: admission or rate limits), lost (a
//     5xx, a timeout or a dropped connection before the first byte: a
//     request the router should have saved), cut with an error event (a stream that
//     had started and then failed, as the pod did), or cut silently (a
//     stream that ended without [DONE] and without an error event: a bug);
//   - every sample interval: requests and P99 time to first token in the
//     interval, the process's RSS, open file descriptors and goroutines;
//   - at the end: a summary, a JSON report (-json) and an SVG plot (-plot)
//     of P99 TTFT, RSS and goroutines over time, with the faults marked.
//
// Everything runs on loopback and stops by itself after -duration.
//
//	go run ./bench/soak -duration 10m -fault-every 1m -plot docs/soak.svg -json /tmp/soak.json
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/meridian-router/meridian/internal/loop"
)

var (
	meridianBin = flag.String("meridian", "", "path to a built meridian binary (default: build ./cmd/meridian into a temporary directory)")
	duration    = flag.Duration("duration", 10*time.Minute, "how long to send traffic")
	rps         = flag.Float64("rps", 8, "mean request arrivals per second (Poisson)")
	maxInFlight = flag.Int("max-in-flight", 128, "requests in flight at most (arrivals beyond it are counted as skipped)")
	faultEvery  = flag.Duration("fault-every", time.Minute, "inject a fault this often (0: none)")
	faultFor    = flag.Duration("fault-for", 20*time.Second, "how long each fault lasts")
	stallEvery  = flag.Duration("stall-every", 0, "also stop the whole meridian up process (SIGSTOP, then SIGCONT) this often, half a period after the pod faults: a CPU-starved host (0: never)")
	stallFor    = flag.Duration("stall-for", 2*time.Second, "how long each stall lasts")
	sampleEvery = flag.Duration("sample", 10*time.Second, "sample interval")
	warmup      = flag.Duration("warmup", time.Minute, "samples before this are not used for the flatness verdict")
	timeout     = flag.Duration("request-timeout", 60*time.Second, "a request still unfinished after this is abandoned (counted as lost or cut)")
	jsonOut     = flag.String("json", "", "write the report as JSON to this file")
	plotOut     = flag.String("plot", "", "write an SVG plot of the samples to this file")
	seed        = flag.Uint64("seed", 1, "random seed (arrivals, models, fault targets)")
	check       = flag.Bool("check", false, "exit 1 if any request was lost or cut silently, or RSS or goroutines grew after warm-up")
)

// models are the public names the example platform serves, with the share
// of traffic each gets.
var models = []struct {
	name   string
	weight float64
}{
	{"support-agent", 0.5}, {"autocomplete-fast", 0.3}, {"summarizer-long", 0.2},
}

func main() {
	flag.Parse()
	log.SetFlags(log.Ltime)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	tmp, err := os.MkdirTemp("", "meridian-soak-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := *meridianBin
	if bin == "" {
		bin = filepath.Join(tmp, "meridian")
		log.Printf("building %s", bin)
		build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/meridian")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			return fmt.Errorf("build meridian (run from the repository root): %w", err)
		}
	}
	p, err := startPlatform(ctx, bin, tmp)
	if err != nil {
		return err
	}
	defer p.stop()
	log.Printf("platform up: pid %d, endpoints %v, %d pods", p.cmd.Process.Pid, p.endpoints, len(p.pods))

	rec := &recorder{start: time.Now()}
	loadCtx, cancel := context.WithTimeout(ctx, *duration)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { injectFaults(loadCtx, p, rec) })
	wg.Go(func() { stallProcess(loadCtx, p, rec) })
	wg.Go(func() { sample(loadCtx, p, rec) })
	generate(loadCtx, p, rec)
	wg.Wait()

	r := rec.report(p)
	r.print(os.Stdout)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		if err := os.WriteFile(*jsonOut, b, 0o644); err != nil {
			return err
		}
	}
	if *plotOut != "" {
		if err := writePlot(*plotOut, r); err != nil {
			return err
		}
	}
	if *check && !r.Healthy() {
		return errors.New("soak: requests lost, streams cut silently, or growth after warm-up (see above)")
	}
	return nil
}

// platform is a running `meridian up`.
type platform struct {
	cmd       *exec.Cmd
	endpoints []string // Tier-2 base URLs, first Region first
	token     string
	pods      []string // simulated pod addresses
	metrics   []string // Meridian metrics addresses
	done      chan struct{}
}

func startPlatform(ctx context.Context, bin, dir string) (*platform, error) {
	targets := filepath.Join(dir, "targets.json")
	cmd := exec.Command(bin, "up", "--prometheus-targets", targets)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &platform{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }()

	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		var region []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "  ") && strings.Contains(line, "http://") && p.token == "":
				if f := strings.Fields(line); len(f) == 2 {
					region = append(region, f[1])
				}
			case strings.HasPrefix(line, "endpoint: "):
				first := strings.TrimPrefix(line, "endpoint: ")
				p.endpoints = append([]string{first}, slices.DeleteFunc(region, func(s string) bool { return s == first })...)
			case strings.HasPrefix(line, "token: "):
				p.token = strings.TrimPrefix(line, "token: ")
				ready <- nil
			}
		}
		ready <- fmt.Errorf("meridian up exited before printing its token")
		io.Copy(io.Discard, out)
	}()
	select {
	case err := <-ready:
		if err != nil {
			p.stop()
			return nil, err
		}
	case <-time.After(2 * time.Minute):
		p.stop()
		return nil, errors.New("meridian up did not print its token within 2 minutes")
	case <-ctx.Done():
		p.stop()
		return nil, ctx.Err()
	}
	b, err := os.ReadFile(targets)
	if err != nil {
		p.stop()
		return nil, err
	}
	var groups []struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	if err := json.Unmarshal(b, &groups); err != nil {
		p.stop()
		return nil, fmt.Errorf("%s: %w", targets, err)
	}
	for _, g := range groups {
		if g.Labels["job"] == "model-servers" {
			p.pods = append(p.pods, g.Targets...)
		} else {
			p.metrics = append(p.metrics, g.Targets...)
		}
	}
	if len(p.pods) == 0 || len(p.endpoints) == 0 {
		p.stop()
		return nil, fmt.Errorf("meridian up listed %d pods and %d endpoints", len(p.pods), len(p.endpoints))
	}
	return p, nil
}

// stop sends SIGTERM and waits for a graceful exit, then kills.
func (p *platform) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// outcome classifies one request as a caller saw it.
type outcome string

const (
	completed outcome = "completed"        // 200 and a stream ending in [DONE]
	refused   outcome = "refused"          // 429 with an error body, before any byte (admission or rate limits)
	rejected  outcome = "client-error"     // another 4xx (a bug in this tool or the platform)
	lost      outcome = "lost"             // failed before the first byte: the router should have saved it
	cutError  outcome = "cut-with-error"   // started streaming, then an error event
	cutSilent outcome = "cut-silently"     // started streaming, ended without [DONE] or an error event
	skipped   outcome = "skipped-too-busy" // not sent: max-in-flight reached
)

type result struct {
	at     time.Duration // since the soak started
	ttft   time.Duration // to the first content byte (0 when none)
	out    outcome
	detail string // status code and error code, or the transport error
}

// send makes one streaming chat request and classifies what came back.
func send(ctx context.Context, c *http.Client, endpoint, token, model string, rng *rand.Rand) result {
	body, _ := json.Marshal(map[string]any{
		"model":      model,
		"stream":     true,
		"max_tokens": 16 + rng.IntN(112),
		"messages": []map[string]string{
			{"role": "system", "content": "You are a helpful assistant for the soak test. Answer briefly."},
			{"role": "user", "content": fmt.Sprintf("Question %d: what changed?", rng.IntN(1_000_000))},
		},
	})
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, endpoint+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return result{out: lost, detail: transportCause(err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code any `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		json.Unmarshal(b, &e)
		detail := fmt.Sprintf("%d %v", resp.StatusCode, e.Error.Code)
		switch {
		case resp.StatusCode == http.StatusTooManyRequests:
			return result{out: refused, detail: detail}
		case resp.StatusCode < 500:
			return result{out: rejected, detail: detail}
		}
		return result{out: lost, detail: detail}
	}
	return readStream(resp.Body, start)
}

// readStream reads an SSE chat stream to its end.
func readStream(r io.Reader, start time.Time) result {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var res result
	for sc.Scan() {
		line := sc.Bytes()
		data, ok := bytes.CutPrefix(line, []byte("data: "))
		if !ok {
			continue
		}
		if res.ttft == 0 {
			res.ttft = time.Since(start)
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			res.out = completed
			return res
		}
		if bytes.HasPrefix(data, []byte(`{"error"`)) {
			var e struct {
				Error struct {
					Code any `json:"code"`
				} `json:"error"`
			}
			json.Unmarshal(data, &e)
			res.out, res.detail = cutError, fmt.Sprintf("error event %v", e.Error.Code)
			return res
		}
	}
	if res.ttft == 0 {
		cause := "empty stream"
		if err := sc.Err(); err != nil {
			cause = transportCause(err)
		}
		return result{out: lost, detail: cause}
	}
	res.out, res.detail = cutSilent, "no [DONE]"
	if err := sc.Err(); err != nil {
		res.detail = transportCause(err)
	}
	return res
}

func transportCause(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.ErrUnexpectedEOF):
		return "connection reset"
	}
	return "transport: " + err.Error()
}

// generate sends Poisson arrivals until ctx ends, then waits for what is
// in flight.
func generate(ctx context.Context, p *platform, rec *recorder) {
	rng := rand.New(rand.NewPCG(*seed, 1))
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *maxInFlight, ResponseHeaderTimeout: *timeout}}
	sem := make(chan struct{}, *maxInFlight)
	var wg sync.WaitGroup
	next := time.Now()
	for {
		next = next.Add(time.Duration(rng.ExpFloat64() / *rps * float64(time.Second)))
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-time.After(time.Until(next)):
		}
		model := pick(rng)
		endpoint := p.endpoints[0]
		if len(p.endpoints) > 1 && rng.Float64() < 0.3 {
			endpoint = p.endpoints[1+rng.IntN(len(p.endpoints)-1)]
		}
		select {
		case sem <- struct{}{}:
		default:
			rec.add(result{at: time.Since(rec.start), out: skipped})
			continue
		}
		reqRng := rand.New(rand.NewPCG(rng.Uint64(), rng.Uint64()))
		at := time.Since(rec.start)
		wg.Go(func() {
			defer func() { <-sem }()
			// A request runs to its end even after the load window closes.
			res := send(context.WithoutCancel(ctx), c, endpoint, p.token, model, reqRng)
			res.at = at
			rec.add(res)
		})
	}
}

func pick(rng *rand.Rand) string {
	x := rng.Float64()
	for _, m := range models {
		if x < m.weight {
			return m.name
		}
		x -= m.weight
	}
	return models[0].name
}

// fault is one injected fault on one pod.
type fault struct {
	At     time.Duration  `json:"at"`
	Until  time.Duration  `json:"until"`
	Pod    string         `json:"pod"`
	Name   string         `json:"name"`
	Faults map[string]any `json:"faults"`
}

// schedule is the rotation of faults, one per -fault-every.
var schedule = []struct {
	name   string
	faults map[string]any
}{
	{"pod crashes mid-stream", map[string]any{"crashAfterTokens": 4}},
	{"pod hangs", map[string]any{"hang": true}},
	{"pod 4x slow", map[string]any{"slowFactor": 4}},
	{"pod refuses with 500", map[string]any{"errorRate": 1}},
	{"pod answers 429", map[string]any{"rejectRate": 1}},
}

func injectFaults(ctx context.Context, p *platform, rec *recorder) {
	if *faultEvery <= 0 {
		return
	}
	rng := rand.New(rand.NewPCG(*seed, 2))
	c := &http.Client{Timeout: 5 * time.Second}
	t := time.NewTicker(*faultEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := schedule[i%len(schedule)]
		pod := p.pods[rng.IntN(len(p.pods))]
		f := fault{At: time.Since(rec.start), Pod: pod, Name: s.name, Faults: s.faults}
		if err := putFaults(ctx, c, pod, s.faults); err != nil {
			log.Printf("fault %q on %s: %v", s.name, pod, err)
			continue
		}
		log.Printf("fault: %s on %s for %s", s.name, pod, *faultFor)
		select {
		case <-ctx.Done():
		case <-time.After(*faultFor):
		}
		// Cleared even when the soak is ending, so the tail drains.
		if err := putFaults(context.WithoutCancel(ctx), c, pod, map[string]any{}); err != nil {
			log.Printf("clear faults on %s: %v", pod, err)
		}
		f.Until = time.Since(rec.start)
		rec.addFault(f)
	}
}

// stallProcess stops the whole platform process for -stall-for every
// -stall-every: every component misses its timers at once, as on a host
// whose CPU is taken by something else. Digests must stay fresh and
// memberlist must not declare the Tier-2s dead.
func stallProcess(ctx context.Context, p *platform, rec *recorder) {
	if *stallEvery <= 0 {
		return
	}
	select {
	case <-ctx.Done():
		return
	case <-time.After(*stallEvery / 2):
	}
	t := time.NewTicker(*stallEvery)
	defer t.Stop()
	for {
		f := fault{At: time.Since(rec.start), Pod: "meridian up (whole process)", Name: "process stalled (SIGSTOP)"}
		if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			log.Printf("stall: %v", err)
			return
		}
		log.Printf("stall: meridian up stopped for %s", *stallFor)
		time.Sleep(*stallFor) // bounded; the process must be resumed even when the soak ends
		if err := p.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			log.Printf("stall: resume: %v", err)
		}
		f.Until = time.Since(rec.start)
		rec.addFault(f)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func putFaults(ctx context.Context, c *http.Client, pod string, faults map[string]any) error {
	b, _ := json.Marshal(faults)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+pod+"/sim/faults", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("PUT /sim/faults: %s", resp.Status)
	}
	return nil
}

// sample records the process's resources every -sample.
func sample(ctx context.Context, p *platform, rec *recorder) {
	c := &http.Client{Timeout: 5 * time.Second}
	loop.Every(ctx, *sampleEvery, func() {
		s := resources(p.cmd.Process.Pid)
		s.At = time.Since(rec.start)
		s.Goroutines = goroutines(ctx, c, p.metrics)
		rec.addSample(s)
	})
}

type snapshot struct {
	At         time.Duration `json:"at"`
	RSSBytes   int64         `json:"rssBytes"`
	FDs        int           `json:"fds"`
	Goroutines int           `json:"goroutines"`
	// Filled by the recorder: the interval's requests.
	Requests int             `json:"requests"`
	Outcomes map[outcome]int `json:"outcomes"`
	P99TTFT  time.Duration   `json:"p99TTFT"`
	P50TTFT  time.Duration   `json:"p50TTFT"`
	ttfts    []time.Duration
}

// resources reads the RSS and open descriptors of a Linux process.
func resources(pid int) snapshot {
	var s snapshot
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				s.RSSBytes = kb << 10
			}
		}
	}
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid)); err == nil {
		s.FDs = len(ents)
	}
	return s
}

// goroutines reads go_goroutines from the first metrics endpoint that
// answers (every component of `meridian up` is one process).
func goroutines(ctx context.Context, c *http.Client, addrs []string) int {
	for _, a := range addrs {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/metrics", nil)
		resp, err := c.Do(req)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
				resp.Body.Close()
				f, _ := strconv.ParseFloat(v, 64)
				return int(f)
			}
		}
		resp.Body.Close()
	}
	return 0
}

// recorder collects results, samples and faults.
type recorder struct {
	start   time.Time
	mu      sync.Mutex
	results []result
	samples []snapshot
	faults  []fault
}

func (r *recorder) add(res result) {
	r.mu.Lock()
	r.results = append(r.results, res)
	r.mu.Unlock()
}

func (r *recorder) addFault(f fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

func (r *recorder) addSample(s snapshot) {
	r.mu.Lock()
	r.samples = append(r.samples, s)
	r.mu.Unlock()
	log.Printf("t=%-6s rss=%5.1f MiB fds=%-4d goroutines=%-5d", s.At.Round(time.Second), float64(s.RSSBytes)/(1<<20), s.FDs, s.Goroutines)
}

// Report is what a soak found.
type Report struct {
	Duration   time.Duration   `json:"duration"`
	Requests   int             `json:"requests"`
	Outcomes   map[outcome]int `json:"outcomes"`
	Causes     map[string]int  `json:"causes"` // outcome: detail → count, for everything not completed
	Samples    []snapshot      `json:"samples"`
	Faults     []fault         `json:"faults"`
	RSSGrowth  float64         `json:"rssGrowth"`  // last third's mean over the post-warm-up first third's, minus 1
	GoroGrowth float64         `json:"goroGrowth"` // the same for goroutines
	FDGrowth   float64         `json:"fdGrowth"`
}

func (r *recorder) report(p *platform) *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	rep := &Report{Duration: time.Since(r.start), Outcomes: map[outcome]int{}, Causes: map[string]int{}, Faults: r.faults}
	samples := slices.Clone(r.samples)
	for i := range samples {
		samples[i].Outcomes = map[outcome]int{}
	}
	for _, res := range r.results {
		rep.Requests++
		rep.Outcomes[res.out]++
		if res.out != completed {
			rep.Causes[string(res.out)+": "+res.detail]++
		}
		// The interval a request arrived in.
		i, _ := slices.BinarySearchFunc(samples, res.at, func(s snapshot, at time.Duration) int {
			return cmp.Compare(s.At, at)
		})
		if i < len(samples) {
			samples[i].Requests++
			samples[i].Outcomes[res.out]++
			if res.ttft > 0 {
				samples[i].ttfts = append(samples[i].ttfts, res.ttft)
			}
		}
	}
	for i := range samples {
		slices.Sort(samples[i].ttfts)
		samples[i].P99TTFT = quantile(samples[i].ttfts, 0.99)
		samples[i].P50TTFT = quantile(samples[i].ttfts, 0.50)
	}
	rep.Samples = samples
	var post []snapshot
	for _, s := range samples {
		if s.At >= *warmup {
			post = append(post, s)
		}
	}
	rep.RSSGrowth = growth(post, func(s snapshot) float64 { return float64(s.RSSBytes) })
	rep.GoroGrowth = growth(post, func(s snapshot) float64 { return float64(s.Goroutines) })
	rep.FDGrowth = growth(post, func(s snapshot) float64 { return float64(s.FDs) })
	return rep
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// growth compares the mean of the last third of the samples with the mean
// of the first third: 0 is flat, 0.1 is 10% higher at the end.
func growth(s []snapshot, v func(snapshot) float64) float64 {
	if len(s) < 3 {
		return 0
	}
	third := len(s) / 3
	mean := func(xs []snapshot) float64 {
		var sum float64
		for _, x := range xs {
			sum += v(x)
		}
		return sum / float64(len(xs))
	}
	first, last := mean(s[:third]), mean(s[len(s)-third:])
	if first == 0 {
		return 0
	}
	return last/first - 1
}

// flatBound is how much RSS, goroutines or descriptors may grow between
// the first and last third after warm-up and still count as flat: GC
// timing and in-flight requests move each sample by a few percent.
const flatBound = 0.15

// Healthy is the soak's verdict: nothing lost that had not started
// streaming, no stream cut without an error event, and flat resources.
func (r *Report) Healthy() bool {
	return r.Outcomes[lost] == 0 && r.Outcomes[cutSilent] == 0 &&
		r.RSSGrowth <= flatBound && r.GoroGrowth <= flatBound && r.FDGrowth <= flatBound
}

func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "\nsoak: %s, %d requests\n", r.Duration.Round(time.Second), r.Requests)
	for _, o := range []outcome{completed, refused, cutError, lost, cutSilent, rejected, skipped} {
		fmt.Fprintf(w, "  %-18s %d\n", o, r.Outcomes[o])
	}
	if len(r.Causes) > 0 {
		fmt.Fprintln(w, "causes:")
		keys := make([]string, 0, len(r.Causes))
		for k := range r.Causes {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b string) int { return r.Causes[b] - r.Causes[a] })
		for _, k := range keys {
			fmt.Fprintf(w, "  %6d  %s\n", r.Causes[k], k)
		}
	}
	fmt.Fprintln(w, "faults:")
	for _, f := range r.Faults {
		fmt.Fprintf(w, "  %6s–%-6s %-24s %s\n", f.At.Round(time.Second), f.Until.Round(time.Second), f.Name, f.Pod)
	}
	fmt.Fprintln(w, "samples (interval ending at t):")
	fmt.Fprintf(w, "  %-7s %8s %9s %9s %9s %5s %10s\n", "t", "requests", "p50 TTFT", "p99 TTFT", "RSS MiB", "fds", "goroutines")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "  %-7s %8d %9s %9s %9.1f %5d %10d\n", s.At.Round(time.Second), s.Requests,
			s.P50TTFT.Round(time.Millisecond), s.P99TTFT.Round(time.Millisecond), float64(s.RSSBytes)/(1<<20), s.FDs, s.Goroutines)
	}
	fmt.Fprintf(w, "after warm-up (%s), last third vs first third: RSS %+.1f%%, goroutines %+.1f%%, fds %+.1f%% (flat: within %+.0f%%)\n",
		*warmup, 100*r.RSSGrowth, 100*r.GoroGrowth, 100*r.FDGrowth, 100*flatBound)
	verdict := "HEALTHY"
	if !r.Healthy() {
		verdict = "UNHEALTHY"
	}
	fmt.Fprintf(w, "verdict: %s (lost %d, cut silently %d)\n", verdict, r.Outcomes[lost], r.Outcomes[cutSilent])
}
