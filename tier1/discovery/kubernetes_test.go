package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// deadline bounds every wait on the watcher. It is generous: reaching it
// means a lost update, not a slow machine.
const deadline = 30 * time.Second

// noLeaks checks, once the test and its cleanups are done, that no
// goroutine started during the test is left. Call it first, so that its
// cleanup runs after the API server's.
func noLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
}

func clientFor(t *testing.T, a *apiServer) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: a.URL()})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	return c
}

// watcher runs Kubernetes.Run and hands each callback's set to the test.
type watcher struct {
	updates chan []Pod
	done    chan error
	cancel  context.CancelFunc
	calls   int
}

func startWatcher(t *testing.T, k *Kubernetes) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{updates: make(chan []Pod), done: make(chan error, 1), cancel: cancel}
	go func() {
		w.done <- k.Run(ctx, func(p []Pod) {
			// Unbuffered: the callback blocks until the test reads, so a
			// test can hold Run inside onChange while it makes changes.
			select {
			case w.updates <- p:
			case <-ctx.Done():
			}
		})
	}()
	t.Cleanup(func() { w.stop(t) })
	return w
}

func (w *watcher) next(t *testing.T) []string {
	t.Helper()
	select {
	case p := <-w.updates:
		w.calls++
		return show(p)
	case <-time.After(deadline):
		t.Fatalf("no pod update within %v", deadline)
		return nil
	}
}

// expect reads the next update and compares it.
func (w *watcher) expect(t *testing.T, step string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if got := w.next(t); !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", step, got, want)
	}
}

func (w *watcher) stop(t *testing.T) {
	t.Helper()
	if w.cancel == nil {
		return
	}
	w.cancel()
	w.cancel = nil
	select {
	case err := <-w.done:
		if err != nil {
			t.Errorf("Run returned %v after cancel, want nil", err)
		}
	case <-time.After(deadline):
		t.Errorf("Run did not return within %v of cancel", deadline)
	}
}

// show renders pods as "ns/name ip ready|- k=v,...".
func show(pods []Pod) []string {
	out := make([]string, len(pods))
	for i, p := range pods {
		r := "-"
		if p.Ready {
			r = "ready"
		}
		var ls []string
		for k, v := range p.Labels {
			ls = append(ls, k+"="+v)
		}
		slices.Sort(ls)
		out[i] = fmt.Sprintf("%s %s %s %s", p.Key(), p.IP, r, strings.Join(ls, ","))
	}
	return out
}

func chat() map[string]string { return map[string]string{"pool": "chat"} }

// inBothFetchModes runs test as subtests "watch-list" and
// "list-then-watch", the two ways client-go fetches the initial state
// (its WatchListClient feature gate), each checked for goroutines left
// running (noLeaks).
func inBothFetchModes(t *testing.T, test func(t *testing.T, watchList bool)) {
	for _, mode := range []struct {
		name      string
		watchList bool
	}{{"watch-list", true}, {"list-then-watch", false}} {
		t.Run(mode.name, func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, mode.watchList)
			noLeaks(t)
			test(t, mode.watchList)
		})
	}
}

// TestKubernetesPodLifecycle drives pods through their lives on the API
// server and checks every set Run reports, in both ways client-go fetches
// the initial state: watch-list (the default since client-go v0.35, a
// streamed list over the watch ending in an initial-events-end bookmark)
// and the classic list then watch, selected by client-go's WatchListClient
// feature gate. The test server speaks both.
func TestKubernetesPodLifecycle(t *testing.T) {
	inBothFetchModes(t, func(t *testing.T, watchList bool) {
		a := startAPIServer(t,
			k8sPod("ns", "a", "10.0.0.1", true, chat()),
			k8sPod("ns", "b", "10.0.0.2", false, chat()),
			k8sPod("other", "c", "10.0.0.3", true, chat()),                               // another namespace
			k8sPod("ns", "sidecar", "10.0.0.4", true, map[string]string{"app": "redis"}), // outside LabelSelector
		)
		k := &Kubernetes{Client: clientFor(t, a), Namespace: "ns", LabelSelector: "pool", Logger: quietLog()}
		w := startWatcher(t, k)

		w.expect(t, "initial set",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/b 10.0.0.2 - pool=chat")

		// The set feeds Endpoints: only the ready pod is a target.
		if got := ids(Endpoints(testSnapshot(t), "a", podsFrom(t, a, "ns"))["chat"]); !slices.Equal(got,
			[]string{"ns/a:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000"}) {
			t.Errorf("Endpoints over the discovered pods: %q", got)
		}

		pending := k8sPod("ns", "d", "", false, chat())
		pending.Status.Phase = corev1.PodPending
		a.apply(pending)
		w.expect(t, "pod added, pending, no IP",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/b 10.0.0.2 - pool=chat",
			"ns/d  - pool=chat")

		// Readiness changes, one pod at a time, and the set after each.
		for _, step := range []struct {
			what string
			pod  corev1.Pod
			want []string
		}{
			{"pod gets an IP and becomes Ready", k8sPod("ns", "d", "10.0.0.5", true, chat()),
				[]string{"ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 - pool=chat", "ns/d 10.0.0.5 ready pool=chat"}},
			{"pod becomes Ready", k8sPod("ns", "b", "10.0.0.2", true, chat()),
				[]string{"ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 ready pool=chat", "ns/d 10.0.0.5 ready pool=chat"}},
			{"pod becomes not Ready", k8sPod("ns", "a", "10.0.0.1", false, chat()),
				[]string{"ns/a 10.0.0.1 - pool=chat", "ns/b 10.0.0.2 ready pool=chat", "ns/d 10.0.0.5 ready pool=chat"}},
		} {
			a.apply(step.pod)
			w.expect(t, step.what, step.want...)
		}

		// A change discovery does not look at (a container restart)
		// must not produce a call: the next call is the deletion.
		restarted := k8sPod("ns", "b", "10.0.0.2", true, chat())
		restarted.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", RestartCount: 3}}
		restarted.Annotations = map[string]string{"note": "restarted"}
		a.apply(restarted)
		a.apply(k8sPod("other", "c", "10.0.0.30", true, chat())) // not our namespace
		a.remove("ns", "b")
		w.expect(t, "pod deleted (after changes that must not show)",
			"ns/a 10.0.0.1 - pool=chat",
			"ns/d 10.0.0.5 ready pool=chat")

		a.apply(k8sPod("ns", "d", "10.0.0.5", true, map[string]string{"pool": "code"}))
		w.expect(t, "labels change",
			"ns/a 10.0.0.1 - pool=chat",
			"ns/d 10.0.0.5 ready pool=code")

		a.apply(k8sPod("ns", "d", "10.0.0.5", true, map[string]string{"stage": "drained"}))
		w.expect(t, "pod leaves the LabelSelector",
			"ns/a 10.0.0.1 - pool=chat")

		a.apply(k8sPod("ns", "a", "10.0.0.1", true, chat()))
		w.expect(t, "Ready again", "ns/a 10.0.0.1 ready pool=chat")

		terminating := k8sPod("ns", "a", "10.0.0.1", true, chat())
		terminating.DeletionTimestamp = &metav1.Time{Time: time.Unix(1700000000, 0)}
		a.apply(terminating)
		w.expect(t, "a terminating pod is not Ready even while its condition says so",
			"ns/a 10.0.0.1 - pool=chat")

		a.remove("ns", "a")
		w.expect(t, "last pod deleted")

		w.stop(t)
		lists, watchLists := a.counts()
		if watchList && (watchLists == 0 || lists != 0) {
			t.Errorf("watch-list mode: %d watch-lists and %d lists, want >0 and 0", watchLists, lists)
		}
		if !watchList && (lists == 0 || watchLists != 0) {
			t.Errorf("list-then-watch mode: %d lists and %d watch-lists, want >0 and 0", lists, watchLists)
		}
	})
}

// TestKubernetesRecovers cuts the watch, refuses the informer for a while,
// and changes pods meanwhile with the history compacted, so the informer
// must list again: pods deleted while it was away must disappear (they
// come back as client-go tombstones) and new ones appear.
func TestKubernetesRecovers(t *testing.T) {
	inBothFetchModes(t, func(t *testing.T, watchList bool) {
		a := startAPIServer(t,
			k8sPod("ns", "a", "10.0.0.1", true, chat()),
			k8sPod("ns", "b", "10.0.0.2", true, chat()),
		)
		logged := newLockedBuffer()
		k := &Kubernetes{Client: clientFor(t, a), Namespace: "ns", Logger: slog.New(slog.NewTextHandler(logged, nil))}
		w := startWatcher(t, k)
		w.expect(t, "initial set", "ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 ready pool=chat")

		lists0, watchLists0 := a.counts()
		a.forbid("tier1")
		a.breakWatches()
		select {
		case <-logged.wrote: // the informer's retry was refused
		case <-time.After(deadline):
			t.Fatalf("no refused retry logged within %v", deadline)
		}
		a.remove("ns", "b")
		a.apply(k8sPod("ns", "c", "10.0.0.3", true, chat()))
		a.compact()
		a.permit()
		w.expect(t, "after the outage", "ns/a 10.0.0.1 ready pool=chat", "ns/c 10.0.0.3 ready pool=chat")
		// The history was gone, so the informer had to fetch the whole
		// state again rather than resume the watch.
		if lists, watchLists := a.counts(); lists+watchLists <= lists0+watchLists0 {
			t.Errorf("no new list after the compacted outage (lists %d→%d, watch-lists %d→%d)", lists0, lists, watchLists0, watchLists)
		}

		a.apply(k8sPod("ns", "a", "10.0.0.1", false, chat()))
		w.expect(t, "watching again", "ns/a 10.0.0.1 - pool=chat", "ns/c 10.0.0.3 ready pool=chat")
	})
}

// podsFrom reads the API server's current pods of a namespace as Pods, the
// way Run converts them.
func podsFrom(t *testing.T, a *apiServer, ns string) []Pod {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	var objs []any
	for _, p := range a.pods {
		if p.Namespace == ns {
			objs = append(objs, &p)
		}
	}
	return podsOf(objs)
}

// TestKubernetesCoalesces holds Run inside onChange while 50 changes land,
// then checks they arrive as one call carrying the latest set.
func TestKubernetesCoalesces(t *testing.T) {
	noLeaks(t)
	a := startAPIServer(t)
	var once sync.Once
	markerSeen := make(chan struct{})
	k := &Kubernetes{Client: clientFor(t, a), Namespace: "ns", Logger: quietLog()}
	k.testHookEvent = func(obj any) {
		if p, ok := obj.(*corev1.Pod); ok && p.Name == "marker" {
			once.Do(func() { close(markerSeen) })
		}
	}
	w := startWatcher(t, k)
	w.expect(t, "initial set of an empty namespace")

	// The first change wakes Run, which then blocks in onChange (nobody
	// reads w.updates) while the rest arrive.
	const n = 50
	for i := range n {
		a.apply(k8sPod("ns", fmt.Sprintf("p%02d", i), fmt.Sprintf("10.0.1.%d", i), true, chat()))
	}
	a.apply(k8sPod("ns", "marker", "10.0.2.1", false, chat()))
	select {
	case <-markerSeen:
	case <-time.After(deadline):
		t.Fatalf("the informer did not see the last change within %v", deadline)
	}

	var pods []string
	for i := range n {
		pods = append(pods, fmt.Sprintf("ns/p%02d 10.0.1.%d ready pool=chat", i, i))
	}
	want := append([]string{"ns/marker 10.0.2.1 - pool=chat"}, pods...) // sorted

	first := w.next(t) // whatever Run had read when the first change woke it
	if len(first) == 0 || len(first) > len(want) {
		t.Fatalf("first call after the burst: %d pods", len(first))
	}
	if !slices.Equal(first, want) {
		// Run was woken again by the changes that arrived while it was
		// blocked, and reads the store once: the latest set.
		w.expect(t, "the burst, coalesced", want...)
	}
	// Nothing is pending: the next call is the next change, not a replay.
	a.remove("ns", "marker")
	w.expect(t, "change after the burst", pods...)
	if w.calls > 4 {
		t.Errorf("%d calls for %d changes, want at most 4", w.calls, n+2)
	}
}

func TestKubernetesRunErrors(t *testing.T) {
	noLeaks(t)
	a := startAPIServer(t)
	client := clientFor(t, a)
	nop := func([]Pod) {}
	tests := []struct {
		name     string
		k        *Kubernetes
		onChange func([]Pod)
		want     string
	}{
		{"no client", &Kubernetes{}, nop, "Client is nil"},
		{"no callback", &Kubernetes{Client: client}, nil, "onChange is nil"},
		{"bad selector", &Kubernetes{Client: client, LabelSelector: "pool in (chat"}, nop, `label selector "pool in (chat"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.k.Run(context.Background(), tc.onChange)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Run: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Run returns promptly when its context ends before the first list
// succeeds (here: the API server refuses it, as it does when the Role is
// missing), leaving nothing running, and reports the failure to its logger.
func TestKubernetesCancelBeforeSync(t *testing.T) {
	noLeaks(t)
	a := startAPIServer(t, k8sPod("ns", "a", "10.0.0.1", true, chat()))
	a.forbid("tier1")
	logged := newLockedBuffer()
	k := &Kubernetes{
		Client:    clientFor(t, a),
		Namespace: "ns",
		Logger:    slog.New(slog.NewTextHandler(logged, nil)),
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, func([]Pod) { t.Error("onChange called without a synced cache") }) }()
	select {
	case <-logged.wrote:
	case <-time.After(deadline):
		t.Fatalf("no failure logged within %v", deadline)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v, want nil", err)
		}
	case <-time.After(deadline):
		t.Fatalf("Run did not return within %v of cancel", deadline)
	}
	if s := logged.String(); !strings.Contains(s, "listing or watching pods failed") || !strings.Contains(s, "forbidden") {
		t.Errorf("log does not name the failure: %s", s)
	}
}

func TestNewKubernetes(t *testing.T) {
	noLeaks(t)
	a := startAPIServer(t,
		k8sPod("team-a", "m-0", "10.0.3.1", true, chat()),
		k8sPod("team-b", "m-1", "10.0.3.2", true, chat()),
	)
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "config")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "`+a.URL()+`"}
users:
- name: tier1
  user: {token: not-checked}
contexts:
- name: test
  context: {cluster: test, user: tier1, namespace: team-a}
current-context: test
`), 0o600); err != nil {
		t.Fatal(err)
	}

	t.Run("kubeconfig, its context's namespace", func(t *testing.T) {
		k, err := NewKubernetes(kubeconfig, "")
		if err != nil {
			t.Fatalf("NewKubernetes: %v", err)
		}
		if k.Namespace != "team-a" {
			t.Errorf("namespace %q, want the context's team-a", k.Namespace)
		}
		k.Logger = quietLog()
		w := startWatcher(t, k)
		w.expect(t, "pods of team-a", "team-a/m-0 10.0.3.1 ready pool=chat")
	})
	t.Run("kubeconfig, namespace given", func(t *testing.T) {
		k, err := NewKubernetes(kubeconfig, "team-b")
		if err != nil {
			t.Fatalf("NewKubernetes: %v", err)
		}
		k.Logger = quietLog()
		w := startWatcher(t, k)
		w.expect(t, "pods of team-b", "team-b/m-1 10.0.3.2 ready pool=chat")
	})
	t.Run("missing kubeconfig", func(t *testing.T) {
		_, err := NewKubernetes(filepath.Join(dir, "absent"), "")
		if err == nil || !strings.Contains(err.Error(), "absent") {
			t.Errorf("NewKubernetes: %v, want an error naming the file", err)
		}
	})
	t.Run("not in a cluster", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		t.Setenv("KUBERNETES_SERVICE_PORT", "")
		_, err := NewKubernetes("", "")
		if !errors.Is(err, ErrNotInCluster) {
			t.Errorf("NewKubernetes: %v, want ErrNotInCluster", err)
		}
	})
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// lockedBuffer collects log output; wrote is closed on the first write.
type lockedBuffer struct {
	mu    sync.Mutex
	b     strings.Builder
	once  sync.Once
	wrote chan struct{}
}

func newLockedBuffer() *lockedBuffer { return &lockedBuffer{wrote: make(chan struct{})} }

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.once.Do(func() { close(l.wrote) })
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
