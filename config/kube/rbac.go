package kube

import (
	"slices"

	rbacv1 "k8s.io/api/rbac/v1"
)

// ReaderRules are what a Source needs in its namespace (a Role): get,
// list and watch on every resource it reads, and create on events to
// report refusals.
func ReaderRules() []rbacv1.PolicyRule {
	return rules([]string{"get", "list", "watch"})
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
