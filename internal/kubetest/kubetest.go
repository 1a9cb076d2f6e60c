// Package kubetest runs a real kube-apiserver for tests: the release the
// nested module apiserver/go.mod pins (Version), built once per machine
// (Binary), over an embedded etcd, with RBAC on and token users, on free
// loopback ports, stopped when the test ends. There is no kubelet or
// controller manager: tests create pods and set their status themselves.
// It is imported only by test files (docs/architecture.md, rule 2).
package kubetest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/internal/cutproxy"
)

// StartTimeout bounds the wait for the API server to answer /readyz, on a
// loaded 2-core machine (it is ready in about 2 s on an idle one).
const StartTimeout = 2 * time.Minute

// Admin is the user with every permission (group system:masters).
const Admin = "admin"

// Server is a running kube-apiserver and its etcd.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	addr string // the API server's own host:port
	// front is where clients connect: a proxy to addr that Stop cuts
	// first, so that the server's graceful shutdown finds no watch to
	// wait out (it waits 30 s and more for open watches otherwise).
	front   *cutproxy.Proxy
	ca      []byte // PEM of the CA that signed the serving certificate
	tokens  map[string]string
	etcdURL string
	etcd    *embed.Etcd
	// Etcd is a client of the server's etcd, for what only etcd can do
	// (Compact).
	Etcd *clientv3.Client

	mu   sync.Mutex
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has ended
}

// Options configure Start.
type Options struct {
	// Users are token users besides Admin, with no permission until a
	// test grants one (Grant, or RBAC objects of its own).
	Users []string
}

// Start builds the API server if this machine has none (Binary), starts
// etcd and the API server, waits until it is ready and registers their
// shutdown with t.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), BuildTimeout)
	bin, err := Binary(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), tokens: map[string]string{}}
	s.startEtcd()
	t.Cleanup(s.stopEtcd)

	if s.ca, err = writeCerts(s.dir); err != nil {
		t.Fatalf("kubetest: certificates: %v", err)
	}
	var users strings.Builder
	for i, u := range append([]string{Admin}, opts.Users...) {
		tok := fmt.Sprintf("%s-token-%d", u, i)
		s.tokens[u] = tok
		groups := ""
		if u == Admin {
			groups = "system:masters"
		}
		fmt.Fprintf(&users, "%s,%s,%s,%q\n", tok, u, u, groups)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "tokens.csv"), []byte(users.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	s.addr = freeAddr(t)
	if s.front, err = cutproxy.Listen(s.addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.front.Close)
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the API server on its address after Stop.
func (s *Server) Start() {
	s.t.Helper()
	_, port, _ := net.SplitHostPort(s.addr)
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + port,
		"--cert-dir=" + filepath.Join(s.dir, "certs"),
		"--tls-cert-file=" + filepath.Join(s.dir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(s.dir, "serving.key"),
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(s.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(s.dir, "sa.key"),
		"--token-auth-file=" + filepath.Join(s.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.96.0.0/24",
		"--disable-admission-plugins=ServiceAccount",
		// No kubernetes Service endpoints to keep: nothing runs in here.
		"--endpoint-reconciler-type=none",
		"--enable-priority-and-fairness=false",
	}
	log, err := os.OpenFile(filepath.Join(s.dir, "kube-apiserver.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		s.t.Fatalf("kubetest: start kube-apiserver: %v", err)
	}
	exit := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(exit) }()
	s.mu.Lock()
	s.cmd, s.exit = cmd, exit
	s.mu.Unlock()
	if err := s.waitReady(exit); err != nil {
		s.Stop()
		s.t.Fatalf("kubetest: kube-apiserver: %v\n%s", err, s.logTail())
	}
	s.front.Up()
}

// waitReady polls /readyz until it answers 200, the process ends or
// StartTimeout passes.
func (s *Server) waitReady(exit <-chan struct{}) error {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: s.tlsConfig()}, Timeout: 5 * time.Second}
	deadline := time.Now().Add(StartTimeout)
	for {
		req, _ := http.NewRequest(http.MethodGet, "https://"+s.addr+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.tokens[Admin])
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exit:
			return errors.New("exited before it was ready")
		case <-time.After(100 * time.Millisecond): // a polling interval
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready within %s (last: %v)", StartTimeout, err)
		}
	}
}

// Stop stops the API server: its clients' connections dropped, then
// SIGTERM (SIGKILL after 30 s). Etcd keeps running, and Start brings the
// server back on the same address.
func (s *Server) Stop() {
	s.front.Cut()
	s.mu.Lock()
	cmd, exit := s.cmd, s.exit
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exit:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exit
	}
}

// Restart is Stop then Start.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "kube-apiserver.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// URL is the API server's https base URL.
func (s *Server) URL() string { return "https://" + s.front.Addr() }

func (s *Server) tlsConfig() *tls.Config {
	cfg, _ := rest.TLSConfigFor(&rest.Config{TLSClientConfig: rest.TLSClientConfig{CAData: s.ca}})
	return cfg
}

// Config is a client configuration for user (Admin or one of
// Options.Users).
func (s *Server) Config(user string) *rest.Config {
	return s.configAt(s.URL(), user)
}

func (s *Server) configAt(host, user string) *rest.Config {
	tok, ok := s.tokens[user]
	if !ok {
		s.t.Fatalf("kubetest: no user %q", user)
	}
	return &rest.Config{
		Host:            host,
		BearerToken:     tok,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.ca, ServerName: "127.0.0.1"},
		// Tests make bursts of changes; the client's default 5 QPS would
		// pace them.
		QPS: 1000, Burst: 1000,
	}
}

// Client is a clientset for user.
func (s *Server) Client(user string) kubernetes.Interface {
	c, err := kubernetes.NewForConfig(s.Config(user))
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// Kubeconfig writes a kubeconfig file for user whose context's namespace
// is namespace, and returns its path.
func (s *Server) Kubeconfig(user, namespace string) string {
	s.t.Helper()
	return s.kubeconfigAt(s.URL(), user, namespace)
}

// KubeconfigToken writes a kubeconfig file that authenticates with token
// (a ServiceAccount's, from the TokenRequest API) and whose context's
// namespace is namespace, and returns its path.
func (s *Server) KubeconfigToken(token, namespace string) string {
	s.t.Helper()
	return s.writeKubeconfig(s.URL(), "token", token, namespace)
}

func (s *Server) kubeconfigAt(server, user, namespace string) string {
	return s.writeKubeconfig(server, user, s.tokens[user], namespace)
}

func (s *Server) writeKubeconfig(server, user, token, namespace string) string {
	path := filepath.Join(s.t.TempDir(), "kubeconfig")
	ca := filepath.Join(s.dir, "ca.crt")
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q, tls-server-name: "127.0.0.1"}
users:
- name: %[3]s
  user: {token: %[4]q}
contexts:
- name: test
  context: {cluster: test, user: %[3]s, namespace: %[5]q}
current-context: test
`, server, ca, user, token, namespace)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		s.t.Fatal(err)
	}
	return path
}

// Namespace creates namespace (if absent).
func (s *Server) Namespace(name string) {
	s.t.Helper()
	_, err := s.Client(Admin).CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatalf("kubetest: namespace %s: %v", name, err)
	}
}

// Grant gives user the verbs on resources (of API group group, "" for
// the core group) in namespace, through a Role and a RoleBinding both
// named name, and returns once the API server's authorizer allows them;
// Revoke deletes the binding.
func (s *Server) Grant(name, namespace, user, group string, resources, verbs []string) {
	s.t.Helper()
	s.GrantRules(name, namespace, user, []rbacv1.PolicyRule{{APIGroups: []string{group}, Resources: resources, Verbs: verbs}})
}

// Revoke deletes the RoleBinding name that Grant made, and returns once
// the API server's authorizer refuses what it allowed.
func (s *Server) Revoke(name, namespace string) {
	s.t.Helper()
	ctx := context.Background()
	c := s.Client(Admin).RbacV1()
	b, err := c.RoleBindings(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("kubetest: revoke %s: %v", name, err)
	}
	role, err := c.Roles(namespace).Get(ctx, b.RoleRef.Name, metav1.GetOptions{})
	if err != nil {
		s.t.Fatalf("kubetest: revoke %s: %v", name, err)
	}
	if err := c.RoleBindings(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		s.t.Fatalf("kubetest: revoke %s: %v", name, err)
	}
	for _, subj := range b.Subjects {
		s.waitAuthorized(namespace, subj.Name, role.Rules, false)
	}
}

// waitAuthorized polls the authorizer (SubjectAccessReview) until user
// is allowed (or, with allowed false, refused) the first verb on the
// first resource of every rule: RBAC changes reach the authorizer
// through its own informers, a moment after the write.
func (s *Server) waitAuthorized(namespace, user string, rules []rbacv1.PolicyRule, allowed bool) {
	s.t.Helper()
	c := s.Client(Admin).AuthorizationV1().SubjectAccessReviews()
	deadline := time.Now().Add(StartTimeout)
	for _, r := range rules {
		review := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: namespace, Verb: r.Verbs[0], Group: r.APIGroups[0], Resource: r.Resources[0],
			},
		}}
		for {
			got, err := c.Create(context.Background(), review, metav1.CreateOptions{})
			if err == nil && got.Status.Allowed == allowed {
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("kubetest: %s still %v to %s %s after %s (%v)", user, !allowed, r.Verbs[0], r.Resources[0], StartTimeout, err)
			}
			time.Sleep(10 * time.Millisecond) // a polling interval
		}
	}
}

// Compact compacts etcd's history up to its current revision, so a watch
// that resumes from an older resourceVersion is answered 410 Gone (once
// the API server's watch cache no longer holds it either: Restart).
func (s *Server) Compact() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := s.Etcd.Get(ctx, "compact-probe")
	if err != nil {
		s.t.Fatalf("kubetest: etcd: %v", err)
	}
	if _, err := s.Etcd.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		s.t.Fatalf("kubetest: compact: %v", err)
	}
}

// Proxy is a way to the API server that a test can cut (its clients'
// connections dropped and refused, as on a network partition) and
// restore, while other clients reach the server directly.
type Proxy struct {
	s *Server
	p *cutproxy.Proxy
}

// Proxy starts a Proxy to s, closed when the test ends.
func (s *Server) Proxy() *Proxy {
	s.t.Helper()
	p, err := cutproxy.Listen(s.addr)
	if err != nil {
		s.t.Fatal(err)
	}
	p.Up()
	s.t.Cleanup(p.Close)
	return &Proxy{s: s, p: p}
}

// Config is a client configuration for user through the proxy.
func (p *Proxy) Config(user string) *rest.Config { return p.s.configAt("https://"+p.p.Addr(), user) }

// Kubeconfig is Server.Kubeconfig through the proxy.
func (p *Proxy) Kubeconfig(user, namespace string) string {
	p.s.t.Helper()
	return p.s.kubeconfigAt("https://"+p.p.Addr(), user, namespace)
}

// Cut drops every connection through the proxy and refuses new ones
// until Restore.
func (p *Proxy) Cut() { p.p.Cut() }

// Restore lets connections through again.
func (p *Proxy) Restore() { p.p.Up() }

func (s *Server) startEtcd() {
	s.t.Helper()
	client, peer := url.URL{Scheme: "http", Host: freeAddr(s.t)}, url.URL{Scheme: "http", Host: freeAddr(s.t)}
	cfg := embed.NewConfig()
	cfg.Name = "kube"
	cfg.Dir = filepath.Join(s.dir, "etcd")
	cfg.LogLevel = "error"
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{client}, []url.URL{client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peer}, []url.URL{peer}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.UnsafeNoFsync = true
	cfg.TickMs, cfg.ElectionMs = 10, 100
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		s.t.Fatalf("kubetest: start etcd: %v", err)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case <-time.After(StartTimeout):
		srv.Close()
		s.t.Fatalf("kubetest: etcd not ready within %s", StartTimeout)
	}
	s.etcd, s.etcdURL = srv, client.String()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client.Host}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.t.Fatalf("kubetest: etcd client: %v", err)
	}
	s.Etcd = cli
}

func (s *Server) stopEtcd() {
	if s.Etcd != nil {
		s.Etcd.Close()
	}
	s.etcd.Server.HardStop()
	s.etcd.Close()
}

// freeAddr returns a loopback address with a port free at the time of the
// call.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// GrantRules is Grant with the Role's rules given whole.
func (s *Server) GrantRules(name, namespace, user string, rules []rbacv1.PolicyRule) {
	s.t.Helper()
	ctx := context.Background()
	c := s.Client(Admin).RbacV1()
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}, Rules: rules}
	if _, err := c.Roles(namespace).Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatalf("kubetest: role %s: %v", name, err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	if _, err := c.RoleBindings(namespace).Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		s.t.Fatalf("kubetest: role binding %s: %v", name, err)
	}
	s.waitAuthorized(namespace, user, rules, true)
}

// InstallCRDs creates the CustomResourceDefinitions of docs (YAML, one
// each) and waits until the API server serves every one of them.
func (s *Server) InstallCRDs(docs [][]byte) {
	s.t.Helper()
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(s.Config(Admin))
	if err != nil {
		s.t.Fatal(err)
	}
	crds := dyn.Resource(apiextensionsv1.SchemeGroupVersion.WithResource("customresourcedefinitions"))
	var names []string
	for _, d := range docs {
		var u unstructured.Unstructured
		if err := yaml.Unmarshal(d, &u.Object); err != nil {
			s.t.Fatalf("kubetest: CRD: %v", err)
		}
		if _, err := crds.Create(ctx, &u, metav1.CreateOptions{}); err != nil {
			s.t.Fatalf("kubetest: create CRD %s: %v", u.GetName(), err)
		}
		names = append(names, u.GetName())
	}
	deadline := time.Now().Add(StartTimeout)
	for _, n := range names {
		for {
			u, err := crds.Get(ctx, n, metav1.GetOptions{})
			if err == nil && established(u) {
				break
			}
			if time.Now().After(deadline) {
				s.t.Fatalf("kubetest: CRD %s not established within %s (%v)", n, StartTimeout, err)
			}
			time.Sleep(20 * time.Millisecond) // a polling interval
		}
	}
}

func established(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == string(apiextensionsv1.Established) && m["status"] == "True" {
			return true
		}
	}
	return false
}
