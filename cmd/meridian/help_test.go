package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// runMeridian runs the meridian command line with args and returns what
// it printed and its error.
func runMeridian(t *testing.T, args ...string) (string, error) {
	t.Helper()
	root := newRootCmd()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.ExecuteContext(context.Background())
	return out.String(), err
}

// Every flag of every command renders in its help as --name type (or
// --name alone for a boolean), and none shows an empty default "(default
// [])". pflag takes a back-quoted phrase in a flag's usage as its type's
// name, which once rendered "--etcd meridian canary --etcd" and
// "--prompt-samples meridian diagnose prompts".
func TestHelpRendersFlagTypes(t *testing.T) {
	flagLine := regexp.MustCompile(`^\s+(?:-\w, )?--([\w-]+)(?: (\S+))?(?:\s{2,}|$)`)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.LocalFlags(), c.InheritedFlags()} {
			bools := map[string]bool{}
			fs.VisitAll(func(f *pflag.Flag) { bools[f.Name] = f.Value.Type() == "bool" })
			for _, line := range strings.Split(fs.FlagUsages(), "\n") {
				if strings.TrimSpace(line) == "" || !strings.HasPrefix(strings.TrimSpace(line), "-") {
					continue
				}
				m := flagLine.FindStringSubmatch(line)
				switch {
				case m == nil:
					t.Errorf("%s: flag line not rendered as --name type: %q", c.CommandPath(), line)
				case !bools[m[1]] && !regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`).MatchString(m[2]):
					t.Errorf("%s --%s renders its type as %q: %q", c.CommandPath(), m[1], m[2], line)
				case strings.Contains(line, "(default [])"):
					t.Errorf("%s --%s shows an empty default: %q", c.CommandPath(), m[1], line)
				}
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRootCmd())
}

// config validate on a directory without Meridian objects is an error,
// not "valid: 0 object(s)".
func TestConfigValidateRefusesEmpty(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("# not configuration\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{t.TempDir(), dir} {
		out, err := runMeridian(t, "config", "validate", d)
		if err == nil || !strings.Contains(out, "no Meridian objects found") {
			t.Errorf("config validate %s: %v, printed %q; want an error naming that nothing was found", d, err, out)
		}
	}
	if out, err := runMeridian(t, "config", "validate", "../../deploy/examples/platform"); err != nil {
		t.Errorf("config validate of the example platform: %v\n%s", err, out)
	}
}
