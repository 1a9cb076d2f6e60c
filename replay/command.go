package replay

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/sim"
)

// Invocation is one `meridian replay` command line, parsed into values.
// The command only fills it from flags; Execute does the work, so tests
// reach everything the command does.
type Invocation struct {
	Trace string
	Load  LoadOptions
	Fleet string
	// Policy names one policy; Compare a comma-separated list. Exactly
	// one must be set.
	Policy, Compare string
	// Weights ("queue=2,kvCache=2,prefix=3") set the meridian policy's
	// weights; "" means the defaults.
	Weights string
	// Gateway and Scheduler take the meridian policy from a gateway
	// configuration directory instead.
	Gateway, Scheduler string
	// Sweep ("prefix=0,1,3,5") replays the meridian policy once per value
	// of one weight and sorts the table by P99 TTFT.
	Sweep string
	// GoodputSLO, when positive, searches each policy's highest rate scale
	// whose P99 TTFT (failures counted as misses) is at most this.
	GoodputSLO time.Duration
	// JSON writes the results as JSON instead of a table; Plot, if set,
	// is a path for an SVG of the TTFT CDFs.
	JSON bool
	Plot string
	// Progress draws a progress bar on stderr for runs over 2 s.
	Progress bool
	Options  Options
}

// Policies resolves the policies the invocation names.
func (inv *Invocation) Policies() ([]Policy, error) {
	if (inv.Policy == "") == (inv.Compare == "") {
		return nil, fmt.Errorf("replay: name the policy with --policy NAME or several with --compare NAME,NAME (valid: %s)",
			strings.Join(PolicyKinds, ", "))
	}
	if (inv.Gateway == "") != (inv.Scheduler == "") {
		return nil, errors.New("replay: --gateway DIR and --scheduler NAME go together")
	}
	if inv.Gateway != "" && inv.Weights != "" {
		return nil, errors.New("replay: take Meridian's weights from --weights or from --gateway/--scheduler, not both")
	}
	var weights *config.Weights
	if inv.Weights != "" {
		w, err := ParseWeights(inv.Weights)
		if err != nil {
			return nil, err
		}
		weights = &w
	}
	list := inv.Policy + inv.Compare
	ps, err := ParsePolicies(list, weights)
	if err != nil {
		return nil, err
	}
	if inv.Gateway != "" {
		gp, err := GatewayPolicy(inv.Gateway, inv.Scheduler)
		if err != nil {
			return nil, err
		}
		for i := range ps {
			if ps[i].Kind == Meridian {
				ps[i] = gp
			}
		}
	}
	if inv.Sweep != "" {
		if len(ps) != 1 || ps[0].Kind != Meridian {
			return nil, errors.New("replay: --sweep varies one weight of Meridian's policy: use it with --policy meridian")
		}
		return Sweep(ps[0], inv.Sweep)
	}
	return ps, nil
}

// Execute runs the invocation, writing the table or JSON to stdout and
// notes and progress to stderr.
func (inv *Invocation) Execute(stdout, stderr io.Writer) error {
	policies, err := inv.Policies()
	if err != nil {
		return err
	}
	if inv.Fleet == "" {
		return errors.New("replay: --fleet FILE is required (see deploy/examples/fleets)")
	}
	fleet, err := sim.LoadFleet(inv.Fleet)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	if inv.Trace == "" {
		return errors.New("replay: --trace FILE is required")
	}
	inv.Load.Seed = inv.Options.Seed
	w, err := LoadTrace(inv.Trace, inv.Load)
	if err != nil {
		return err
	}
	o := inv.Options
	o.Fleet = fleet
	var bar *progressBar
	if inv.Progress {
		total := int64(len(w.Records) * len(policies))
		if inv.GoodputSLO > 0 {
			total = 0 // the number of runs is not known in advance
		}
		bar = startProgress(stderr, total)
		o.Progress = bar.add
	}
	var rs []*Result
	if inv.GoodputSLO > 0 {
		rs, err = GoodputAll(w, policies, o, SLO{TTFT: inv.GoodputSLO}, GoodputSearch{})
	} else {
		rs, err = Compare(w, policies, o)
	}
	bar.stop()
	if err != nil {
		return err
	}
	if inv.Sweep != "" {
		SortByP99(rs)
	}
	if inv.Plot != "" {
		if err := writePlotFile(inv.Plot, rs, inv.title(w, o)); err != nil {
			return err
		}
	}
	if inv.JSON {
		if w.AdapterNote != "" {
			// The JSON shape has no room for it; say it where a person looks.
			fmt.Fprintln(stderr, "note:", w.AdapterNote)
		}
		return WriteJSON(stdout, rs)
	}
	fmt.Fprintf(stdout, "# %s\n", inv.title(w, o))
	if inv.GoodputSLO > 0 {
		fmt.Fprintf(stdout, "# goodput: highest rate scale with ≥99%% of requests' TTFT ≤ %v (failures count as misses); figures are from that run\n", inv.GoodputSLO)
	}
	if w.AdapterNote != "" {
		fmt.Fprintf(stdout, "# %s\n", w.AdapterNote)
	}
	if err := WriteTable(stdout, rs); err != nil {
		return err
	}
	var walls []string
	for _, r := range rs {
		walls = append(walls, fmt.Sprintf("%s %.2fs", r.Policy, r.Wall.Seconds()))
	}
	fmt.Fprintf(stdout, "# wall time of the last run per policy: %s\n", strings.Join(walls, "; "))
	return nil
}

func (inv *Invocation) title(w *Workload, o Options) string {
	var pools []string
	for _, p := range o.Fleet.Pools {
		pools = append(pools, fmt.Sprintf("%d×%s", p.Count, p.Profile))
	}
	jitter := ""
	if inv.Load.Jitter {
		jitter = ", jittered"
	}
	if inv.Load.UniquePrompts {
		jitter += ", prompts made unique"
	}
	return fmt.Sprintf("%s: %d requests over %v%s; fleet %s; rate ×%g; %d replica(s); seed %d",
		baseName(inv.Trace), len(w.Records), w.Span().Round(time.Second), jitter, strings.Join(pools, "+"),
		max(o.RateScale, 0), max(o.Replicas, 1), o.Seed)
}

func baseName(p string) string {
	if i := strings.LastIndexAny(p, `/\`); i >= 0 {
		return p[i+1:]
	}
	return p
}

func writePlotFile(path string, rs []*Result, title string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("replay: plot: %w", err)
	}
	if err := WritePlot(f, rs, title); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("replay: plot: %w", err)
	}
	return nil
}

// progressBar redraws one stderr line every 200 ms once a run has taken
// more than 2 s. It counts finished requests across concurrent runs.
type progressBar struct {
	w     io.Writer
	total int64
	done  atomic.Int64
	quit  chan struct{}
	wg    sync.WaitGroup
	drawn bool
}

func startProgress(w io.Writer, total int64) *progressBar {
	b := &progressBar{w: w, total: total, quit: make(chan struct{})}
	b.wg.Add(1)
	go b.loop()
	return b
}

func (b *progressBar) add(n int) { b.done.Add(int64(n)) }

func (b *progressBar) loop() {
	defer b.wg.Done()
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-b.quit:
			if b.drawn {
				fmt.Fprint(b.w, "\r\033[K")
			}
			return
		case <-tick.C:
			el := time.Since(start)
			if el < 2*time.Second {
				continue
			}
			b.drawn = true
			n := b.done.Load()
			if b.total <= 0 {
				fmt.Fprintf(b.w, "\r\033[Kreplayed %d requests (%.0fs)", n, el.Seconds())
				continue
			}
			const width = 30
			k := int(min(n, b.total) * width / b.total)
			fmt.Fprintf(b.w, "\r\033[K[%s%s] %3d%% %d/%d requests (%.0fs)", strings.Repeat("=", k),
				strings.Repeat(" ", width-k), n*100/b.total, n, b.total, el.Seconds())
		}
	}
}

// stop ends the bar and clears its line; nil-safe.
func (b *progressBar) stop() {
	if b == nil {
		return
	}
	close(b.quit)
	b.wg.Wait()
}
