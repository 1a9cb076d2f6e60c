package main

import (
	"context"
	"fmt"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/config/kube"
	"github.com/meridian-router/meridian/internal/kubetest"
	"github.com/meridian-router/meridian/internal/kubetest/helminstall"
	"github.com/meridian-router/meridian/internal/testkit"
	"github.com/meridian-router/meridian/tier1/discovery"
)

const chartDir = "../../deploy/helm/meridian"

// The chart's ServiceAccount is all Meridian needs and no more. Installed
// by Helm into a real API server (the us-east-1 values on the Kubernetes
// configuration source), its token (TokenRequest API) runs the Tier-1s
// and Tier-2s of a platform whose objects an operator applied: they read
// the configuration, serve, and Tier-2's canary analysis writes a
// rollout's steps; Tier-1's pod discovery watches the namespace's pods.
// The same token is refused Secrets (here and elsewhere), writing pods,
// Meridian's objects beyond rollouts, RBAC and anything cluster-wide.
func TestChartServiceAccountRBAC(t *testing.T) {
	s := kubetest.Start(t, kubetest.Options{})
	s.Namespace(kubeNS)
	vals := map[string]any{
		"region": "us-east-1", "cluster": "us-east-1a",
		"config":          map[string]any{"source": "kubernetes"},
		"tier2":           map[string]any{"tls": map[string]any{"secretName": "meridian-tls"}},
		"serviceMonitor":  map[string]any{"enabled": false},
		"prometheusRules": map[string]any{"enabled": false},
	}
	if _, err := helminstall.Install(s.Kubeconfig(kubetest.Admin, kubeNS), chartDir, kubeNS, "meridian", vals); err != nil {
		t.Fatal(err)
	}
	admin := s.Client(kubetest.Admin)
	ctx := context.Background()
	tr, err := admin.CoreV1().ServiceAccounts(kubeNS).CreateToken(ctx, "meridian",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for the chart's ServiceAccount: %v", err)
	}
	kc := s.KubeconfigToken(tr.Status.Token, kubeNS)
	cfg := s.Config(kubetest.Admin)
	cfg.BearerToken = tr.Status.Token
	sa, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The operator applies the configuration (their own rights); the
	// service account could not.
	dir := kubePlatformDir(t)
	if out, err := runMeridian(t, "config", "apply", "-f", dir, "--kubeconfig", kc); err == nil || !strings.Contains(out+err.Error(), "forbidden") {
		t.Fatalf("config apply with the service account: %v\n%s", err, out)
	}
	if out, err := runMeridian(t, "config", "apply", "-f", dir, "--kubeconfig", s.Kubeconfig(kubetest.Admin, kubeNS)); err != nil {
		t.Fatalf("config apply: %v\n%s", err, out)
	}

	t.Run("Tier-1 and Tier-2 do their job", func(t *testing.T) {
		p := kubePlatformFrom(t, dir, kc)
		if _, err := servedKube(p, "us-east-1", "rbac"); err != nil {
			t.Fatalf("a request: %v", err)
		}
		// The operator starts a rollout; Tier-2's analysis, through the
		// service account, moves it to its last step.
		if out, err := runMeridian(t, append([]string{"canary", "start", "chat", "--to", "chat-v2", "--steps", "50,100", "--interval", "1s", "--min-requests", "1",
			"--kubeconfig", s.Kubeconfig(kubetest.Admin, kubeNS)}, noAbort...)...); err != nil {
			t.Fatalf("canary start: %v\n%s", err, out)
		}
		store := &kube.Store{Namespace: kubeNS}
		c, err := kube.NewClients(s.Config(kubetest.Admin))
		if err != nil {
			t.Fatal(err)
		}
		store.Dynamic, store.Client = c.Dynamic, c.Client
		var last *config.Rollout
		defer func() {
			if t.Failed() {
				t.Logf("the rollout: %+v", last)
			}
		}()
		testkit.Eventually(t, "Tier-2 promotes the rollout to 100%", func() bool {
			for i := range 20 {
				servedKube(p, p.Regions[i%2], fmt.Sprint("rbac-", i))
			}
			snap, err := store.Load(ctx)
			if err != nil {
				return false
			}
			ro := snap.Rewrites["chat"].Spec.Rollout
			last = ro
			return ro != nil && ro.Step == 1 && ro.Status == "Healthy"
		})
	})

	t.Run("pod discovery", func(t *testing.T) {
		d, err := discovery.NewKubernetes(kc, kubeNS)
		if err != nil {
			t.Fatal(err)
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Labels: map[string]string{"pool": "chat"}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}}}
		created, err := admin.CoreV1().Pods(kubeNS).Create(ctx, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status = corev1.PodStatus{PodIP: "10.0.0.7", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
		if _, err := admin.CoreV1().Pods(kubeNS).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		seen := make(chan []discovery.Pod, 16)
		dctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(dctx, func(p []discovery.Pod) { seen <- p }) }()
		defer func() { cancel(); <-done }()
		testkit.Eventually(t, "the pod discovered through the service account", func() bool {
			for {
				select {
				case ps := <-seen:
					for _, p := range ps {
						if p.Name == "vllm-0" && p.IP == "10.0.0.7" && p.Ready {
							return true
						}
					}
				default:
					return false
				}
			}
		})
	})

	t.Run("refused what it does not need", func(t *testing.T) {
		forbidden := func(what string, err error) {
			t.Helper()
			if !apierrors.IsForbidden(err) {
				t.Errorf("%s: %v, want Forbidden", what, err)
			}
		}
		s.Namespace("other")
		_, err := sa.CoreV1().Secrets("other").List(ctx, metav1.ListOptions{})
		forbidden("list Secrets in another namespace", err)
		_, err = sa.CoreV1().Secrets(kubeNS).Get(ctx, "meridian-tls", metav1.GetOptions{})
		forbidden("get a Secret of its own namespace", err)
		_, err = sa.CoreV1().Pods(kubeNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
		forbidden("create a pod", err)
		forbidden("delete a pod", sa.CoreV1().Pods(kubeNS).Delete(ctx, "vllm-0", metav1.DeleteOptions{}))
		_, err = sa.CoreV1().Pods("other").List(ctx, metav1.ListOptions{})
		forbidden("list pods in another namespace", err)
		_, err = sa.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		forbidden("create a namespace", err)
		_, err = sa.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
		forbidden("create a ClusterRole", err)
		_, err = sa.RbacV1().RoleBindings(kubeNS).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "x"},
			RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"}}, metav1.CreateOptions{})
		forbidden("bind itself cluster-admin", err)
		_, err = sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		forbidden("list nodes", err)
		forbidden("delete a ConfigMap", sa.CoreV1().ConfigMaps(kubeNS).Delete(ctx, kube.GuardName, metav1.DeleteOptions{}))
		c, err := kube.NewClients(cfg)
		if err != nil {
			t.Fatal(err)
		}
		tenants := c.Dynamic.Resource(gvrOf(config.KindTenant, kube.GroupMeridian)).Namespace(kubeNS)
		_, err = tenants.Create(ctx, &unstructured.Unstructured{Object: map[string]any{"apiVersion": kube.GroupMeridian + "/v1alpha1",
			"kind": "Tenant", "metadata": map[string]any{"name": "intruder"}, "spec": map[string]any{}}}, metav1.CreateOptions{})
		forbidden("create a Tenant", err)
		forbidden("delete a Tenant", tenants.Delete(ctx, "team-a", metav1.DeleteOptions{}))
		rewrites := c.Dynamic.Resource(gvrOf(config.KindModelRewrite, "inference.networking.x-k8s.io")).Namespace(kubeNS)
		forbidden("delete an InferenceModelRewrite", rewrites.Delete(ctx, "chat", metav1.DeleteOptions{}))
	})
}
