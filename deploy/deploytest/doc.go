// Package deploytest holds the tests of Meridian's deployment artefacts:
// the Prometheus scrape configurations and rules (deploy/prometheus), the
// Grafana dashboard (deploy/grafana) and the Helm chart (deploy/helm) with
// its per-Region values files (deploy/examples/helm).
//
// The tests check the artefacts the way their consumers will read them:
// promtool checks and unit-tests the rules, the Prometheus Go parser parses
// every PromQL expression, Helm's Go library renders the chart, and every
// rendered manifest is decoded strictly into the Kubernetes API types. It
// also holds the metric-name contract: every series name a rule or panel
// selects must be named in docs/metrics.md. It has no code of its own
// beyond helpers for those tests.
package deploytest
