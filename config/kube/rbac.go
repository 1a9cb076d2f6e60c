package kube

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
)

// ReaderRules are what a Source needs in its namespace (a Role): list
// and watch on every resource it reads, and create and patch on events to
// report refusals.
func ReaderRules() []rbacv1.PolicyRule {
	return rules([]string{"list", "watch"})
}

// RunnerRules are what Tier-1 and Tier-2 need on the Kubernetes source
// (the Helm chart's Role): ReaderRules, and for Tier-2's canary analysis
// update on InferenceModelRewrites (a rollout's steps) and get, create and
// update on ConfigMaps (the guard that makes concurrent writers conflict).
func RunnerRules() []rbacv1.PolicyRule {
	return append(ReaderRules(),
		rbacv1.PolicyRule{APIGroups: []string{"inference.networking.x-k8s.io"}, Resources: []string{"inferencemodelrewrites"}, Verbs: []string{"update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update"}})
}

// WriterRules are what `meridian config apply` and `meridian canary` need
// in the namespace: ReaderRules' resources with every write, and the
// guard ConfigMap.
func WriterRules() []rbacv1.PolicyRule {
	return rules([]string{"get", "list", "watch", "create", "update", "patch", "delete"})
}

func rules(verbs []string) []rbacv1.PolicyRule {
	byGroup := map[string][]string{}
	var groups []string
	for _, r := range Resources {
		if _, ok := byGroup[r.Group]; !ok {
			groups = append(groups, r.Group)
		}
		if !slices.Contains(byGroup[r.Group], r.Resource) {
			byGroup[r.Group] = append(byGroup[r.Group], r.Resource)
		}
	}
	var out []rbacv1.PolicyRule
	for _, g := range groups {
		out = append(out, rbacv1.PolicyRule{APIGroups: []string{g}, Resources: byGroup[g], Verbs: verbs})
	}
	return append(out, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}})
}
