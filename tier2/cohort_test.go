package tier2

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/meridian-router/meridian/canary"
	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/rewrite"
	"github.com/meridian-router/meridian/rollout"
)

// The analysis reports the rollout's observed cohort beside its weight,
// warns when the key has too few values, and measures afresh when the
// salt changes.
func TestCanaryCohortReport(t *testing.T) {
	ctx := context.Background()
	rig := newCanaryRig(t, 1, false)
	t2 := rig.tier2[0]
	t2.round(ctx) // first sight of the rollout: its cohort starts empty
	send := func(tenants, each int) (onCanary int64) {
		st := t2.r.snap.Load()
		for i := range tenants {
			for range each {
				res, _ := st.resolver.Resolve(rewrite.Request{Model: "chat", Tenant: fmt.Sprint("team-", i)})
				t2.r.observeCohort(res) // as the request path does after resolving
				if res.Canary {
					onCanary++
				}
			}
		}
		return onCanary
	}
	report := func() rollout.Cohort {
		t.Helper()
		t2.round(ctx)
		l := t2.Latest()
		if len(l) != 1 || l[0].Cohort == nil {
			t.Fatalf("analysis without a cohort: %+v", l)
		}
		return *l[0].Cohort
	}

	// 5 tenants at step 1 (10%): 5 keys, fewer than the 10 the weight needs.
	on := send(5, 4)
	c := report()
	if c.Requests != 20 || c.CanaryRequests != on || c.Keys != 5 || c.WeightPercent != 10 || !strings.Contains(c.Warning, "only 5 distinct") {
		t.Fatalf("cohort of 5 tenants: %+v (want 20 requests, %d on the canary, 5 keys, weight 10, a warning)", c, on)
	}

	// A new salt is a new cohort: counting starts again.
	err := canary.NewEtcd(rig.store).Update(ctx, "chat", func(mr *config.ModelRewrite) error {
		mr.Spec.Stickiness = &config.Stickiness{Salt: "another"}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	rig.sync(t)
	t2.round(ctx)
	on = send(500, 1)
	c = report()
	if c.Requests != 500 || c.Keys != 500 || c.CanaryRequests != on || c.Warning != "" || c.RequestPercent < 6 || c.RequestPercent > 14 {
		t.Fatalf("cohort of 500 tenants after the salt changed: %+v (want 500 requests and keys, ~10%%, no warning)", c)
	}
}
