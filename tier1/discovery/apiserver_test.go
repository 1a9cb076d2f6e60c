package discovery

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// apiServer speaks the part of the Kubernetes API that a pod informer
// uses, over real HTTP on 127.0.0.1, so that client-go runs unmodified
// against it:
//
//   - list: GET /api/v1/namespaces/{ns}/pods (and /api/v1/pods) returns a
//     PodList carrying the current resourceVersion;
//   - watch: the same path with ?watch=true streams newline-delimited
//     {"type":"ADDED|MODIFIED|DELETED","object":{...}} events after the
//     requested resourceVersion;
//   - watch-list (client-go's WatchListClient feature, on by default since
//     v0.35): ?watch=true&sendInitialEvents=true first streams the current
//     pods as ADDED, then a BOOKMARK annotated
//     k8s.io/initial-events-end=true, then changes.
//
// labelSelector is honoured, including a pod moving into or out of the
// selection (ADDED / DELETED), as the real watch cache does.
type apiServer struct {
	srv  *httptest.Server
	stop chan struct{} // closed first on shutdown: ends open watches

	mu         sync.Mutex
	rv         int
	pods       map[string]corev1.Pod // by namespace/name
	history    []watchRecord
	changed    chan struct{} // closed and replaced on every change
	lists      int           // plain list requests
	watchLists int           // watch requests with sendInitialEvents=true
	forbidden  string        // when set, every request is refused as this service account's
	compacted  int           // watches from a resourceVersion below this get 410 Gone
	kick       chan struct{} // closed to end every open watch stream
}

type watchRecord struct {
	typ string // ADDED, MODIFIED, DELETED
	pod corev1.Pod
	old *corev1.Pod // previous state, for MODIFIED and DELETED
}

func startAPIServer(t *testing.T, pods ...corev1.Pod) *apiServer {
	t.Helper()
	a := &apiServer{
		stop:    make(chan struct{}),
		pods:    map[string]corev1.Pod{},
		changed: make(chan struct{}),
		kick:    make(chan struct{}),
	}
	for _, p := range pods {
		a.apply(p)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/namespaces/{ns}/pods", func(w http.ResponseWriter, r *http.Request) {
		a.serve(w, r, r.PathValue("ns"))
	})
	mux.HandleFunc("GET /api/v1/pods", func(w http.ResponseWriter, r *http.Request) {
		a.serve(w, r, "")
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.close)
	return a
}

func (a *apiServer) close() {
	select {
	case <-a.stop:
	default:
		close(a.stop)
	}
	a.srv.Close()
}

func (a *apiServer) URL() string { return a.srv.URL }

// forbid makes the server refuse every request with 403, as it does for a
// service account without a Role granting list and watch on pods.
func (a *apiServer) forbid(serviceAccount string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forbidden = serviceAccount
}

// permit undoes forbid.
func (a *apiServer) permit() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.forbidden = ""
}

// breakWatches ends every open watch stream, as an API-server restart or a
// load balancer's idle timeout does.
func (a *apiServer) breakWatches() {
	a.mu.Lock()
	defer a.mu.Unlock()
	close(a.kick)
	a.kick = make(chan struct{})
}

// compact forgets the change history: a watch from any resourceVersion
// before now gets 410 Gone, and the client must list again.
func (a *apiServer) compact() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.compacted = a.rv
}

func (a *apiServer) counts() (lists, watchLists int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.lists, a.watchLists
}

// apply adds a pod or replaces it, as a kubelet status update or a label
// change would.
func (a *apiServer) apply(p corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := p.Namespace + "/" + p.Name
	a.rv++
	p.TypeMeta = metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"}
	p.ResourceVersion = strconv.Itoa(a.rv)
	rec := watchRecord{typ: "ADDED", pod: p}
	if old, ok := a.pods[key]; ok {
		rec.typ, rec.old = "MODIFIED", &old
	}
	a.pods[key] = p
	a.record(rec)
}

// remove deletes a pod.
func (a *apiServer) remove(namespace, name string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	old, ok := a.pods[key]
	if !ok {
		return
	}
	a.rv++
	gone := old
	gone.ResourceVersion = strconv.Itoa(a.rv)
	delete(a.pods, key)
	a.record(watchRecord{typ: "DELETED", pod: gone, old: &old})
}

func (a *apiServer) record(rec watchRecord) {
	a.history = append(a.history, rec)
	close(a.changed)
	a.changed = make(chan struct{})
}

// current returns the pods of a namespace ("" = all) the selector matches,
// sorted, and the resourceVersion they are at. a.mu must be held.
func (a *apiServer) current(ns string, sel labels.Selector) []corev1.Pod {
	var out []corev1.Pod
	for _, p := range a.pods {
		if (ns == "" || p.Namespace == ns) && sel.Matches(labels.Set(p.Labels)) {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(x, y corev1.Pod) int {
		if x.Namespace != y.Namespace {
			if x.Namespace < y.Namespace {
				return -1
			}
			return 1
		}
		switch {
		case x.Name < y.Name:
			return -1
		case x.Name > y.Name:
			return 1
		}
		return 0
	})
	return out
}

func (a *apiServer) serve(w http.ResponseWriter, r *http.Request, ns string) {
	a.mu.Lock()
	sa := a.forbidden
	a.mu.Unlock()
	if sa != "" {
		writeStatus(w, http.StatusForbidden, "Forbidden", fmt.Sprintf(
			`pods is forbidden: User "system:serviceaccount:%s:%s" cannot list resource "pods" in API group "" in the namespace "%s"`, ns, sa, ns))
		return
	}
	q := r.URL.Query()
	sel, err := labels.Parse(q.Get("labelSelector"))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	if q.Get("watch") == "true" || q.Get("watch") == "1" {
		a.watch(w, r, ns, sel)
		return
	}
	a.mu.Lock()
	a.lists++
	list := corev1.PodList{
		TypeMeta: metav1.TypeMeta{Kind: "PodList", APIVersion: "v1"},
		ListMeta: metav1.ListMeta{ResourceVersion: strconv.Itoa(a.rv)},
		Items:    a.current(ns, sel),
	}
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(list)
}

type wireEvent struct {
	Type   string `json:"type"`
	Object any    `json:"object"`
}

func (a *apiServer) watch(w http.ResponseWriter, r *http.Request, ns string, sel labels.Selector) {
	q := r.URL.Query()
	sendInitial := q.Get("sendInitialEvents") == "true"
	from := q.Get("resourceVersion")

	a.mu.Lock()
	var initial []corev1.Pod
	next := len(a.history)
	switch {
	case sendInitial || from == "" || from == "0":
		// "Start at most recent" and watch-list both begin with the
		// current state as ADDED events.
		initial = a.current(ns, sel)
		if sendInitial {
			a.watchLists++
		}
	default:
		rv, err := strconv.Atoi(from)
		if err != nil || rv > a.rv {
			a.mu.Unlock()
			writeStatus(w, http.StatusBadRequest, "BadRequest", fmt.Sprintf("resourceVersion %q", from))
			return
		}
		if rv < a.compacted {
			a.mu.Unlock()
			writeStatus(w, http.StatusGone, "Expired", fmt.Sprintf("too old resource version: %d (%d)", rv, a.compacted))
			return
		}
		// history[i] is at resourceVersion i+1 (after the pods the
		// server started with, every change bumps it by one).
		next = rv
	}
	bookmarkRV := a.rv
	kick := a.kick
	a.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w) // one JSON document per line
	flusher := w.(http.Flusher)
	for _, p := range initial {
		if enc.Encode(wireEvent{"ADDED", p}) != nil {
			return
		}
	}
	if sendInitial {
		bookmark := corev1.Pod{
			TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{
				ResourceVersion: strconv.Itoa(bookmarkRV),
				Annotations:     map[string]string{metav1.InitialEventsAnnotationKey: "true"},
			},
		}
		if enc.Encode(wireEvent{"BOOKMARK", bookmark}) != nil {
			return
		}
	}
	flusher.Flush()

	for {
		a.mu.Lock()
		recs := a.history[next:]
		next = len(a.history)
		changed := a.changed
		a.mu.Unlock()
		for _, rec := range recs {
			typ, obj := project(rec, ns, sel)
			if typ == "" {
				continue
			}
			if enc.Encode(wireEvent{typ, obj}) != nil {
				return
			}
		}
		flusher.Flush()
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		case <-a.stop:
			return
		case <-kick:
			return
		}
	}
}

// project turns a change into what a watcher with this namespace and
// selector sees: the event, a move in or out of the selection, or nothing.
func project(rec watchRecord, ns string, sel labels.Selector) (string, corev1.Pod) {
	if ns != "" && rec.pod.Namespace != ns {
		return "", rec.pod
	}
	now := sel.Matches(labels.Set(rec.pod.Labels))
	before := rec.old != nil && sel.Matches(labels.Set(rec.old.Labels))
	switch rec.typ {
	case "ADDED":
		if now {
			return "ADDED", rec.pod
		}
	case "MODIFIED":
		switch {
		case now && before:
			return "MODIFIED", rec.pod
		case now:
			return "ADDED", rec.pod
		case before:
			return "DELETED", rec.pod
		}
	case "DELETED":
		if before {
			return "DELETED", rec.pod
		}
	}
	return "", rec.pod
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(metav1.Status{
		TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
		Status:   metav1.StatusFailure,
		Message:  msg,
		Reason:   metav1.StatusReason(reason),
		Code:     int32(code),
	})
}

// k8sPod builds a running model-server pod as the API server returns it,
// with the fields discovery ignores filled in too.
func k8sPod(ns, name, ip string, ready bool, lbls map[string]string) corev1.Pod {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns,
			Name:      name,
			UID:       types.UID("uid-" + ns + "-" + name),
			Labels:    lbls,
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:  "vllm",
			Image: "vllm/vllm-openai:latest",
			Ports: []corev1.ContainerPort{{ContainerPort: 8000}},
		}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning,
			PodIP: ip,
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
				{Type: corev1.ContainersReady, Status: status},
				{Type: corev1.PodReady, Status: status},
			},
		},
	}
}
