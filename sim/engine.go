package sim

import (
	"errors"
	"fmt"
	"time"
)

// Engine is a deterministic discrete-event simulator: pods advance step by
// step on a virtual clock, and callers schedule their own work (arrivals,
// metric scrapes, routing decisions) at virtual times. Nothing sleeps; a
// run of thousands of requests takes seconds of CPU.
//
// Events at equal times run in the order they were scheduled, and every
// pod draws from its own seeded random source, so two runs with the same
// inputs produce identical outcomes.
//
// An Engine runs on the goroutine that calls Run; callbacks run on it too
// and may call any Engine method. It is not safe for concurrent use.
type Engine struct {
	now     time.Duration
	queue   []event
	nextSeq uint64
	pending int // scheduled events that are not periodic
	pods    []*Pod
	seed    uint64
	stopped bool
}

type event struct {
	at       time.Duration
	seq      uint64
	fn       func()
	periodic bool
}

// NewEngine returns an engine at virtual time 0. seed is mixed into the
// seed of every pod added with AddPod.
func NewEngine(seed uint64) *Engine {
	return &Engine{seed: seed}
}

// Now is the current virtual time.
func (e *Engine) Now() time.Duration { return e.now }

// AddPod builds a pod from cfg and attaches it to the engine. The pod's
// seed is cfg.Seed mixed with the engine seed and the pod's index, so
// pods in one fleet draw independent faults.
func (e *Engine) AddPod(cfg PodConfig) (*Pod, error) {
	cfg.Seed = cfg.Seed ^ e.seed*0x9e3779b97f4a7c15 ^ uint64(len(e.pods)+1)*0xbf58476d1ce4e5b9
	p, err := NewPod(cfg)
	if err != nil {
		return nil, err
	}
	p.engine = e
	p.stepEnd = func() { e.endStep(p) }
	e.pods = append(e.pods, p)
	return p, nil
}

// Pods returns the attached pods in the order they were added.
func (e *Engine) Pods() []*Pod { return e.pods }

// At schedules f at virtual time t. A time in the past runs at Now, after
// what is already due.
func (e *Engine) At(t time.Duration, f func()) {
	e.push(max(t, e.now), f, false)
}

// After schedules f d after Now.
func (e *Engine) After(d time.Duration, f func()) { e.At(e.now+d, f) }

// Every calls f at Now+period, Now+2×period, ... for as long as other work
// is scheduled: periodic callbacks alone do not keep Run going. The
// returned function stops them.
func (e *Engine) Every(period time.Duration, f func()) (stop func()) {
	if period <= 0 {
		panic(fmt.Sprintf("sim: Every with non-positive period %v", period))
	}
	stopped := false
	var tick func()
	tick = func() {
		if stopped {
			return
		}
		f()
		e.push(e.now+period, tick, true)
	}
	e.push(e.now+period, tick, true)
	return func() { stopped = true }
}

// Submit hands r to pod p at Now; done is called once, on the engine's
// goroutine, with its outcome: at completion, at failure, or (for an
// immediate refusal) at Now after the current callback returns.
func (e *Engine) Submit(p *Pod, r *Request, done func(Outcome)) {
	var err error
	if p.engine != e {
		err = fmt.Errorf("pod %s was not added to this engine: %w", p.Name(), ErrInvalidRequest)
	} else {
		err = p.Submit(e.now, r, done)
	}
	if err != nil {
		o := Outcome{Request: r, Pod: p.Name(), Arrival: e.now, FirstToken: -1, Finish: e.now, Err: err}
		e.push(e.now, func() { done(o) }, false)
		return
	}
	e.kick(p)
}

// SubmitFirst is Submit with first also called, on the engine's
// goroutine at the virtual time of r's first token, when r gets one
// before it ends (a streaming client seeing its first token). A request
// that ends in the step of its first token (one output token) reports
// only done.
func (e *Engine) SubmitFirst(p *Pod, r *Request, first func(), done func(Outcome)) {
	if p.engine != e {
		e.Submit(p, r, done)
		return
	}
	w := &firstWatch{first: first, done: done}
	if err := p.Submit(e.now, r, w); err != nil {
		o := Outcome{Request: r, Pod: p.Name(), Arrival: e.now, FirstToken: -1, Finish: e.now, Err: err}
		e.push(e.now, func() { done(o) }, false)
		return
	}
	p.WatchFirst(r)
	e.kick(p)
}

// firstWatch is the tag of a request submitted with SubmitFirst.
type firstWatch struct {
	first func()
	done  func(Outcome)
}

// SetFaults changes p's faults at Now; clearing Hang resumes it.
func (e *Engine) SetFaults(p *Pod, f Faults) error {
	if err := p.SetFaults(f); err != nil {
		return err
	}
	e.kick(p)
	return nil
}

// Cancel withdraws r from p at Now, as a client that times out would: its
// done callback gets an error wrapping ErrCancelled, at once if r was
// waiting or between steps, at the end of the current step if r is in it.
// It reports whether r was in p.
func (e *Engine) Cancel(p *Pod, r *Request) bool {
	evs, ok := p.Cancel(e.now, r)
	deliver(evs)
	return ok
}

// Run processes events until no work is left, then fails any request
// still inside a pod (one that hung) with ErrUnfinished. It returns the
// final virtual time.
func (e *Engine) Run() time.Duration {
	e.run(-1)
	for _, p := range e.pods {
		if p.inStep {
			continue // cannot happen once the queue is empty
		}
		deliver(p.Drain(e.now, ErrUnfinished))
	}
	return e.now
}

// RunUntil processes every event due at or before t, periodic ones
// included, then sets Now to t. Requests in flight stay in flight; call Run
// or RunUntil again to go on.
func (e *Engine) RunUntil(t time.Duration) {
	e.run(t)
	if t > e.now {
		e.now = t
	}
}

// Stop makes Run and RunUntil return after the event being processed,
// leaving the rest unprocessed; Run then fails the requests still in the
// pods with ErrUnfinished. A replay that already knows its answer uses it
// to skip the rest of the trace.
func (e *Engine) Stop() { e.stopped = true }

// run processes events in order: all due at or before limit if limit is
// not negative, else until only periodic ones are left.
func (e *Engine) run(limit time.Duration) {
	for len(e.queue) > 0 && !e.stopped {
		if limit < 0 && e.pending == 0 || limit >= 0 && e.queue[0].at > limit {
			return
		}
		ev := e.pop()
		e.now = max(e.now, ev.at)
		if !ev.periodic {
			e.pending--
		}
		ev.fn()
	}
}

// kick starts a step on an idle pod that has work.
func (e *Engine) kick(p *Pod) {
	if p.stepping {
		return
	}
	d, ok := p.BeginStep(e.now)
	if !ok {
		return
	}
	p.stepping = true
	p.stepEndAt = e.now + d
	e.push(e.now+d, p.stepEnd, false)
}

func (e *Engine) endStep(p *Pod) {
	evs := p.EndStep(e.now)
	p.stepping = false
	deliver(evs)
	e.kick(p)
}

// deliver calls the done callbacks of finished requests. Submit stored
// each request's callback as its tag.
func deliver(evs []Event) {
	for i := range evs {
		if w, ok := evs[i].Tag.(*firstWatch); ok {
			switch {
			case evs[i].Kind == EventToken:
				if w.first != nil {
					w.first()
				}
			case w.done != nil:
				w.done(evs[i].Outcome)
			}
			continue
		}
		if evs[i].Kind == EventToken {
			continue
		}
		if done, ok := evs[i].Tag.(func(Outcome)); ok && done != nil {
			done(evs[i].Outcome)
		}
	}
}

func (e *Engine) push(at time.Duration, fn func(), periodic bool) {
	if !periodic {
		e.pending++
	}
	e.nextSeq++
	e.queue = append(e.queue, event{at: at, seq: e.nextSeq, fn: fn, periodic: periodic})
	// sift up
	q := e.queue
	i := len(q) - 1
	for i > 0 {
		parent := (i - 1) / 2
		if !q[i].before(&q[parent]) {
			break
		}
		q[i], q[parent] = q[parent], q[i]
		i = parent
	}
}

func (e *Engine) pop() event {
	q := e.queue
	top := q[0]
	last := len(q) - 1
	q[0] = q[last]
	q[last] = event{}
	q = q[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(q) {
			break
		}
		m := l
		if r := l + 1; r < len(q) && q[r].before(&q[l]) {
			m = r
		}
		if !q[m].before(&q[i]) {
			break
		}
		q[i], q[m] = q[m], q[i]
		i = m
	}
	e.queue = q
	return top
}

func (a *event) before(b *event) bool {
	if a.at != b.at {
		return a.at < b.at
	}
	return a.seq < b.seq
}

// Failed reports whether an outcome is a failure of the given kind; it is
// errors.Is on Outcome.Err.
func (o *Outcome) Failed(reason error) bool { return errors.Is(o.Err, reason) }
