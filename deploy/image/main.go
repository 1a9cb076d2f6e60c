// Command image builds Meridian's OCI image without a Docker daemon: the
// static binary (CGO off, -trimpath) in one layer over nothing, run as
// the non-root user 65532, with the OCI labels for version and source.
// The same sources and version give the same image digest (file times and
// the created time are SOURCE_DATE_EPOCH, or the Unix epoch).
//
//	go run ./deploy/image -o meridian.tar -version 0.1.0             # docker-archive tarball
//	go run ./deploy/image -layout ./oci -version 0.1.0               # OCI image layout
//	crane push meridian.tar ACCOUNT.dkr.ecr.REGION.amazonaws.com/meridian:0.1.0
//	skopeo copy oci:./oci docker://ACCOUNT.dkr.ecr.REGION.amazonaws.com/meridian:0.1.0
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Where the binary lives in the image, and who runs it.
const (
	binaryPath = "/usr/local/bin/meridian"
	user       = "65532:65532" // the chart's runAsUser
	source     = "https://github.com/meridian-router/meridian"
)

// Options say what image to build.
type Options struct {
	Version  string    // the binary's version (main.version) and the image label
	Revision string    // VCS revision label; empty: none
	Arch     string    // GOARCH: amd64 or arm64
	Created  time.Time // file times and the image's created time
}

func main() {
	var (
		out, dir, ref string
		o             Options
	)
	flag.StringVar(&out, "o", "", "write a docker-archive tarball (crane push, skopeo docker-archive:, docker load)")
	flag.StringVar(&dir, "layout", "", "write an OCI image layout directory (skopeo oci:)")
	flag.StringVar(&ref, "tag", "meridian", "the image's name in the tarball (its tag is the version)")
	flag.StringVar(&o.Version, "version", "dev", "version: the binary's and the image's label")
	flag.StringVar(&o.Revision, "revision", "", "source revision label (e.g. git rev-parse HEAD)")
	flag.StringVar(&o.Arch, "arch", "amd64", "target architecture (amd64, arm64)")
	flag.Parse()
	if out == "" && dir == "" {
		fmt.Fprintln(os.Stderr, "image: give -o FILE.tar or -layout DIR")
		os.Exit(2)
	}
	o.Created = sourceDate()
	ctx := context.Background()
	if err := run(ctx, o, out, dir, ref); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o Options, out, dir, ref string) error {
	tmp, err := os.MkdirTemp("", "meridian-image")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "meridian")
	if err := BuildBinary(ctx, bin, o); err != nil {
		return err
	}
	img, err := Image(bin, o)
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if out != "" {
		tag, err := name.NewTag(ref + ":" + o.Version)
		if err != nil {
			return fmt.Errorf("-tag %s: %w", ref, err)
		}
		if err := tarball.WriteToFile(out, tag, img); err != nil {
			return err
		}
		fmt.Printf("%s: %s %s\n", out, tag, digest)
	}
	if dir != "" {
		p, err := layout.Write(dir, empty.Index)
		if err != nil {
			return err
		}
		if err := p.AppendImage(img); err != nil {
			return err
		}
		fmt.Printf("%s: %s\n", dir, digest)
	}
	return nil
}

// sourceDate is SOURCE_DATE_EPOCH (reproducible builds' convention), or
// the Unix epoch.
func sourceDate() time.Time {
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			return time.Unix(n, 0).UTC()
		}
	}
	return time.Unix(0, 0).UTC()
}

// BuildBinary builds cmd/meridian for linux/o.Arch into path: static
// (CGO off), without file paths or build ids that differ between
// machines.
func BuildBinary(ctx context.Context, path string, o Options) error {
	root, err := moduleRoot(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags", "-s -w -buildid= -X main.version="+o.Version, "-o", path, "./cmd/meridian")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build: %w\n%s", err, b)
	}
	return nil
}

func moduleRoot(ctx context.Context) (string, error) {
	b, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("not inside Meridian's module: run from the repository")
	}
	return filepath.Dir(mod), nil
}

// Image is the image of the linux binary at bin: one layer with the
// binary, a passwd and group naming the non-root user, its home and /tmp;
// the config runs the binary as that user.
func Image(bin string, o Options) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	layerTar, err := rootfs(data, o.Created)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: o.Created}, CreatedBy: "go run ./deploy/image", Comment: "meridian " + o.Version}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = o.Arch, "linux"
	cf.Created = v1.Time{Time: o.Created}
	labels := map[string]string{
		"org.opencontainers.image.title":       "meridian",
		"org.opencontainers.image.description": "Meridian: a global router for LLM inference",
		"org.opencontainers.image.version":     o.Version,
		"org.opencontainers.image.source":      source,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	if o.Revision != "" {
		labels["org.opencontainers.image.revision"] = o.Revision
	}
	cf.Config = v1.Config{
		User:       user,
		Entrypoint: []string{binaryPath},
		Env:        []string{"PATH=/usr/local/bin"},
		WorkingDir: "/home/nonroot",
		Labels:     labels,
		ExposedPorts: map[string]struct{}{
			"8080/tcp": {}, "9002/tcp": {}, "9004/tcp": {}, "9090/tcp": {}, "7946/tcp": {}, "7946/udp": {},
		},
	}
	return mutate.ConfigFile(img, cf)
}

// rootfs is the layer's tar: directories, the user's files and the binary,
// every time set to created.
func rootfs(binary []byte, created time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	entry := func(h *tar.Header, body []byte) error {
		h.ModTime, h.Format = created, tar.FormatPAX
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(body)
		return err
	}
	dir := func(name string, mode int64, uid int) error {
		return entry(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: uid}, nil)
	}
	file := func(name string, mode int64, body string) error {
		return entry(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}, []byte(body))
	}
	for _, step := range []func() error{
		func() error { return dir("etc/", 0o755, 0) },
		func() error {
			return file("etc/passwd", 0o644, "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
		},
		func() error { return file("etc/group", 0o644, "root:x:0:\nnonroot:x:65532:\n") },
		func() error { return dir("home/", 0o755, 0) },
		func() error { return dir("home/nonroot/", 0o700, 65532) },
		func() error { return dir("tmp/", 0o1777, 0) },
		func() error { return dir("usr/", 0o755, 0) },
		func() error { return dir("usr/local/", 0o755, 0) },
		func() error { return dir("usr/local/bin/", 0o755, 0) },
		func() error {
			return entry(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(binaryPath, "/"), Mode: 0o755}, binary)
		},
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
