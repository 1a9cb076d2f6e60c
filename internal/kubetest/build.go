package kubetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Version is the kube-apiserver the tests run: the k8s.io/kubernetes
// release the nested module apiserver/go.mod pins.
const Version = "v1.34.2"

// BuildTimeout bounds building the API server, the lock wait included:
// about 5 minutes of CPU on 2 cores cold, more on a loaded machine.
const BuildTimeout = 30 * time.Minute

// ldflags stamp the version into the binary, as Kubernetes' own build
// does: without them the server reports v0.0.0-master, which clients that
// check versions (Helm's kubeVersion) refuse.
var ldflags = func() string {
	major, minor, _ := strings.Cut(strings.TrimPrefix(Version, "v"), ".")
	minor, _, _ = strings.Cut(minor, ".")
	var b strings.Builder
	for _, pkg := range []string{"k8s.io/component-base/version", "k8s.io/client-go/pkg/version"} {
		fmt.Fprintf(&b, "-X %[1]s.gitVersion=%[2]s -X %[1]s.gitMajor=%[3]s -X %[1]s.gitMinor=%[4]s -X %[1]s.gitTreeState=clean ", pkg, Version, major, minor)
	}
	return strings.TrimSpace(b.String())
}()

// moduleDir is the nested module that pins the API server, beside this
// file.
func moduleDir() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("kubetest: cannot locate the kube-apiserver module")
	}
	return filepath.Join(filepath.Dir(file), "apiserver"), nil
}

// Binary returns the path of the kube-apiserver binary, building it first
// when this machine has none for the pinned module. The binary lives
// outside the repository, in the user cache directory
// (meridian/kube-apiserver-<Version>-<hash of go.mod, go.sum and the ldflags>), so a
// clone or a `git clean` keeps it and a change of the pins builds anew.
// Test packages that ask at once build it once: the build holds a lock
// file, and writes a temporary name that it renames when complete.
func Binary(ctx context.Context) (string, error) {
	mod, err := moduleDir()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	h.Write([]byte(ldflags))
	for _, f := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join(mod, f))
		if err != nil {
			return "", fmt.Errorf("kubetest: %w", err)
		}
		h.Write(b)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "meridian")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	bin := filepath.Join(dir, "kube-apiserver-"+Version+"-"+hex.EncodeToString(h.Sum(nil))[:12])
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}

	ctx, cancel := context.WithTimeout(ctx, BuildTimeout)
	defer cancel()
	unlock, err := lock(ctx, bin+".lock")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(bin); err == nil {
		return bin, nil // another package built it while this one waited
	}
	tmp := fmt.Sprintf("%s.%d.tmp", bin, os.Getpid())
	defer os.Remove(tmp)
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp, "-ldflags", ldflags, "k8s.io/kubernetes/cmd/kube-apiserver")
	cmd.Dir = mod
	// The test's own build settings (-race, a GOFLAGS of the caller) are
	// not the server's.
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=readonly -buildvcs=false")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("kubetest: go build k8s.io/kubernetes/cmd/kube-apiserver in %s: %w\n%s", mod, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", fmt.Errorf("kubetest: %w", err)
	}
	fmt.Fprintf(os.Stderr, "kubetest: built kube-apiserver %s in %s: %s\n", Version, time.Since(start).Round(time.Second), bin)
	return bin, nil
}

// lock takes an exclusive lock on path, polling until ctx ends.
func lock(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("kubetest: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("kubetest: lock %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("kubetest: waiting for another build of kube-apiserver (%s): %w", path, ctx.Err())
		case <-time.After(500 * time.Millisecond): // a polling interval
		}
	}
}
