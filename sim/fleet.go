package sim

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"strconv"
	"time"

	"sigs.k8s.io/yaml"
)

// Fleet is a set of simulated pods described in YAML, e.g.
//
//	pools:
//	- name: h100
//	  profile: h100
//	  model: meta-llama/Llama-3.1-8B-Instruct
//	  adapters: [sql-lora, chat-lora]
//	  count: 4
//	  labels: {gpu: h100, region: us-east-1}
//	- name: a10g
//	  profile: a10g
//	  count: 4
//	  overrides: {maxLoRAs: 8, adapterLoadTime: 60ms}
//	prices: {h100: 6.88, a10g: 1.01}
//
// Unknown fields are errors.
type Fleet struct {
	// Pools are groups of identical pods.
	Pools []FleetPool `json:"pools"`
	// Prices is the cost of one pod of a GPU profile per hour, keyed by
	// profile name, in whatever currency the operator pays in (only sums
	// are compared). `meridian plan capacity` uses it to choose the
	// cheapest mix of GPUs; the simulator and replays ignore it.
	Prices map[string]float64 `json:"prices,omitempty"`
}

// FleetPool is Count identical pods.
type FleetPool struct {
	// Name prefixes the pods' names: "<name>-0", "<name>-1", ...
	Name string `json:"name"`
	// Profile names a built-in GPU profile (see ProfileNames).
	Profile string `json:"profile"`
	// Model is the served model name; "" means the profile's model.
	Model string `json:"model,omitempty"`
	// Adapters are the LoRA adapters each pod serves.
	Adapters []string `json:"adapters,omitempty"`
	// Count is the number of pods; at least 1.
	Count int `json:"count"`
	// Labels are copied to every pod; "gpu" defaults to the profile name
	// and "pool" to the pool name.
	Labels map[string]string `json:"labels,omitempty"`
	// Overrides replace engine limits of the profile.
	Overrides *ProfileOverrides `json:"overrides,omitempty"`
	// Faults are injected into every pod of the pool from the start.
	Faults Faults `json:"faults,omitempty"`
}

// ProfileOverrides replaces selected engine limits of a built-in profile;
// nil fields keep the profile's value.
type ProfileOverrides struct {
	MaxNumSeqs       *int      `json:"maxNumSeqs,omitempty"`
	MaxBatchedTokens *int      `json:"maxBatchedTokens,omitempty"`
	MaxModelLen      *int      `json:"maxModelLen,omitempty"`
	MaxLoRAs         *int      `json:"maxLoRAs,omitempty"`
	NumGPUBlocks     *int      `json:"numGPUBlocks,omitempty"`
	BlockSize        *int      `json:"blockSize,omitempty"`
	AdapterLoadTime  *Duration `json:"adapterLoadTime,omitempty"`
}

// Duration is a time.Duration written as a Go duration string ("40ms").
type Duration struct{ time.Duration }

// UnmarshalJSON accepts a duration string such as "40ms" or "1.5s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"40ms\", got %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes the duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(d.String()) }

func (o *ProfileOverrides) apply(p *Profile) {
	if o == nil {
		return
	}
	set := func(dst *int, src *int) {
		if src != nil {
			*dst = *src
		}
	}
	set(&p.MaxNumSeqs, o.MaxNumSeqs)
	set(&p.MaxBatchedTokens, o.MaxBatchedTokens)
	set(&p.MaxModelLen, o.MaxModelLen)
	set(&p.MaxLoRAs, o.MaxLoRAs)
	set(&p.NumGPUBlocks, o.NumGPUBlocks)
	set(&p.BlockSize, o.BlockSize)
	if o.AdapterLoadTime != nil {
		p.AdapterLoadTime = o.AdapterLoadTime.Duration
	}
}

// LoadFleet reads and validates a fleet file.
func LoadFleet(path string) (*Fleet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	f, err := ParseFleet(b)
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", path, err)
	}
	return f, nil
}

// ParseFleet decodes fleet YAML strictly and validates it.
func ParseFleet(b []byte) (*Fleet, error) {
	var f Fleet
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, err
	}
	if _, err := f.PodConfigs(); err != nil {
		return nil, err
	}
	for name, price := range f.Prices {
		if _, err := LookupProfile(name); err != nil {
			return nil, fmt.Errorf("prices.%s: %w", name, err)
		}
		if !(price > 0) || math.IsInf(price, 0) {
			return nil, fmt.Errorf("prices.%s: %v, want a price per pod-hour > 0", name, price)
		}
	}
	return &f, nil
}

// PodConfigs expands the fleet into one PodConfig per pod, in file order.
func (f *Fleet) PodConfigs() ([]PodConfig, error) {
	if len(f.Pools) == 0 {
		return nil, fmt.Errorf("pools: at least one pool is required")
	}
	var out []PodConfig
	names := make(map[string]bool)
	for i, pool := range f.Pools {
		at := fmt.Sprintf("pools[%d]", i)
		if pool.Name == "" {
			return nil, fmt.Errorf("%s.name: required", at)
		}
		if names[pool.Name] {
			return nil, fmt.Errorf("%s.name: %q used twice", at, pool.Name)
		}
		names[pool.Name] = true
		if pool.Count < 1 {
			return nil, fmt.Errorf("%s.count: %d, want at least 1", at, pool.Count)
		}
		prof, err := LookupProfile(pool.Profile)
		if err != nil {
			return nil, fmt.Errorf("%s.profile: %w", at, err)
		}
		pool.Overrides.apply(&prof)
		if err := prof.Validate(); err != nil {
			return nil, fmt.Errorf("%s.overrides: %w", at, err)
		}
		if err := pool.Faults.Validate(); err != nil {
			return nil, fmt.Errorf("%s.faults: %w", at, err)
		}
		seen := make(map[string]bool)
		for j, a := range pool.Adapters {
			if a == "" || seen[a] {
				return nil, fmt.Errorf("%s.adapters[%d]: empty or repeated name %q", at, j, a)
			}
			seen[a] = true
		}
		if len(pool.Adapters) > 0 && prof.MaxLoRAs == 0 {
			return nil, fmt.Errorf("%s.adapters: profile %s has maxLoRAs 0", at, prof.Name)
		}
		for k := 0; k < pool.Count; k++ {
			labels := map[string]string{"gpu": prof.Name, "pool": pool.Name}
			maps.Copy(labels, pool.Labels)
			out = append(out, PodConfig{
				Name:     pool.Name + "-" + strconv.Itoa(k),
				Profile:  prof,
				Model:    pool.Model,
				Adapters: append([]string(nil), pool.Adapters...),
				Labels:   labels,
				Faults:   pool.Faults,
			})
		}
	}
	return out, nil
}

// AddFleet adds every pod of the fleet to the engine, in file order.
func (e *Engine) AddFleet(f *Fleet) ([]*Pod, error) {
	cfgs, err := f.PodConfigs()
	if err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	pods := make([]*Pod, 0, len(cfgs))
	for _, c := range cfgs {
		p, err := e.AddPod(c)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		pods = append(pods, p)
	}
	return pods, nil
}
