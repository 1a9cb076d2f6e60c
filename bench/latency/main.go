// Command latency measures what Meridian's tiers add to a request, in
// separate processes on loopback: simulated model-server pods (meridian
// sim), a Tier-1 proxy (meridian tier1), a Tier-2 front door with JWT auth
// in front of it (meridian tier2) and, for comparison, nginx as a plain
// reverse proxy in front of the same Tier-1. Each run drives every path in
// turn with the same closed-loop load (N concurrent streams) and reports
// time to first byte, throughput, and each proxy's CPU time and run-queue
// wait per request; the summary gives medians over runs and each path's
// added latency over calling the pods directly in the same run. The paths
// take turns in the order given and then in reverse, run by run, so that
// the host's drift does not favour one. Every path gets --warmup of
// unmeasured load first, so that the path measured first does not pay
// alone for the start of the processes the paths share. With four runs or
// more, each path's runs are also compared with the nginx run beside them
// (quartiles). The goproxy path is the plainest net/http reverse proxy (floor.go):
// what any front door on Go's HTTP server costs here, before its own work.
// The fastfloor path is the same floor on fasthttp (bench/fastfloor: a
// module of its own, built separately and passed by path).
//
//	go build -o /tmp/meridian ./cmd/meridian
//	go run ./bench/latency --meridian /tmp/meridian --runs 5 --duration 8s
package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

var (
	meridianBin = flag.String("meridian", "", "path to a built meridian binary (required)")
	tier1Bin    = flag.String("tier1-meridian", "", "meridian binary for the simulated pods and the shared Tier-1 (default: --meridian); set it to compare two Tier-2 builds in front of the same Tier-1")
	nginxBin    = flag.String("nginx", "/usr/sbin/nginx", "path to nginx (skipped when absent)")
	fastfloor   = flag.String("fastfloor", "", "path to a built bench/fastfloor binary, for the fastfloor path (the goproxy floor on fasthttp)")
	concurrency = flag.Int("concurrency", 64, "concurrent streams")
	duration    = flag.Duration("duration", 8*time.Second, "load per path per run")
	warmup      = flag.Duration("warmup", 2*time.Second, "unmeasured load per path before the first run (0: none)")
	runs        = flag.Int("runs", 5, "runs (medians are over runs)")
	promptBytes = flag.Int("prompt-bytes", 200, "prompt size in bytes (e.g. 225280 for the 220 KB case)")
	maxTokens   = flag.Int("max-tokens", 16, "output tokens per request")
	pods        = flag.Int("pods", 4, "simulated pods")
	timeScale   = flag.Float64("time-scale", 1000, "simulated model seconds per wall-clock second (high: the pods answer at once)")
	paths       = flag.String("paths", "direct,tier1,tier2,nginx", "paths to measure: direct, tier1, tier2, nginx, goproxy, fastfloor")
	streamOpts  = flag.String("stream-options", "", `the clients' "stream_options" object (JSON, e.g. {"include_usage":true,"continuous_usage_stats":true}); empty: none`)
	unique      = flag.Bool("unique", true, "give every request a distinct prompt prefix, so that prefix affinity does not concentrate identical prompts on one pod (which measures routing, not the proxy)")
)

func main() {
	serveFloor()
	flag.Parse()
	log.SetFlags(0)
	if *meridianBin == "" {
		log.Fatal("--meridian is required: go build -o /tmp/meridian ./cmd/meridian")
	}
	if *tier1Bin == "" {
		*tier1Bin = *meridianBin
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir, err := os.MkdirTemp("", "meridian-bench-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	podPort := freePort()
	t1, t1health, t2 := freeAddr(), freeAddr(), freeAddr()
	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			p.Process.Signal(os.Interrupt)
			p.Wait()
		}
	}()
	pids := map[string]int{} // path → the process whose CPU time it measures
	start := func(name string, args ...string) {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
		if err := cmd.Start(); err != nil {
			log.Fatalf("start %s: %v", name, err)
		}
		procs = append(procs, cmd)
		if _, seen := pids[args[0]]; len(args) > 0 && !seen && (args[0] == "tier1" || args[0] == "tier2" || args[0] == "sim") {
			pids[args[0]] = cmd.Process.Pid
		}
	}
	start(*tier1Bin, "sim", "--profile", "h100", "--model", "bench", "--pods", fmt.Sprint(*pods),
		"--port", fmt.Sprint(podPort), "--time-scale", fmt.Sprint(*timeScale), "--labels", "pool=bench",
		"--endpoints-out", filepath.Join(dir, "pods.yaml"))
	podAddrs := make([]string, *pods)
	for i := range podAddrs {
		podAddrs[i] = fmt.Sprintf("127.0.0.1:%d", podPort+i)
	}
	waitHTTP("http://" + podAddrs[len(podAddrs)-1] + "/health")
	token := writeConfig(dir, t1, t1health)
	start(*tier1Bin, "tier1", "--config", dir, "--listen", t1, "--health", t1health, "--metrics", "")
	waitHTTP("http://" + t1 + "/readyz")
	start(*meridianBin, "tier2", "--config", dir, "--region", "bench", "--name", "bench", "--listen", t2, "--metrics", "", "--subscribe-all")
	waitHTTP("http://" + t2 + "/readyz")

	targets := map[string]string{"tier1": "http://" + t1, "tier2": "http://" + t2}
	if _, err := os.Stat(*nginxBin); err == nil && strings.Contains(*paths, "nginx") {
		ng := freeAddr()
		pids["nginx"] = startNginx(ctx, dir, ng, t1, &procs)
		waitHTTP("http://" + ng + "/healthz")
		targets["nginx"] = "http://" + ng
	}
	if strings.Contains(*paths, "goproxy") {
		gp := freeAddr()
		pids["goproxy"] = startFloor(gp, t1, &procs)
		waitHTTP("http://" + gp + "/healthz")
		targets["goproxy"] = "http://" + gp
	}
	// The floors built as binaries of their own: path name → binary.
	for name, bin := range map[string]string{"fastfloor": *fastfloor} {
		if bin == "" || !strings.Contains(*paths, name) {
			continue
		}
		addr := freeAddr()
		start(bin, "--listen", addr, "--upstream", t1)
		pids[name] = procs[len(procs)-1].Process.Pid
		waitHTTP("http://" + addr + "/healthz")
		targets[name] = "http://" + addr
	}
	order := strings.Split(*paths, ",")
	results := map[string][]result{}
	body := requestBody()
	if *unique {
		body = bytes.Replace(body, []byte(`"content":"`), []byte(`"content":"%08d `), 1)
	}
	// Where each path sends its load, and with which headers.
	endpoints := func(p string) ([]string, http.Header) {
		var urls []string
		switch p {
		case "direct":
			for _, a := range podAddrs {
				urls = append(urls, "http://"+a)
			}
		default:
			u, ok := targets[p]
			if !ok {
				return nil, nil
			}
			urls = []string{u}
		}
		hdr := http.Header{"Content-Type": {"application/json"}}
		if p == "tier2" {
			hdr.Set("Authorization", "Bearer "+token)
		}
		return urls, hdr
	}
	// Every path is warmed before the first measured run, so that the
	// first path measured does not alone pay for the start of the
	// processes they share (Tier-1, the pods) and the first path's own.
	for _, p := range order {
		if urls, hdr := endpoints(p); urls != nil && *warmup > 0 {
			load(urls, hdr, body, *warmup)
		}
	}
	for r := 0; r < *runs; r++ {
		for _, p := range runOrder(order, r) {
			urls, hdr := endpoints(p)
			if urls == nil {
				continue
			}
			cpu0, behind0 := procCPU(pids[p]), procCPU(pids["tier1"])+procCPU(pids["sim"])
			sched0 := procSched(pids[p])
			res := load(urls, hdr, body, *duration)
			if n := res.rps * duration.Seconds(); n > 0 {
				if pids[p] != 0 {
					res.cpuPerReq = (procCPU(pids[p]) - cpu0) / time.Duration(n)
					sched := procSched(pids[p])
					res.waitPerReq = (sched.wait - sched0.wait) / time.Duration(n)
					res.slicesPerReq = float64(sched.slices-sched0.slices) / n
				}
				res.behindPerReq = (procCPU(pids["tier1"]) + procCPU(pids["sim"]) - behind0) / time.Duration(n)
			}
			results[p] = append(results[p], res)
			fmt.Fprintf(os.Stderr, "run %d %-7s %7.0f req/s  ttfb p50 %6.2f ms  p99 %6.2f ms  proxy CPU %4.0f µs/req  run-queue wait %4.0f µs/req in %.2f slices  errors %d\n",
				r+1, p, res.rps, ms(res.p50), ms(res.p99), float64(res.cpuPerReq.Nanoseconds())/1e3,
				float64(res.waitPerReq.Nanoseconds())/1e3, res.slicesPerReq, res.errors)
		}
	}
	report(order, results)
}

type result struct {
	rps      float64
	p50, p99 time.Duration
	errors   int64
	// cpuPerReq is the CPU time (user and system) of the path's own proxy
	// process per request: Tier-2's for tier2, nginx's workers' for nginx,
	// Tier-1's for tier1 (the shared Tier-1 behind tier2 and nginx is not
	// in their figure).
	cpuPerReq time.Duration
	// behindPerReq is the CPU time of the shared Tier-1 and the simulated
	// pods per request: what the path costs the processes behind it (a
	// Tier-2 that asks for more, e.g. usage in every chunk, costs more
	// there).
	behindPerReq time.Duration
	// waitPerReq is the time the proxy's threads spent runnable but
	// waiting for a core, per request, and slicesPerReq the times they
	// were put on a core (from /proc/PID/task/*/schedstat): on a shared
	// machine every wake-up waits its turn, so a proxy that wakes more
	// threads per request adds more latency than its CPU time shows.
	waitPerReq   time.Duration
	slicesPerReq float64
}

// procCPU is the user and system CPU time of pid and its child
// processes still running (nginx's workers), from /proc; 0 when unknown.
func procCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	read := func(pid int) time.Duration {
		f := statFields(pid)
		if len(f) < 13 {
			return 0
		}
		var ut, st int64
		fmt.Sscan(f[11], &ut)
		fmt.Sscan(f[12], &st)
		return time.Duration(ut+st) * time.Second / 100 // USER_HZ is 100 on Linux
	}
	total := read(pid)
	for _, c := range children(pid) {
		total += read(c)
	}
	return total
}

// statFields are the fields of /proc/PID/stat after the command name
// (which may hold spaces); nil when the process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "stat"))
	if err != nil {
		return nil
	}
	return strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
}

// children lists the processes whose parent is pid.
func children(pid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := statFields(c); len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, c)
		}
	}
	return out
}

// schedStat is what the scheduler reports for a process's threads.
type schedStat struct {
	wait   time.Duration // runnable, waiting for a core
	slices int64         // times put on a core
}

// procSched sums /proc/PID/task/*/schedstat over pid and its children (an
// nginx master's workers), as procCPU does for CPU time. Zero where the
// kernel does not report it.
func procSched(pid int) schedStat {
	var st schedStat
	if pid == 0 {
		return st
	}
	add := func(p int) {
		tasks, _ := os.ReadDir(filepath.Join("/proc", fmt.Sprint(p), "task"))
		for _, t := range tasks {
			b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(p), "task", t.Name(), "schedstat"))
			if err != nil {
				continue
			}
			var run, wait, slices int64
			if n, _ := fmt.Sscan(string(b), &run, &wait, &slices); n == 3 {
				st.wait += time.Duration(wait)
				st.slices += slices
			}
		}
	}
	add(pid)
	for _, c := range children(pid) {
		add(c)
	}
	return st
}

func requestBody() []byte {
	prompt := strings.Repeat("The quick brown fox jumps over the lazy dog. ", *promptBytes/45+1)[:*promptBytes]
	body := map[string]any{"model": "bench", "stream": true, "max_tokens": *maxTokens,
		"messages": []map[string]string{{"role": "user", "content": prompt}}}
	if *streamOpts != "" {
		body["stream_options"] = json.RawMessage(*streamOpts)
	}
	b, err := json.Marshal(body)
	if err != nil {
		log.Fatalf("--stream-options %s: %v", *streamOpts, err)
	}
	return b
}

// load runs the closed loop against urls (round robin) and measures time
// to first byte of each streamed response.
func load(urls []string, hdr http.Header, body []byte, d time.Duration) result {
	tr := &http.Transport{MaxIdleConnsPerHost: *concurrency * 2, MaxIdleConns: *concurrency * 4, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 60 * time.Second}
	var mu sync.Mutex
	var ttfb []time.Duration
	var errs, done atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < *concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 1024)
			buf := make([]byte, 32<<10)
			for time.Now().Before(deadline) {
				seq := next.Add(1)
				u := urls[int(seq)%len(urls)]
				b := body
				if *unique {
					b = []byte(fmt.Sprintf(string(body), seq))
				}
				req, _ := http.NewRequest(http.MethodPost, u+"/v1/chat/completions", bytes.NewReader(b))
				req.Header = hdr.Clone()
				t0 := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					errs.Add(1)
					continue
				}
				n, rerr := resp.Body.Read(buf)
				first := time.Since(t0)
				if n == 0 && rerr != nil || resp.StatusCode != http.StatusOK {
					errs.Add(1)
				} else {
					local = append(local, first)
					done.Add(1)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			mu.Lock()
			ttfb = append(ttfb, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(ttfb)
	q := func(p float64) time.Duration {
		if len(ttfb) == 0 {
			return 0
		}
		return ttfb[int(float64(len(ttfb)-1)*p)]
	}
	return result{rps: float64(done.Load()) / d.Seconds(), p50: q(0.5), p99: q(0.99), errors: errs.Load()}
}

// runOrder is the order of the paths in run r: as given in even runs,
// reversed in odd ones, so that a drift of the host over the runs (another
// tenant arriving, a process's state growing) does not always favour the
// path measured first.
func runOrder(order []string, r int) []string {
	if r%2 == 0 {
		return order
	}
	rev := slices.Clone(order)
	slices.Reverse(rev)
	return rev
}

func report(order []string, results map[string][]result) {
	med := func(xs []float64) float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		if len(s) == 0 {
			return 0
		}
		return s[len(s)/2]
	}
	fmt.Printf("\n%d concurrent streams, %d-byte prompts, %d output tokens, %d runs × %s per path; medians over runs.\n\n",
		*concurrency, *promptBytes, *maxTokens, *runs, *duration)
	fmt.Println("| path | req/s | TTFB p50 (ms) | TTFB p99 (ms) | added p50 (ms) | added p99 (ms) | req/s ÷ nginx | proxy CPU µs/req | CPU ÷ nginx | Tier-1 + pods CPU µs/req | proxy run-queue wait µs/req |")
	fmt.Println("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	direct := results["direct"]
	nginx := results["nginx"]
	for _, p := range order {
		rs := results[p]
		if len(rs) == 0 {
			continue
		}
		var rps, p50, p99, a50, a99, ratio, cpu, cpuRatio, behind, wait []float64
		for i, r := range rs {
			rps = append(rps, r.rps)
			wait = append(wait, float64(r.waitPerReq.Nanoseconds())/1e3)
			behind = append(behind, float64(r.behindPerReq.Nanoseconds())/1e3)
			cpu = append(cpu, float64(r.cpuPerReq.Nanoseconds())/1e3)
			if i < len(nginx) && nginx[i].cpuPerReq > 0 {
				cpuRatio = append(cpuRatio, float64(r.cpuPerReq)/float64(nginx[i].cpuPerReq))
			}
			p50 = append(p50, ms(r.p50))
			p99 = append(p99, ms(r.p99))
			if i < len(direct) {
				a50 = append(a50, ms(r.p50)-ms(direct[i].p50))
				a99 = append(a99, ms(r.p99)-ms(direct[i].p99))
			}
			if i < len(nginx) && nginx[i].rps > 0 {
				ratio = append(ratio, r.rps/nginx[i].rps)
			}
		}
		ra := "—"
		if len(ratio) > 0 {
			ra = fmt.Sprintf("%.2f", med(ratio))
		}
		cr := "—"
		if len(cpuRatio) > 0 && med(cpu) > 0 {
			cr = fmt.Sprintf("%.2f", med(cpuRatio))
		}
		fmt.Printf("| %s | %.0f | %.2f | %.2f | %.2f | %.2f | %s | %.0f | %s | %.0f | %.0f |\n", p, med(rps), med(p50), med(p99), med(a50), med(a99), ra, med(cpu), cr, med(behind), med(wait))
	}
	pairedWithNginx(order, results)
}

// pairedWithNginx prints, for four runs or more, the spread of each path's
// runs against the nginx run beside it (run i against run i, measured
// minutes apart at most): the quartiles of req/s ÷ nginx's and of the
// TTFB p99 difference. A long series of short runs (-runs 30 -duration
// 2s) puts a figure's centre within a percent on a machine whose sittings
// differ by ten.
func pairedWithNginx(order []string, results map[string][]result) {
	nginx := results["nginx"]
	if len(nginx) < 4 {
		return
	}
	quartiles := func(xs []float64) [3]float64 {
		s := slices.Clone(xs)
		slices.Sort(s)
		at := func(q float64) float64 { // linear between the two nearest ranks
			pos := q * float64(len(s)-1)
			i := int(pos)
			if i+1 >= len(s) {
				return s[len(s)-1]
			}
			return s[i] + (pos-float64(i))*(s[i+1]-s[i])
		}
		return [3]float64{at(0.25), at(0.5), at(0.75)}
	}
	fmt.Printf("\nPaired with nginx, run by run (quartiles: q1 / median / q3).\n\n")
	fmt.Println("| path | runs | req/s ÷ nginx | TTFB p99 − nginx's (ms) | TTFB p99 ÷ nginx's |")
	fmt.Println("| --- | ---: | --- | --- | --- |")
	for _, p := range order {
		if p == "nginx" {
			continue
		}
		var ratio, diff, rel []float64
		for i, r := range results[p] {
			if i >= len(nginx) || nginx[i].rps == 0 || nginx[i].p99 == 0 {
				continue
			}
			ratio = append(ratio, r.rps/nginx[i].rps)
			diff = append(diff, ms(r.p99)-ms(nginx[i].p99))
			rel = append(rel, float64(r.p99)/float64(nginx[i].p99))
		}
		if len(ratio) < 4 {
			continue
		}
		q, d, e := quartiles(ratio), quartiles(diff), quartiles(rel)
		fmt.Printf("| %s | %d | %.3f / %.3f / %.3f | %+.2f / %+.2f / %+.2f | %.3f / %.3f / %.3f |\n", p, len(ratio), q[0], q[1], q[2], d[0], d[1], d[2], e[0], e[1], e[2])
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func writeConfig(dir, t1, t1health string) string {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		log.Fatal(err)
	}
	jwks, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: key.Public(), KeyID: "bench", Algorithm: "ES256", Use: "sig"}}})
	must(os.WriteFile(filepath.Join(dir, "jwks.json"), jwks, 0o644))
	cfg := fmt.Sprintf(`apiVersion: meridian.dev/v1alpha1
kind: Topology
metadata: {name: bench}
spec:
  regions:
  - name: bench
    clusters: [{name: bench, tier1: "http://%s", health: %q}]
---
apiVersion: meridian.dev/v1alpha1
kind: InferenceGatewayConfig
metadata: {name: bench}
spec:
  region: bench
  cluster: bench
  auth:
    jwt:
      issuer: bench
      audiences: [meridian]
      jwksFile: jwks.json
  schedulers:
  - name: bench
    modelName: bench
    modelSelector: {matchLabels: {pool: bench}}
---
apiVersion: meridian.dev/v1alpha1
kind: Tenant
metadata: {name: bench}
spec:
  limits:
    requests: {limit: 100000000, per: 1m}
    tokens: {limit: 100000000000, per: 1m}
`, t1, t1health)
	must(os.WriteFile(filepath.Join(dir, "platform.yaml"), []byte(cfg), 0o644))
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"iss": "bench", "aud": "meridian", "sub": "bench",
		"tenant": "bench", "iat": time.Now().Unix(), "exp": time.Now().Add(24 * time.Hour).Unix()})
	tok.Header["kid"] = "bench"
	s, err := tok.SignedString(key)
	must(err)
	return s
}

func startNginx(ctx context.Context, dir, listen, upstream string, procs *[]*exec.Cmd) int {
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx-error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  client_max_body_size 8m;
  upstream tier1 { server %[3]s; keepalive 256; }
  server {
    listen %[2]s;
    location / {
      proxy_pass http://tier1;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
`, dir, listen, upstream)
	path := filepath.Join(dir, "nginx.conf")
	must(os.WriteFile(path, []byte(conf), 0o644))
	cmd := exec.CommandContext(ctx, *nginxBin, "-c", path, "-p", dir, "-e", filepath.Join(dir, "nginx-error.log"))
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	must(cmd.Start())
	*procs = append(*procs, cmd)
	return cmd.Process.Pid
}

func waitHTTP(url string) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatalf("%s not ready after 30s", url)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	defer l.Close()
	return l.Addr().String()
}

// freePort returns a port p such that p..p+pods-1 were free.
func freePort() int {
	for try := 0; try < 50; try++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		must(err)
		p := l.Addr().(*net.TCPAddr).Port
		l.Close()
		ok := true
		for i := 1; i < *pods; i++ {
			l2, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				ok = false
				break
			}
			l2.Close()
		}
		if ok {
			return p
		}
	}
	log.Fatal("no run of free ports")
	return 0
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
