package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/model"
	"go.opentelemetry.io/otel/trace"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/config"
)

// PodSpec describes live pods to start with StartPods.
type PodSpec struct {
	// Pod is the template of every pod. Its Name is the prefix of the pod
	// names ("<name>-0", "<name>-1", ...); "" means the profile name.
	Pod PodConfig
	// Host is the address to listen on; "" means 127.0.0.1.
	Host string
	// BasePort is the first port; pod i listens on BasePort+i. 0 means an
	// ephemeral port per pod (what tests want).
	BasePort int
	// TimeScale is model seconds per wall-clock second: 10 runs the model
	// ten times faster than real time. 0 means 1. Latency histograms and
	// Outcome times are in model time.
	TimeScale float64
	// Metrics selects the metric names exposed on /metrics; "" means vLLM's.
	Metrics MetricNames
	// ConstLabels are added to every metric on /metrics.
	ConstLabels map[string]string
	// LabelMetrics adds the pod's own labels (e.g. gpu, pool from a fleet
	// file) and pod=<name> to every metric, so dashboards that group by
	// pool work on a plain Prometheus static scrape. Label names must be
	// valid Prometheus label names.
	LabelMetrics bool
	// OnOutcome, if set, is called with every finished or failed request
	// of every pod (times in model time since the pod started). It is
	// called from the pod's driver with the pod locked: it must be quick
	// and must not call the pod.
	OnOutcome func(Outcome)
	// DefaultMaxTokens is the output length of a request that sets no
	// max_tokens; 0 means 64. A request that sets it generates exactly
	// that many tokens (finish_reason "length"), as with ignore_eos.
	DefaultMaxTokens int
	// Tracer, when set, makes every OpenAI request a span that continues
	// the caller's W3C traceparent (as vLLM's --otlp-traces-endpoint
	// does). Nil: no tracing.
	Tracer trace.Tracer
}

// LivePod is one simulated model server: an HTTP server on its own port
// speaking the OpenAI API as vLLM does, backed by a Pod driven on the wall
// clock by its own goroutine.
type LivePod struct {
	pod     *Pod
	spec    PodSpec
	scale   float64
	start   time.Time
	ln      net.Listener
	srv     *http.Server
	metrics *podCollector

	mu      sync.Mutex // guards pod, changed and every liveRequest's progress fields
	lastEnd time.Duration
	nextID  uint64
	changed chan struct{} // closed and replaced when the pod's state changes, if watched
	watched bool          // a WaitFor caller holds changed

	kick      chan struct{} // wakes the driver when work arrives or faults change
	stop      context.CancelFunc
	unhook    func() bool     // stops the close-on-ctx hook
	stopping  <-chan struct{} // closed when Close begins
	driven    chan struct{}   // closed when the driver has exited
	closeOnce sync.Once
}

// liveRequest is one HTTP request inside a live pod. Its progress fields
// are written by the driver under LivePod.mu.
type liveRequest struct {
	req    Request
	notify chan struct{} // capacity 1: "progress changed"
	tokens int
	done   bool
	out    Outcome
}

// StartPods starts k live pods from spec, all or nothing. The pods stop
// when ctx is done or when each is closed.
func StartPods(ctx context.Context, spec PodSpec, k int) ([]*LivePod, error) {
	if k < 1 {
		return nil, fmt.Errorf("sim: StartPods: k = %d, want at least 1", k)
	}
	prefix := spec.Pod.Name
	if prefix == "" {
		prefix = spec.Pod.Profile.Name
	}
	cfgs := make([]PodConfig, k)
	for i := range cfgs {
		cfgs[i] = spec.Pod
		cfgs[i].Name = prefix + "-" + strconv.Itoa(i)
	}
	return startAll(ctx, spec, cfgs)
}

// startAll starts one live pod per configuration, the i-th with seed
// spec.Pod.Seed+i on port spec.BasePort+i (ephemeral when BasePort is 0),
// all or nothing.
func startAll(ctx context.Context, spec PodSpec, cfgs []PodConfig) ([]*LivePod, error) {
	var pods []*LivePod
	for i, c := range cfgs {
		s := spec
		s.Pod = c
		s.Pod.Seed = spec.Pod.Seed + uint64(i)
		port := 0
		if spec.BasePort != 0 {
			port = spec.BasePort + i
		}
		lp, err := StartPod(ctx, s, port)
		if err != nil {
			for _, p := range pods {
				p.Close()
			}
			return nil, err
		}
		pods = append(pods, lp)
	}
	return pods, nil
}

// newLivePod validates spec and builds a pod with its metrics, not yet
// listening or driven.
func newLivePod(spec PodSpec) (*LivePod, http.Handler, error) {
	pod, err := NewPod(spec.Pod)
	if err != nil {
		return nil, nil, err
	}
	names, err := ParseMetricNames(string(spec.Metrics))
	if err != nil {
		return nil, nil, err
	}
	if spec.TimeScale < 0 {
		return nil, nil, fmt.Errorf("sim: time scale %v is negative", spec.TimeScale)
	}
	if spec.DefaultMaxTokens < 0 {
		return nil, nil, fmt.Errorf("sim: default max tokens %d is negative", spec.DefaultMaxTokens)
	}
	lp := &LivePod{
		pod:     pod,
		spec:    spec,
		scale:   spec.TimeScale,
		kick:    make(chan struct{}, 1),
		driven:  make(chan struct{}),
		changed: make(chan struct{}),
	}
	if lp.scale == 0 {
		lp.scale = 1
	}
	constLabels := prometheus.Labels{}
	if spec.LabelMetrics {
		maps.Copy(constLabels, spec.Pod.Labels)
		constLabels["pod"] = spec.Pod.Name
	}
	maps.Copy(constLabels, spec.ConstLabels)
	for name := range constLabels {
		// Scrapers that predate UTF-8 names (GIE, older Prometheus) reject
		// anything else.
		if !model.LabelName(name).IsValidLegacy() {
			return nil, nil, fmt.Errorf("sim: pod %s: metric label %q is not a valid Prometheus label name", spec.Pod.Name, name)
		}
	}
	reg := prometheus.NewRegistry()
	lp.metrics = newPodCollector(lp, names, constLabels)
	if err := reg.Register(lp.metrics); err != nil {
		return nil, nil, fmt.Errorf("sim: pod %s: metrics: %w", spec.Pod.Name, err)
	}
	return lp, promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// StartPod starts one live pod listening on spec.Host:port (0 for an
// ephemeral port). spec.Pod.Name is used as is.
func StartPod(ctx context.Context, spec PodSpec, port int) (*LivePod, error) {
	lp, metrics, err := newLivePod(spec)
	if err != nil {
		return nil, err
	}
	host := spec.Host
	if host == "" {
		host = "127.0.0.1"
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return nil, fmt.Errorf("sim: pod %s: %w", spec.Pod.Name, err)
	}
	lp.ln = ln
	lp.srv = &http.Server{
		Handler:           lp.routes(metrics),
		ReadHeaderTimeout: 10 * time.Second,
	}
	dctx, stop := context.WithCancel(context.Background())
	lp.stop, lp.stopping = stop, dctx.Done()
	lp.start = time.Now()
	go lp.drive(dctx)
	go lp.srv.Serve(ln)
	unhook := context.AfterFunc(ctx, func() { lp.Close() })
	lp.mu.Lock() // the hook may already be running Close
	lp.unhook = unhook
	lp.mu.Unlock()
	return lp, nil
}

// Name is the pod's name.
func (lp *LivePod) Name() string { return lp.pod.Name() }

// Addr is the pod's host:port.
func (lp *LivePod) Addr() string { return lp.ln.Addr().String() }

// URL is the pod's base URL, e.g. "http://127.0.0.1:41234".
func (lp *LivePod) URL() string { return "http://" + lp.Addr() }

// Model is the served base model name.
func (lp *LivePod) Model() string { return lp.pod.Model() }

// Labels are the pod's labels from its configuration.
func (lp *LivePod) Labels() map[string]string { return lp.pod.cfg.Labels }

// Config is the pod's configuration.
func (lp *LivePod) Config() PodConfig { return lp.pod.Config() }

// Metrics returns a snapshot of the pod's state.
func (lp *LivePod) Metrics() Metrics {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.pod.Metrics()
}

// WaitFor blocks until cond holds for the pod's metrics, re-checking
// whenever the pod's state changes (a request arrives, a step begins or
// ends, a request is cancelled, faults change), and returns the metrics
// that satisfied it. It returns ctx's error if ctx ends first. Tests use it
// to wait for a state ("one request waiting", "all done") without sleeping.
// cond runs with the pod locked and must not call the pod.
func (lp *LivePod) WaitFor(ctx context.Context, cond func(Metrics) bool) (Metrics, error) {
	for {
		lp.mu.Lock()
		m := lp.pod.Metrics()
		ok := cond(m)
		changed := lp.changed
		lp.watched = true
		lp.mu.Unlock()
		if ok {
			return m, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return m, ctx.Err()
		}
	}
}

// change wakes WaitFor callers. Called with mu held.
func (lp *LivePod) change() {
	if !lp.watched {
		return
	}
	close(lp.changed)
	lp.changed = make(chan struct{})
	lp.watched = false
}

// Faults returns the faults in force.
func (lp *LivePod) Faults() Faults {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.pod.Faults()
}

// SetFaults replaces the faults in force, effective from the next request
// (rates) or the next step (slowness, hang, crash).
func (lp *LivePod) SetFaults(f Faults) error {
	lp.mu.Lock()
	err := lp.pod.SetFaults(f)
	lp.change()
	lp.mu.Unlock()
	lp.wake()
	return err
}

// SetServed changes the adapters the pod has registered and the longest
// request it accepts (Pod.SetServed): what /v1/models answers from now on.
func (lp *LivePod) SetServed(adapters []string, maxModelLen int) error {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lp.pod.SetServed(adapters, maxModelLen)
}

// Close stops the pod: the listener and every connection close at once,
// in-flight streams are cut, and the driver exits. It is safe to call more
// than once.
func (lp *LivePod) Close() error {
	var err error
	lp.closeOnce.Do(func() {
		lp.mu.Lock()
		unhook := lp.unhook
		lp.mu.Unlock()
		if unhook != nil {
			unhook()
		}
		lp.stop()
		err = lp.srv.Close()
		<-lp.driven
	})
	return err
}

func (lp *LivePod) wake() {
	select {
	case lp.kick <- struct{}{}:
	default:
	}
}

// now is model time: wall time since start × scale, never before the end
// of the last step.
func (lp *LivePod) now() time.Duration {
	return max(time.Duration(float64(time.Since(lp.start))*lp.scale), lp.lastEnd)
}

// drive runs engine steps on the wall clock: each step's model duration is
// slept (divided by the time scale) before its progress is applied, like
// a GPU busy for that long.
func (lp *LivePod) drive(ctx context.Context) {
	defer close(lp.driven)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		lp.mu.Lock()
		begin := lp.now()
		d, ok := lp.pod.BeginStep(begin)
		if ok {
			lp.change() // waiting requests may have been admitted
		}
		lp.mu.Unlock()
		if !ok {
			select {
			case <-ctx.Done():
				return
			case <-lp.kick:
				continue
			}
		}
		end := begin + d
		if wait := time.Until(lp.start.Add(time.Duration(float64(end) / lp.scale))); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		lp.mu.Lock()
		lp.lastEnd = max(lp.lastEnd, end)
		lp.dispatch(lp.pod.EndStep(end))
		lp.change()
		lp.mu.Unlock()
	}
}

// dispatch hands events to their waiting handlers. Called with mu held.
func (lp *LivePod) dispatch(evs []Event) {
	for i := range evs {
		ev := &evs[i]
		lr, ok := ev.Tag.(*liveRequest)
		if !ok {
			continue
		}
		lr.tokens = ev.Tokens
		if ev.Kind != EventToken {
			lr.done = true
			lr.out = ev.Outcome
			lp.metrics.observe(&ev.Outcome)
			if lp.spec.OnOutcome != nil {
				lp.spec.OnOutcome(ev.Outcome)
			}
		}
		select {
		case lr.notify <- struct{}{}:
		default:
		}
	}
}

// submit queues a request; the error is the pod's refusal.
func (lp *LivePod) submit(lr *liveRequest, stream bool) error {
	lp.mu.Lock()
	lp.nextID++
	lr.req.ID = lp.pod.Name() + "-" + strconv.FormatUint(lp.nextID, 10)
	err := lp.pod.Submit(lp.now(), &lr.req, lr)
	if err == nil && stream {
		lp.pod.Watch(&lr.req)
	}
	lp.change()
	lp.mu.Unlock()
	if err == nil {
		lp.wake()
	}
	return err
}

// progress reads a request's progress.
func (lp *LivePod) progress(lr *liveRequest) (tokens int, done bool, out Outcome) {
	lp.mu.Lock()
	defer lp.mu.Unlock()
	return lr.tokens, lr.done, lr.out
}

// cancel withdraws a request whose client went away.
func (lp *LivePod) cancel(lr *liveRequest) {
	lp.mu.Lock()
	evs, _ := lp.pod.Cancel(lp.now(), &lr.req)
	lp.dispatch(evs)
	lp.change()
	lp.mu.Unlock()
}

// await is wait for a handler: when the client went away it cancels the
// request and reports false; when the pod stopped it cancels the request
// and aborts the handler (the connection drops, as a crashed server's
// would).
func (lp *LivePod) await(r *http.Request, lr *liveRequest) bool {
	if err := lp.wait(r.Context(), lr); err != nil {
		lp.cancel(lr)
		if errors.Is(err, errPodStopped) {
			panic(http.ErrAbortHandler)
		}
		return false
	}
	return true
}

// wait blocks until the request makes progress; it returns errClientGone
// or errPodStopped if that happens first.
func (lp *LivePod) wait(ctx context.Context, lr *liveRequest) error {
	select {
	case <-lr.notify:
		return nil
	case <-ctx.Done():
		return errClientGone
	case <-lp.stopping:
		return errPodStopped
	}
}

var (
	errClientGone = errors.New("client went away")
	errPodStopped = errors.New("pod stopped")
)

// StartFleet starts one live pod per pod of the fleet, on consecutive
// ports from spec.BasePort (ephemeral ports if 0), all or nothing.
// spec.Pod is ignored; each pod's configuration comes from the fleet.
func StartFleet(ctx context.Context, f *Fleet, spec PodSpec) ([]*LivePod, error) {
	cfgs, err := f.PodConfigs()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	return startAll(ctx, spec, cfgs)
}

// StaticEndpoints describes live pods as a Meridian StaticEndpoints
// object named name, ready to add to a configuration directory: one
// endpoint per pod with its address and labels.
func StaticEndpoints(name string, pods []*LivePod) ([]byte, error) {
	obj := config.StaticEndpoints{
		APIVersion: config.MeridianV1Alpha1,
		Kind:       config.KindStaticEndpoints,
		Metadata:   config.Metadata{Name: name},
	}
	for _, p := range pods {
		obj.Spec.Endpoints = append(obj.Spec.Endpoints, config.StaticEndpoint{
			Name: p.Name(), Address: p.Addr(), Labels: p.Labels(),
		})
	}
	b, err := yaml.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("sim: static endpoints: %w", err)
	}
	return b, nil
}
