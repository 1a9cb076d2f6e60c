// Package prometheus ships Meridian's Prometheus configuration: the scrape
// configurations for Kubernetes and for the local platform, the recording
// rules behind the dashboard panels and the alert rules, all embedded so
// a binary or a test can lay them out without the source tree.
//
// It decides what Prometheus scrapes and which labels the series carry
// (model-server pods get `pool` from their pod label). It does not start
// Prometheus, and it does not know which addresses a platform runs on: the
// caller supplies the target lists.
package prometheus

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Files holds the shipped configuration, by path relative to
// deploy/prometheus.
//
//go:embed prometheus-kubernetes.yml prometheus-local.yml rules/recording.yml rules/alerts.yml rules/rules_test.yml
var Files embed.FS

// Paths of the shipped files inside Files.
const (
	KubernetesConfig = "prometheus-kubernetes.yml"
	LocalConfig      = "prometheus-local.yml"
	RecordingRules   = "rules/recording.yml"
	AlertRules       = "rules/alerts.yml"
	RulesTest        = "rules/rules_test.yml"
)

// Job names shared by both scrape configurations; dashboards and alerts
// select on them.
const (
	JobModelServers = "model-servers"
	JobMeridian     = "meridian"
)

// TargetGroup is one entry of a Prometheus file_sd target list: addresses
// (host:port) and the labels every series scraped from them carries.
type TargetGroup struct {
	Targets []string          `json:"targets"`
	Labels  map[string]string `json:"labels,omitempty"`
}

// LocalTargets is what a local Prometheus scrapes.
type LocalTargets struct {
	// ModelServers are the model-server pods. Each group must carry a
	// `pool` label: the queue-spread and prefix-hit panels group by it.
	ModelServers []TargetGroup
	// Meridian are Tier-1 and Tier-2 metrics listeners; a `tier` label is
	// customary. The job honours the series' own labels, so a target
	// label such as `region` only fills in where a series has none. Groups
	// must not carry `pool`: Tier-2 series without one would gain it.
	Meridian []TargetGroup
}

// Validate reports target groups that would break the panels.
func (t LocalTargets) Validate() error {
	var errs []error
	for i, g := range t.ModelServers {
		if g.Labels["pool"] == "" {
			errs = append(errs, fmt.Errorf("model servers[%d]: a pool label is required", i))
		}
		if len(g.Targets) == 0 {
			errs = append(errs, fmt.Errorf("model servers[%d]: no targets", i))
		}
	}
	for i, g := range t.Meridian {
		if _, ok := g.Labels["pool"]; ok {
			errs = append(errs, fmt.Errorf("meridian[%d]: a pool label would be added to Meridian series that have none (and mislead sum by (pool))", i))
		}
		if len(g.Targets) == 0 {
			errs = append(errs, fmt.Errorf("meridian[%d]: no targets", i))
		}
	}
	return errors.Join(errs...)
}

// WriteLocal lays out a configuration directory for a local Prometheus in
// dir: prometheus-local.yml, the rules it loads, and the target lists.
// It returns the path to pass as --config.file.
func WriteLocal(dir string, t LocalTargets) (string, error) {
	if err := t.Validate(); err != nil {
		return "", fmt.Errorf("prometheus: %w", err)
	}
	for _, name := range []string{LocalConfig, RecordingRules, AlertRules} {
		data, err := fs.ReadFile(Files, name)
		if err != nil {
			return "", fmt.Errorf("prometheus: %w", err)
		}
		if err := writeFile(filepath.Join(dir, name), data); err != nil {
			return "", err
		}
	}
	if err := WriteTargets(dir, t); err != nil {
		return "", err
	}
	return filepath.Join(dir, LocalConfig), nil
}

// WriteTargets replaces the target lists under dir/targets. Each file is
// written to a temporary name and renamed, so Prometheus, which watches
// them, never reads half a list.
func WriteTargets(dir string, t LocalTargets) error {
	if err := t.Validate(); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	for name, groups := range map[string][]TargetGroup{
		JobModelServers: t.ModelServers,
		JobMeridian:     t.Meridian,
	} {
		if groups == nil {
			groups = []TargetGroup{}
		}
		data, err := json.MarshalIndent(groups, "", "  ")
		if err != nil {
			return fmt.Errorf("prometheus: %w", err)
		}
		if err := writeFile(filepath.Join(dir, "targets", name+".json"), data); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	defer os.Remove(tmp.Name())
	// Readable by a Prometheus running as another user.
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("prometheus: %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("prometheus: %w", err)
	}
	return nil
}
