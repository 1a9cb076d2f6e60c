// Package rewrite decides which target model serves a public model name:
// it matches InferenceModelRewrite rules (GIE v1alpha2 shape) and assigns
// each caller to one weighted target, stickily. It also holds the pure part
// of a stepped canary: the analysis verdict from canary and stable
// statistics, and the rollout's step progression.
//
// What it decides: the target model, the clusters it may run in, and the
// public name to put back into the response. What it does not: where the
// request goes (regions picks a cluster, Tier-1 a pod), whether it is
// admitted (priority, ratelimit), or how a rollout is written to etcd
// (`meridian canary`). It does no I/O.
//
// Assignment differs from GIE on purpose. GIE draws a random target per
// request, so a conversation flips between versions and loses its prefix
// cache on every flip. Here a hash of the stickiness key (the tenant, or a
// header such as a session id) seeded with the rollout's salt picks the
// target, so a key stays on one target while the weights stand, and when a
// canary's weight grows only keys move onto it, never off it.
package rewrite

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"net/textproto"
	"slices"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"

	"github.com/meridian-router/meridian/config"
)

// MaxWeight is the largest target weight GIE accepts.
const MaxWeight = 1_000_000

// Header reads request headers; http.Header satisfies it. Get must not
// retain its argument.
type Header interface {
	Get(name string) string
}

// Request is what resolution reads from one request.
type Request struct {
	// Model is the body's "model", the public name.
	Model string
	// Tenant is the authenticated tenant; the default stickiness key.
	Tenant string
	// Header is read only when the matching rewrite's stickiness names a
	// header. Nil means no headers.
	Header Header
}

// Resolution is the outcome of resolving one request.
type Resolution struct {
	// Public is the name the caller asked for. The response's "model" must
	// say this, not Target.
	Public string
	// Target is the model to request upstream.
	Target string
	// Clusters restricts Target to these clusters (any Region). Nil means
	// any cluster serving Target. Shared and read only.
	Clusters []string
	// Rewrite names the InferenceModelRewrite that matched; empty when none
	// did.
	Rewrite string
	// Canary and Stable report that Target is the rewrite's rollout canary
	// or stable target (both false without a rollout), so the caller can
	// attribute the request's outcome to one side of the canary analysis.
	Canary, Stable bool
	// Key is the stickiness key the target was picked by (the tenant, or
	// the stickiness header's value); empty when no rule matched.
	Key string
}

// Resolver resolves public model names against one set of rewrites.
//
// Matching follows GIE: a rule whose matches name the model exactly beats
// a rule without model matches (which matches every model); two rules may
// not claim the same model, nor may two rules be generic. PoolRef is not
// consulted: resolution happens at Tier-2, before any pool is chosen.
//
// When a rewrite has a Rollout, the rollout's state, not the target
// weights, splits the rule that holds both its Stable and Canary targets:
// the pair's combined weight is divided by CanaryWeight (so an aborted or
// degraded canary gets nothing without rewriting the targets), other
// targets of the rule keep their weights, and the canary is placed last.
//
// It is
// safe for concurrent use; Update swaps the rewrites atomically, so a
// request resolves against either the old or the new set, never a mix. The
// zero Resolver matches nothing.
type Resolver struct {
	t atomic.Pointer[table]
}

// NewResolver builds a Resolver from a snapshot's rewrites (keyed by
// object name, as config.Snapshot.Rewrites).
func NewResolver(rewrites map[string]*config.ModelRewrite) (*Resolver, error) {
	r := &Resolver{}
	if err := r.Update(rewrites); err != nil {
		return nil, err
	}
	return r, nil
}

// Update replaces the rewrites. On error the previous rewrites stay in
// force.
func (r *Resolver) Update(rewrites map[string]*config.ModelRewrite) error {
	t, err := build(rewrites)
	if err != nil {
		return err
	}
	r.t.Store(t)
	return nil
}

// Resolve returns the target for req. ok is false when no rule matches; the
// Resolution then names req.Model as both Public and Target. Resolve does
// not allocate.
func (r *Resolver) Resolve(req Request) (res Resolution, ok bool) {
	res = Resolution{Public: req.Model, Target: req.Model}
	t := r.t.Load()
	if t == nil {
		return res, false
	}
	rt := t.exact[req.Model]
	if rt == nil {
		rt = t.generic
	}
	if rt == nil {
		return res, false
	}
	key := req.Tenant
	if rt.header != "" && req.Header != nil {
		if v := req.Header.Get(rt.header); v != "" {
			key = v
		}
	}
	tg := &rt.targets[rt.pick(key)]
	res.Target = tg.model
	res.Clusters = tg.clusters
	res.Rewrite = rt.rewrite
	res.Canary = tg.canary
	res.Stable = tg.stable
	res.Key = key
	return res, true
}

// table is one immutable set of compiled rules.
type table struct {
	exact   map[string]*route
	generic *route
}

// route is one rule, compiled.
type route struct {
	rewrite string
	header  string // canonical header name; empty: key on the tenant
	seed    uint64
	targets []target
	cum     []uint64 // cum[i] = sum of weights of targets[0..i]
}

type target struct {
	model          string
	clusters       []string
	canary, stable bool
}

// pick maps key to a target index. The hash is read as a fraction of 2^64
// and scaled to the total weight, so each target owns a fixed slice of the
// key space; the canary, kept last, owns the top slice, which only grows as
// its weight grows.
func (rt *route) pick(key string) int {
	var d xxhash.Digest
	d.ResetWithSeed(rt.seed)
	d.WriteString(key)
	total := rt.cum[len(rt.cum)-1]
	u, _ := bits.Mul64(d.Sum64(), total)
	for i, c := range rt.cum {
		if u < c {
			return i
		}
	}
	return len(rt.cum) - 1 // unreachable: u < total
}

func build(rewrites map[string]*config.ModelRewrite) (*table, error) {
	t := &table{exact: map[string]*route{}}
	owner := map[string]string{} // model → "rewrite rule" that claimed it
	genericOwner := ""
	names := slices.Sorted(maps.Keys(rewrites))
	for _, name := range names {
		mr := rewrites[name]
		if mr == nil {
			return nil, fmt.Errorf("rewrite: InferenceModelRewrite %q is nil", name)
		}
		if mr.Metadata.Name != "" {
			name = mr.Metadata.Name
		}
		sk, err := stickinessOf(mr.Spec.Stickiness)
		if err != nil {
			return nil, fmt.Errorf("rewrite: InferenceModelRewrite %q: spec.stickiness%w", name, err)
		}
		if ro := mr.Spec.Rollout; ro != nil {
			if _, _, err := CanaryWeight(*ro); err != nil {
				return nil, fmt.Errorf("rewrite: InferenceModelRewrite %q: spec.rollout: %w", name, err)
			}
		}
		for i, rule := range mr.Spec.Rules {
			where := fmt.Sprintf("InferenceModelRewrite %q: spec.rules[%d]", name, i)
			rt, err := compile(name, sk, mr.Spec.Rollout, rule)
			if err != nil {
				return nil, fmt.Errorf("rewrite: %s: %w", where, err)
			}
			generic := true
			for j, m := range rule.Matches {
				if m.Model == nil {
					continue
				}
				generic = false
				if m.Model.Type != "" && m.Model.Type != "Exact" {
					return nil, fmt.Errorf("rewrite: %s.matches[%d].model.type: only Exact is supported, got %q", where, j, m.Model.Type)
				}
				v := m.Model.Value
				if v == "" {
					return nil, fmt.Errorf("rewrite: %s.matches[%d].model.value: required", where, j)
				}
				if prev, dup := owner[v]; dup {
					return nil, fmt.Errorf("rewrite: %s.matches[%d]: model %q is already matched by %s", where, j, v, prev)
				}
				owner[v] = where
				t.exact[v] = rt
			}
			if generic {
				if genericOwner != "" {
					return nil, fmt.Errorf("rewrite: %s: a second rule without model matches; %s already matches every model", where, genericOwner)
				}
				genericOwner = where
				t.generic = rt
			}
		}
	}
	return t, nil
}

// stickiness is a rewrite's compiled Stickiness.
type stickiness struct {
	header string // canonical header name; empty: key on the tenant
	seed   uint64 // hash of the salt
}

// stickinessOf compiles st; its errors start with the field path below
// spec.stickiness.
func stickinessOf(st *config.Stickiness) (stickiness, error) {
	var sk stickiness
	salt := ""
	if st != nil {
		salt = st.Salt
		switch st.Key {
		case "", "tenant":
		case "header":
			if st.Header == "" {
				return sk, errors.New(".header: required when key is header")
			}
			sk.header = textproto.CanonicalMIMEHeaderKey(st.Header)
		default:
			return sk, fmt.Errorf(".key: want tenant or header, got %q", st.Key)
		}
	}
	// The salt is hashed once here; each request then seeds its hash with it.
	sk.seed = xxhash.Sum64String(salt)
	return sk, nil
}

// compile builds one rule; ro is the rewrite's rollout (nil if none),
// already checked.
func compile(name string, sk stickiness, ro *config.Rollout, rule config.RewriteRule) (*route, error) {
	if len(rule.Targets) == 0 {
		return nil, fmt.Errorf("targets: at least one target is required")
	}
	rt := &route{rewrite: name, header: sk.header, seed: sk.seed}

	weights := make([]int64, len(rule.Targets))
	canaryAt, stableAt := -1, -1
	for j, tg := range rule.Targets {
		if tg.ModelRewrite == "" {
			return nil, fmt.Errorf("targets[%d].modelRewrite: required", j)
		}
		if tg.Weight < 1 || tg.Weight > MaxWeight {
			return nil, fmt.Errorf("targets[%d].weight: must be 1..%d, got %d", j, MaxWeight, tg.Weight)
		}
		weights[j] = tg.Weight
		for k := 0; k < j; k++ {
			if rule.Targets[k].ModelRewrite == tg.ModelRewrite {
				return nil, fmt.Errorf("targets[%d].modelRewrite: %q is also targets[%d]", j, tg.ModelRewrite, k)
			}
		}
	}
	order := make([]int, len(rule.Targets))
	for j := range order {
		order[j] = j
	}
	if ro != nil {
		for j, tg := range rule.Targets {
			switch tg.ModelRewrite {
			case ro.Canary:
				canaryAt = j
			case ro.Stable:
				stableAt = j
			}
		}
		if canaryAt >= 0 && stableAt >= 0 {
			// The rollout, not the targets, holds this rule's split.
			if pct, fromRollout, _ := CanaryWeight(*ro); fromRollout {
				// Stable and canary split their combined weight by the
				// rollout's percentage; other targets of the rule keep
				// theirs. Weights are scaled by 100 so the split is exact.
				pair := weights[stableAt] + weights[canaryAt]
				for j := range weights {
					weights[j] *= 100
				}
				weights[canaryAt] = pair * pct
				weights[stableAt] = pair * (100 - pct)
			}
			// The canary goes last so that it owns the top of the key space.
			order = append(order[:canaryAt], order[canaryAt+1:]...)
			order = append(order, canaryAt)
		} else {
			canaryAt, stableAt = -1, -1
		}
	}
	var sum uint64
	for _, j := range order {
		if weights[j] == 0 {
			continue // a target at 0% gets no slice of the key space
		}
		tg := rule.Targets[j]
		sum += uint64(weights[j])
		rt.targets = append(rt.targets, target{
			model:    tg.ModelRewrite,
			clusters: clip(tg.Clusters),
			canary:   j == canaryAt,
			stable:   j == stableAt,
		})
		rt.cum = append(rt.cum, sum)
	}
	if sum == 0 {
		return nil, fmt.Errorf("targets: every target has weight 0")
	}
	return rt, nil
}

// clip copies a slice so the table owns it, mapping empty to nil.
func clip(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}
