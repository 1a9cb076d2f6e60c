package config

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ChangeOp is what a change does to one object.
type ChangeOp string

const (
	OpCreate ChangeOp = "create"
	OpUpdate ChangeOp = "update"
	OpDelete ChangeOp = "delete"
)

// Change is one object's difference between the stored and the desired
// configuration.
type Change struct {
	Op  ChangeOp
	Key ObjectKey
	Old []byte // canonical JSON, nil for OpCreate
	New []byte // canonical JSON, nil for OpDelete
}

// Plan is a validated set of changes against the state it was read from.
type Plan struct {
	Prefix   string
	Revision int64 // etcd revision the plan was computed against
	Changes  []Change
	// Result is the snapshot the store would hold after the plan.
	Result *Snapshot

	guardRev int64
	modRevs  map[string]int64
}

// Store writes configuration to etcd. Writes are all-or-nothing and guarded
// by the revision that was read, so two operators applying at once never
// lose an update: the second gets ErrConflict.
type Store struct {
	Client *clientv3.Client
	// Prefix under which objects live. Empty means DefaultPrefix.
	Prefix string
}

// Load returns the snapshot stored in etcd (validated) and its revision.
func (s *Store) Load(ctx context.Context) (*Snapshot, error) {
	prefix := normPrefix(s.Prefix)
	st, err := readState(ctx, s.Client, prefix)
	if err != nil {
		return nil, err
	}
	objs := make(map[string][]byte, len(st.Objects))
	for k, o := range st.Objects {
		objs[k] = o.Value
	}
	return buildFrom(prefix, objs, st.Revision)
}

// PlanApply computes the changes that make etcd hold docs (created or
// replaced; objects not named are kept) and deletes the named keys. The
// whole resulting configuration is validated first; an invalid result is
// returned as Errors and nothing is planned.
func (s *Store) PlanApply(ctx context.Context, docs []Document, deletes []ObjectKey) (*Plan, error) {
	prefix := normPrefix(s.Prefix)
	st, err := readState(ctx, s.Client, prefix)
	if err != nil {
		return nil, err
	}
	return planFrom(prefix, st, docs, deletes)
}

// Mutate reads the stored configuration, lets fn change one object, and
// plans the write. fn receives the current object's JSON (nil when absent)
// and returns the new document, or nil to delete it. It is the building
// block of read-modify-write commands such as `meridian canary`.
func (s *Store) Mutate(ctx context.Context, key ObjectKey, fn func(cur []byte) ([]byte, error)) (*Plan, error) {
	prefix := normPrefix(s.Prefix)
	st, err := readState(ctx, s.Client, prefix)
	if err != nil {
		return nil, err
	}
	var cur []byte
	if o, ok := st.Objects[KeyOf(prefix, key)]; ok {
		cur = o.Value
	}
	next, err := fn(cur)
	if err != nil {
		return nil, err
	}
	if next == nil {
		return planFrom(prefix, st, nil, []ObjectKey{key})
	}
	docs, errs := Decode(KeyOf(prefix, key), next)
	if len(errs) > 0 {
		return nil, errs
	}
	if len(docs) != 1 || docs[0].Key != key {
		return nil, fmt.Errorf("config: mutate %s: the new document must be that object", key)
	}
	return planFrom(prefix, st, docs, nil)
}

func planFrom(prefix string, st *etcdState, docs []Document, deletes []ObjectKey) (*Plan, error) {
	next := make(map[string][]byte, len(st.Objects)+len(docs))
	modRevs := make(map[string]int64, len(st.Objects))
	for k, o := range st.Objects {
		next[k] = o.Value
		modRevs[k] = o.ModRev
	}
	for _, d := range docs {
		if d.Key.Kind == KindEndpointPicker && d.Key.Name == "" {
			return nil, Errors{{Origin: d.Origin, Object: d.Key.String(), Path: "metadata.name", Msg: "required to store an EndpointPickerConfig in etcd"}}
		}
		next[KeyOf(prefix, d.Key)] = d.JSON
	}
	for _, k := range deletes {
		key := KeyOf(prefix, k)
		if _, ok := next[key]; !ok {
			return nil, fmt.Errorf("config: delete %s: not found", k)
		}
		delete(next, key)
	}
	// Validate the whole result, naming documents by their source where
	// they came from a file.
	var all []Document
	origins := map[string]Document{}
	for _, d := range docs {
		origins[KeyOf(prefix, d.Key)] = d
	}
	var errs Errors
	for _, k := range slices.Sorted(maps.Keys(next)) {
		if strings.HasPrefix(strings.TrimPrefix(k, prefix), "_") {
			continue
		}
		if d, ok := origins[k]; ok {
			all = append(all, d)
			continue
		}
		ds, e := Decode(k, next[k])
		errs = append(errs, e...)
		all = append(all, ds...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	result, err := Build(all, st.Revision)
	if err != nil {
		return nil, err
	}
	p := &Plan{Prefix: prefix, Revision: st.Revision, Result: result, guardRev: st.GuardRev, modRevs: modRevs}
	for _, k := range slices.Sorted(maps.Keys(next)) {
		old, had := st.Objects[k]
		switch {
		case !had:
			p.Changes = append(p.Changes, Change{Op: OpCreate, Key: keyFrom(prefix, k), New: next[k]})
		case !jsonEqual(old.Value, next[k]):
			p.Changes = append(p.Changes, Change{Op: OpUpdate, Key: keyFrom(prefix, k), Old: old.Value, New: next[k]})
		}
	}
	for _, k := range slices.Sorted(maps.Keys(st.Objects)) {
		if _, ok := next[k]; !ok {
			p.Changes = append(p.Changes, Change{Op: OpDelete, Key: keyFrom(prefix, k), Old: st.Objects[k].Value})
		}
	}
	sort.SliceStable(p.Changes, func(i, j int) bool { return p.Changes[i].Key.String() < p.Changes[j].Key.String() })
	return p, nil
}

func keyFrom(prefix, k string) ObjectKey {
	kind, name, _ := strings.Cut(strings.TrimPrefix(k, prefix), "/")
	return ObjectKey{Kind: kind, Name: name}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return bytes.Equal(a, b)
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return bytes.Equal(xa, ya)
}

// Commit writes a plan in one transaction. It fails with ErrConflict when
// anything the plan read has changed since. A plan with no changes
// succeeds without writing.
func (s *Store) Commit(ctx context.Context, p *Plan) (int64, error) {
	if len(p.Changes) == 0 {
		return p.Revision, nil
	}
	guard := p.Prefix + guardKey
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(guard), "=", p.guardRev)}
	var ops []clientv3.Op
	for _, c := range p.Changes {
		key := KeyOf(p.Prefix, c.Key)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", p.modRevs[key]))
		if c.Op == OpDelete {
			ops = append(ops, clientv3.OpDelete(key))
		} else {
			ops = append(ops, clientv3.OpPut(key, string(c.New)))
		}
	}
	ops = append(ops, clientv3.OpPut(guard, fmt.Sprint(p.Revision)))
	resp, err := s.Client.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, etcdErr(ctx, "txn", err)
	}
	if !resp.Succeeded {
		return 0, ErrConflict
	}
	return resp.Header.Revision, nil
}

// Describe renders a plan's changes for people, one block per object, with
// changed fields shown as JSON lines.
func (p *Plan) Describe() string {
	if len(p.Changes) == 0 {
		return "no changes\n"
	}
	var b strings.Builder
	for _, c := range p.Changes {
		fmt.Fprintf(&b, "%s %s\n", c.Op, c.Key)
		if c.Op == OpUpdate {
			for _, ln := range lineDiff(indentJSON(c.Old), indentJSON(c.New)) {
				b.WriteString("    " + ln + "\n")
			}
		}
	}
	return b.String()
}

func indentJSON(b []byte) []string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return strings.Split(string(b), "\n")
	}
	out, _ := json.MarshalIndent(v, "", "  ")
	return strings.Split(string(out), "\n")
}

// lineDiff is a small LCS line diff; objects are small.
func lineDiff(a, b []string) []string {
	n, m := len(a), len(b)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var out []string
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && a[i] == b[j]:
			i++
			j++
		case j < m && (i == n || lcs[i][j+1] >= lcs[i+1][j]):
			out = append(out, "+ "+b[j])
			j++
		default:
			out = append(out, "- "+a[i])
			i++
		}
	}
	return out
}
