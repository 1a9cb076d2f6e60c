package kubetest

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The kit's server is a real one: RBAC refuses a user until a Role is
// bound, a restart keeps the objects (they live in etcd), and a
// compaction makes an old resourceVersion unwatchable (410 Gone).
func TestKubeAPIServer(t *testing.T) {
	s := Start(t, Options{Users: []string{"reader"}})
	ctx := context.Background()
	s.Namespace("ns")
	admin, reader := s.Client(Admin), s.Client("reader")
	if v, err := admin.Discovery().ServerVersion(); err != nil || v.GitVersion != Version {
		t.Fatalf("server version %v (%v), want %s: clients that check it (Helm) need the release's", v, err, Version)
	}

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "vllm"}}},
	}
	created, err := admin.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reader.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("list without a Role: %v, want Forbidden", err)
	}
	s.Grant("read-pods", "ns", "reader", "", []string{"pods"}, []string{"list"})
	if _, err := reader.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("list with the Role: %v", err)
	}

	if err := admin.CoreV1().Pods("ns").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.Compact()
	s.Restart()
	w, err := admin.CoreV1().Pods("ns").Watch(ctx, metav1.ListOptions{ResourceVersion: created.ResourceVersion})
	if err == nil {
		ev := <-w.ResultChan()
		w.Stop()
		if st, ok := ev.Object.(*metav1.Status); !ok || st.Code != 410 {
			t.Fatalf("watch from a compacted resourceVersion after a restart: %v %#v, want 410 Gone", ev.Type, ev.Object)
		}
	} else if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("watch from a compacted resourceVersion: %v, want 410 Gone", err)
	}
	if l, err := reader.CoreV1().Pods("ns").List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Fatalf("after the restart: %v, %d pods, want none", err, len(l.Items))
	}
}
