package tier1

import (
	"errors"
	"fmt"

	"github.com/meridian-router/meridian/config"
)

// Schedulers builds one Scheduler for each scheduler of gateway gw in snap,
// keyed by the model name it serves. pool is called once per scheduler name
// and should return the same Pool across reloads, so that endpoint state
// and the prefix index survive a configuration change.
func Schedulers(snap *config.Snapshot, gw *config.Gateway, pool func(scheduler string) *Pool, opts Options) (map[string]*Scheduler, error) {
	if snap == nil || gw == nil {
		return nil, errors.New("tier1: no snapshot or gateway")
	}
	out := make(map[string]*Scheduler, len(gw.Spec.Schedulers))
	var errs []error
	for i, sc := range gw.Spec.Schedulers {
		policy, ok := snap.Policy(gw.Metadata.Name, sc.Name)
		if !ok {
			errs = append(errs, fmt.Errorf("tier1: gateway %q scheduler %q (spec.schedulers[%d]): no resolved policy in the snapshot",
				gw.Metadata.Name, sc.Name, i))
			continue
		}
		s, err := NewScheduler(pool(sc.Name), sc, policy, withSchedulerOptions(opts, sc.Options))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if prev, dup := out[sc.ModelName]; dup {
			errs = append(errs, fmt.Errorf("tier1: gateway %q: schedulers %q and %q both serve model %q",
				gw.Metadata.Name, prev.Name(), sc.Name, sc.ModelName))
			continue
		}
		out[sc.ModelName] = s
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// withSchedulerOptions lays a scheduler's configured options over the
// process's: a field the configuration sets wins.
func withSchedulerOptions(o Options, c *config.SchedulerOptions) Options {
	if c == nil {
		return o
	}
	if c.Fallbacks != 0 {
		o.Fallbacks = c.Fallbacks
	}
	if c.MaxMetricsAge != 0 {
		o.MaxMetricsAge = c.MaxMetricsAge.D()
	}
	if c.QueueHalf != 0 {
		o.QueueHalf = c.QueueHalf
	}
	if c.RunningHalf != 0 {
		o.RunningHalf = c.RunningHalf
	}
	if c.QueueSaturation != 0 {
		o.QueueSaturation = c.QueueSaturation
	}
	if c.KVSaturation != 0 {
		o.KVSaturation = c.KVSaturation
	}
	if c.LatencyScale != 0 {
		o.LatencyScale = c.LatencyScale.D()
	}
	return o
}
