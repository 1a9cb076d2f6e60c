package discovery

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/rest"

	"github.com/meridian-router/meridian/internal/testkit"
)

// deadline bounds every wait on the watcher. It is generous: reaching it
// means a lost update, not a slow machine (client-go backs a failing
// watch off for up to 30 s).
const deadline = testkit.EventuallyTimeout

// noLeaks checks, once the test and its cleanups are done, that no
// goroutine started during the test is left. Call it first, so that its
// cleanup runs after the API server's.
func noLeaks(t *testing.T) {
	t.Helper()
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
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

// expectNext reads the next update and compares it.
func (w *watcher) expectNext(t *testing.T, step string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	if got := w.next(t); !slices.Equal(got, want) {
		t.Fatalf("%s:\n got %q\nwant %q", step, got, want)
	}
}

// expect reads updates until one is want. The API server applies a pod's
// metadata and its status in two writes, so a set between them may come
// first.
func (w *watcher) expect(t *testing.T, step string, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	var seen [][]string
	timeout := time.After(deadline)
	for {
		select {
		case p := <-w.updates:
			w.calls++
			got := show(p)
			if slices.Equal(got, want) {
				return
			}
			seen = append(seen, got)
		case <-timeout:
			t.Fatalf("%s: no update to\n%q\nwithin %v; saw %q", step, want, deadline, seen)
		}
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

// TestKubernetesPodLifecycle drives pods through their lives on a real
// API server and checks the sets Run reports, in both ways client-go
// fetches the initial state: watch-list (the default since client-go
// v0.35, a streamed list over the watch ending in an initial-events-end
// bookmark) and the classic list then watch, selected by client-go's
// WatchListClient feature gate.
func TestKubernetesPodLifecycle(t *testing.T) {
	inBothFetchModes(t, func(t *testing.T, watchList bool) {
		c := startCluster(t,
			k8sPod("ns", "a", "10.0.0.1", true, chat()),
			k8sPod("ns", "b", "10.0.0.2", false, chat()),
			k8sPod("other", "c", "10.0.0.3", true, chat()),                               // another namespace
			k8sPod("ns", "sidecar", "10.0.0.4", true, map[string]string{"app": "redis"}), // outside LabelSelector
		)
		reqs := &requests{}
		k := &Kubernetes{Client: clientOf(t, c.Config(tier1User), reqs), Namespace: "ns", LabelSelector: "pool", Logger: quietLog()}
		w := startWatcher(t, k)

		w.expect(t, "initial set",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/b 10.0.0.2 - pool=chat")

		// The set feeds Endpoints: only the ready pod is a target.
		if got := ids(Endpoints(testSnapshot(t), "a", c.pods("ns"))["chat"]); !slices.Equal(got,
			[]string{"ns/a:8000=10.0.0.1:8000", "static-chat=10.9.0.1:8000"}) {
			t.Errorf("Endpoints over the discovered pods: %q", got)
		}

		pending := k8sPod("ns", "d", "", false, chat())
		pending.Status.Phase = corev1.PodPending
		c.apply(pending)
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
			c.apply(step.pod)
			w.expect(t, step.what, step.want...)
		}

		// Changes discovery does not look at (a container restart, an
		// annotation, a pod of another namespace) must not produce a
		// call: the next call is the change after them.
		restarted := k8sPod("ns", "b", "10.0.0.2", true, chat())
		restarted.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "vllm", Image: "vllm/vllm-openai:latest", RestartCount: 3}}
		restarted.Annotations = map[string]string{"note": "restarted"}
		c.apply(restarted)
		c.apply(k8sPod("other", "c", "10.0.0.3", false, chat()))
		c.apply(k8sPod("ns", "a", "10.0.0.1", true, chat()))
		w.expectNext(t, "Ready again (after changes that must not show)",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/b 10.0.0.2 ready pool=chat",
			"ns/d 10.0.0.5 ready pool=chat")

		// A running pod is deleted gracefully: it terminates (not
		// Ready), then goes.
		c.remove("ns", "b")
		w.expect(t, "pod deleted",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/d 10.0.0.5 ready pool=chat")

		c.apply(k8sPod("ns", "d", "10.0.0.5", true, map[string]string{"pool": "code"}))
		w.expectNext(t, "labels change",
			"ns/a 10.0.0.1 ready pool=chat",
			"ns/d 10.0.0.5 ready pool=code")

		c.apply(k8sPod("ns", "d", "10.0.0.5", true, map[string]string{"stage": "drained"}))
		w.expectNext(t, "pod leaves the LabelSelector (the API server sends its deletion)",
			"ns/a 10.0.0.1 ready pool=chat")

		c.terminate("ns", "a")
		w.expectNext(t, "a terminating pod is not Ready even while its condition says so",
			"ns/a 10.0.0.1 - pool=chat")

		c.release("ns", "a")
		w.expect(t, "last pod deleted")

		w.stop(t)
		lists, watchLists := reqs.counts()
		if watchList && (watchLists == 0 || lists != 0) {
			t.Errorf("watch-list mode: %d watch-lists and %d lists, want >0 and 0", watchLists, lists)
		}
		if !watchList && (lists == 0 || watchLists != 0) {
			t.Errorf("list-then-watch mode: %d lists and %d watch-lists, want >0 and 0", lists, watchLists)
		}
	})
}

// TestKubernetesRecoversFromCompaction cuts the watcher off the API
// server, changes pods meanwhile, compacts etcd's history and restarts the
// API server (whose watch cache then starts from now): the watch cannot
// resume from its resourceVersion (410 Gone), so the informer must list
// again. Pods deleted while it was away disappear (client-go tombstones)
// and new ones appear.
func TestKubernetesRecoversFromCompaction(t *testing.T) {
	inBothFetchModes(t, func(t *testing.T, watchList bool) {
		c := startCluster(t,
			k8sPod("ns", "a", "10.0.0.1", true, chat()),
			k8sPod("ns", "b", "10.0.0.2", true, chat()),
		)
		proxy := c.Proxy()
		reqs := &requests{}
		logged := newLockedBuffer()
		k := &Kubernetes{Client: clientOf(t, proxy.Config(tier1User), reqs), Namespace: "ns", Logger: slog.New(slog.NewTextHandler(logged, nil))}
		w := startWatcher(t, k)
		w.expect(t, "initial set", "ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 ready pool=chat")

		proxy.Cut()
		c.remove("ns", "b")
		c.apply(k8sPod("ns", "c", "10.0.0.3", true, chat()))
		c.Compact()
		c.Restart()
		lists0, watchLists0 := reqs.counts()
		proxy.Restore()
		w.expect(t, "after the outage", "ns/a 10.0.0.1 ready pool=chat", "ns/c 10.0.0.3 ready pool=chat")
		// The history was gone, so the informer had to fetch the whole
		// state again rather than resume the watch.
		if lists, watchLists := reqs.counts(); lists+watchLists <= lists0+watchLists0 {
			t.Errorf("no new list after the compacted outage (lists %d→%d, watch-lists %d→%d)", lists0, lists, watchLists0, watchLists)
		}

		c.apply(k8sPod("ns", "a", "10.0.0.1", false, chat()))
		w.expectNext(t, "watching again", "ns/a 10.0.0.1 - pool=chat", "ns/c 10.0.0.3 ready pool=chat")
	})
}

// An API server restart ends every watch; the informer resumes and sees
// the changes after it.
func TestKubernetesAPIServerRestart(t *testing.T) {
	noLeaks(t)
	c := startCluster(t, k8sPod("ns", "a", "10.0.0.1", true, chat()))
	k := &Kubernetes{Client: clientOf(t, c.Config(tier1User), nil), Namespace: "ns", Logger: quietLog()}
	w := startWatcher(t, k)
	w.expect(t, "initial set", "ns/a 10.0.0.1 ready pool=chat")
	c.Restart()
	c.apply(k8sPod("ns", "b", "10.0.0.2", true, chat()))
	w.expect(t, "a pod added after the restart", "ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 ready pool=chat")
	c.Restart()
	c.remove("ns", "a")
	w.expect(t, "a pod deleted after the second restart", "ns/b 10.0.0.2 ready pool=chat")
}

// When RBAC stops allowing the watch (the RoleBinding deleted), the
// informer's next list is refused: the failure is logged with the API
// server's Forbidden, and the endpoints last known keep serving (no call
// empties them). Once the binding is back, the informer catches up.
func TestKubernetesForbiddenKeepsLastKnownPods(t *testing.T) {
	noLeaks(t)
	c := startCluster(t,
		k8sPod("ns", "a", "10.0.0.1", true, chat()),
		k8sPod("ns", "b", "10.0.0.2", true, chat()),
	)
	proxy := c.Proxy()
	logged := newLockedBuffer()
	k := &Kubernetes{Client: clientOf(t, proxy.Config(tier1User), nil), Namespace: "ns", Logger: slog.New(slog.NewTextHandler(logged, nil))}
	w := startWatcher(t, k)
	w.expect(t, "initial set", "ns/a 10.0.0.1 ready pool=chat", "ns/b 10.0.0.2 ready pool=chat")

	c.Revoke("tier1-pods", "ns")
	proxy.Cut() // ends the watch that was allowed when it began
	c.remove("ns", "b")
	proxy.Restore()
	select {
	case <-logged.wrote:
	case <-time.After(deadline):
		t.Fatalf("no refused retry logged within %v", deadline)
	}
	testkit.Eventually(t, "the refusal logged as forbidden", func() bool { return strings.Contains(logged.String(), "forbidden") })
	select {
	case p := <-w.updates:
		t.Fatalf("a set was reported while the watch was forbidden: %q", show(p))
	default:
	}

	c.Grant("tier1-pods", "ns", tier1User, "", []string{"pods"}, []string{"get", "list", "watch"})
	w.expect(t, "caught up once allowed again", "ns/a 10.0.0.1 ready pool=chat")
}

func TestKubernetesRunErrors(t *testing.T) {
	noLeaks(t)
	// Run refuses these before it sends anything: the client points
	// nowhere.
	client := clientOf(t, &rest.Config{Host: "https://127.0.0.1:1"}, nil)
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
	c := startCluster(t)
	c.Namespace("locked") // no Role for the tier1 user here
	c.apply(k8sPod("locked", "a", "10.0.0.1", true, chat()))
	logged := newLockedBuffer()
	k := &Kubernetes{
		Client:    clientOf(t, c.Config(tier1User), nil),
		Namespace: "locked",
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
	c := startCluster(t,
		k8sPod("team-a", "m-0", "10.0.3.1", true, chat()),
		k8sPod("team-b", "m-1", "10.0.3.2", true, chat()),
	)
	dir := t.TempDir()
	kubeconfig := c.Kubeconfig(tier1User, "team-a")
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
