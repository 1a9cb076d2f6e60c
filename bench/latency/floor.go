package main

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"time"
)

// floorEnv, when set to "listen,upstream", makes this binary the goproxy
// path instead of the harness: the plainest Go reverse proxy there is
// (net/http's server, httputil.ReverseProxy flushing every write, a
// keep-alive pool to Tier-1), with no authentication, limits or routing.
// It is the floor of what a Go front door built on net/http costs in this
// harness, measured in its own process like nginx and Tier-2.
const floorEnv = "MERIDIAN_LATENCY_FLOOR"

// serveFloor runs the goproxy path until the process is killed, if this
// process was started as one; otherwise it returns at once.
func serveFloor() {
	spec := os.Getenv(floorEnv)
	if spec == "" {
		return
	}
	listen, upstream, ok := strings.Cut(spec, ",")
	if !ok {
		log.Fatalf("%s=%q: want listen,upstream", floorEnv, spec)
	}
	target, err := url.Parse("http://" + upstream)
	if err != nil {
		log.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1 // relay each chunk as it comes, as the other paths do
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        1024,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.Handle("/", rp)
	log.Fatal((&http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}).ListenAndServe())
}

// startFloor starts this binary again as the goproxy path in front of
// upstream and returns its pid.
func startFloor(listen, upstream string, procs *[]*exec.Cmd) int {
	self, err := os.Executable()
	if err != nil {
		log.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), floorEnv+"="+listen+","+upstream)
	cmd.Stdout, cmd.Stderr = io.Discard, os.Stderr
	if err := cmd.Start(); err != nil {
		log.Fatalf("start goproxy: %v", err)
	}
	*procs = append(*procs, cmd)
	return cmd.Process.Pid
}
