package main

import (
	"archive/tar"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TestImage builds the image as the release does (a real go build of
// cmd/meridian, no Docker), writes it as a tarball and as an OCI layout,
// reads it back, checks its config (non-root user, entrypoint, labels,
// OCI media types), that its one layer holds the binary and no shell,
// runs the binary from the layer (meridian version), and checks that the
// same binary gives the same digest.
func TestImage(t *testing.T) {
	if runtime.GOOS != "linux" || (runtime.GOARCH != "amd64" && runtime.GOARCH != "arm64") {
		t.Skipf("the image is linux/amd64 or arm64; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute) // a cold build of every package without cgo
	defer cancel()
	dir := t.TempDir()
	o := Options{Version: "9.8.7-test", Revision: "abc123", Arch: runtime.GOARCH, Created: time.Unix(0, 0).UTC()}
	bin := filepath.Join(dir, "meridian")
	if err := BuildBinary(ctx, bin, o); err != nil {
		t.Fatal(err)
	}
	img, err := Image(bin, o)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("meridian:" + o.Version)
	archive := filepath.Join(dir, "meridian.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(archive, &tag)
	if err != nil {
		t.Fatal(err)
	}
	// A docker-archive keeps the config and layers; its manifest is made
	// anew on reading, so the config's digest is what must agree.
	want, _ := img.Digest()
	wantConfig, _ := img.ConfigName()
	if got, _ := back.ConfigName(); got != wantConfig {
		t.Errorf("the tarball's image config is %s, want %s", got, wantConfig)
	}
	cf, err := back.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cf.Config
	if c.User != "65532:65532" || len(c.Entrypoint) != 1 || c.Entrypoint[0] != binaryPath || cf.OS != "linux" || cf.Architecture != o.Arch {
		t.Errorf("config: user %q entrypoint %v os %s arch %s", c.User, c.Entrypoint, cf.OS, cf.Architecture)
	}
	for k, v := range map[string]string{"org.opencontainers.image.version": o.Version, "org.opencontainers.image.source": source,
		"org.opencontainers.image.revision": o.Revision} {
		if c.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, c.Labels[k], v)
		}
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %s, want OCI", mt)
	}

	// The one layer: the binary, the user's files, no shell.
	layers, err := back.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers, %v; want one", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	files := map[string]*tar.Header{}
	extracted := filepath.Join(dir, "from-layer")
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files["/"+h.Name] = h
		if "/"+h.Name == binaryPath {
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
		if h.Name == "etc/passwd" {
			b, _ := io.ReadAll(tr)
			if !strings.Contains(string(b), "nonroot:x:65532:65532") {
				t.Errorf("/etc/passwd does not name user 65532: %q", b)
			}
		}
	}
	if h := files[binaryPath]; h == nil || h.Mode != 0o755 || h.Uid != 0 {
		t.Fatalf("the binary's entry: %+v", h)
	}
	for _, sh := range []string{"/bin/sh", "/bin/bash", "/usr/bin/sh"} {
		if files[sh] != nil {
			t.Errorf("the image holds a shell: %s", sh)
		}
	}
	out, err := exec.CommandContext(ctx, extracted, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), o.Version) {
		t.Errorf("meridian version from the layer: %q, %v; want it to name %s", out, err, o.Version)
	}

	// An OCI layout of the same image, and the same binary gives the same
	// digest.
	lp, err := layout.Write(filepath.Join(dir, "oci"), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 || m.Manifests[0].Digest != want {
		t.Errorf("OCI layout index %+v, %v; want the image %s", m, err, want)
	}
	again, err := Image(bin, o)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := again.Digest(); d != want {
		t.Errorf("the same binary gave %s, then %s: not reproducible", want, d)
	}
}
