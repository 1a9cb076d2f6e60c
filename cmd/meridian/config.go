package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"sigs.k8s.io/yaml"

	"github.com/meridian-router/meridian/config"
)

// etcdFlags are the flags of every command that talks to etcd.
type etcdFlags struct {
	endpoints []string
	prefix    string
	timeout   time.Duration
}

func (f *etcdFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringSliceVar(&f.endpoints, "etcd", nil, "etcd endpoints (host:port,...)")
	cmd.Flags().StringVar(&f.prefix, "prefix", config.DefaultPrefix, "etcd key prefix of Meridian's objects")
	cmd.Flags().DurationVar(&f.timeout, "timeout", 10*time.Second, "time limit for etcd operations")
}

func (f *etcdFlags) client() (*clientv3.Client, error) {
	if len(f.endpoints) == 0 {
		return nil, &exitError{2, errors.New("--etcd is required")}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   f.endpoints,
		DialTimeout: 5 * time.Second,
		Logger:      zap.NewNop(),
	})
	if err != nil {
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return cli, nil
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate, inspect and change Meridian's configuration",
	}
	cmd.AddCommand(newConfigValidateCmd(), newConfigGetCmd(), newConfigDiffCmd(), newConfigApplyCmd(), newConfigDriftCmd())
	return cmd
}

func newConfigValidateCmd() *cobra.Command {
	var ef etcdFlags
	cmd := &cobra.Command{
		Use:   "validate [PATH...]",
		Short: "Check configuration files (or what etcd holds) without applying them",
		Long: "Decode every YAML file under each PATH strictly and validate the whole configuration\n" +
			"(fields and the relations between documents). Every problem is reported, each with its\n" +
			"file and field path. Exits 1 when the configuration is invalid.",
		Example: "  meridian config validate deploy/examples\n  meridian config validate --etcd 127.0.0.1:2379",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && len(ef.endpoints) == 0 {
				return &exitError{2, errors.New("name a file or directory to validate, or --etcd")}
			}
			out := cmd.OutOrStdout()
			failed := false
			for _, p := range args {
				docs, files, err := config.ReadDir(p)
				if err == nil && len(docs) == 0 {
					// Nothing to validate is no configuration: a wrong path
					// or a directory of other YAML must not read as valid.
					err = fmt.Errorf("%s: no Meridian objects found (%d YAML file(s) read): name the directory of the platform's configuration", p, len(files))
				} else if err == nil {
					_, err = config.Build(docs, 0)
				} else if errs, ok := config.AsErrors(err); ok {
					if _, berr := config.Build(docs, 0); berr != nil {
						more, _ := config.AsErrors(berr)
						err = append(errs, more...)
					}
				}
				if err != nil {
					failed = true
					fmt.Fprintln(cmd.ErrOrStderr(), err)
					if errs, ok := config.AsErrors(err); ok {
						fmt.Fprintf(cmd.ErrOrStderr(), "%s: invalid: %d problem(s)\n", p, len(errs))
					}
					continue
				}
				fmt.Fprintf(out, "%s: valid: %s in %d file(s)\n", p, summarize(docs), len(files))
			}
			if len(ef.endpoints) > 0 {
				cli, err := ef.client()
				if err != nil {
					return err
				}
				defer cli.Close()
				ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
				defer cancel()
				s, err := (&config.Store{Client: cli, Prefix: ef.prefix}).Load(ctx)
				if err != nil {
					failed = true
					fmt.Fprintln(cmd.ErrOrStderr(), err)
				} else {
					fmt.Fprintf(out, "etcd %s (revision %d): valid: %d objects\n", ef.prefix, s.Revision, len(s.Objects))
				}
			}
			if failed {
				return &exitError{1, errors.New("configuration is invalid")}
			}
			return nil
		},
	}
	ef.register(cmd)
	return cmd
}

func summarize(docs []config.Document) string {
	counts := map[string]int{}
	for _, d := range docs {
		counts[d.Key.Kind]++
	}
	kinds := slices.Sorted(maps.Keys(counts))
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%d %s", counts[k], k)
	}
	return fmt.Sprintf("%d object(s) (%s)", len(docs), strings.Join(parts, ", "))
}

func newConfigGetCmd() *cobra.Command {
	var ef etcdFlags
	var dir, output string
	cmd := &cobra.Command{
		Use:   "get [KIND[/NAME]]",
		Short: "Print objects from etcd (or a directory)",
		Example: "  meridian config get Tenant --etcd 127.0.0.1:2379\n" +
			"  meridian config get InferenceGatewayConfig/us-east-1a --config deploy/examples -o json",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s *config.Snapshot
			var err error
			switch {
			case dir != "":
				s, err = config.LoadDir(dir)
			default:
				cli, cerr := ef.client()
				if cerr != nil {
					return cerr
				}
				defer cli.Close()
				ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
				defer cancel()
				s, err = (&config.Store{Client: cli, Prefix: ef.prefix}).Load(ctx)
			}
			if err != nil {
				return err
			}
			kind, name := "", ""
			if len(args) == 1 {
				kind, name, _ = strings.Cut(args[0], "/")
			}
			n := 0
			for _, k := range s.Keys() {
				if kind != "" && !strings.EqualFold(k.Kind, kind) || name != "" && k.Name != name {
					continue
				}
				if err := printObject(cmd.OutOrStdout(), output, s.Objects[k].JSON, n); err != nil {
					return err
				}
				n++
			}
			if n == 0 && len(args) == 1 {
				return &exitError{1, fmt.Errorf("no object matches %q", args[0])}
			}
			return nil
		},
	}
	ef.register(cmd)
	cmd.Flags().StringVar(&dir, "config", "", "read a directory of YAML files instead of etcd")
	cmd.Flags().StringVarP(&output, "output", "o", "yaml", "output format: yaml or json")
	return cmd
}

func printObject(w io.Writer, format string, js []byte, n int) error {
	switch format {
	case "json":
		var v any
		if err := json.Unmarshal(js, &v); err != nil {
			return err
		}
		b, _ := json.MarshalIndent(v, "", "  ")
		_, err := fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.JSONToYAML(js)
		if err != nil {
			return err
		}
		if n > 0 {
			fmt.Fprintln(w, "---")
		}
		_, err = w.Write(b)
		return err
	}
	return &exitError{2, fmt.Errorf("unknown output format %q: want yaml or json", format)}
}

// planFromFlags reads -f paths and plans applying them to etcd.
func planFromFlags(cmd *cobra.Command, ef *etcdFlags, files []string) (*config.Store, *config.Plan, func(), error) {
	if len(files) == 0 {
		return nil, nil, nil, &exitError{2, errors.New("-f PATH is required")}
	}
	var docs []config.Document
	for _, f := range files {
		d, _, err := config.ReadDir(f)
		if err != nil {
			return nil, nil, nil, &exitError{1, err}
		}
		docs = append(docs, d...)
	}
	cli, err := ef.client()
	if err != nil {
		return nil, nil, nil, err
	}
	store := &config.Store{Client: cli, Prefix: ef.prefix}
	ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
	defer cancel()
	plan, err := store.PlanApply(ctx, docs, nil)
	if err != nil {
		cli.Close()
		if _, ok := config.AsErrors(err); ok {
			return nil, nil, nil, &exitError{1, fmt.Errorf("%w\nthe resulting configuration would be invalid; nothing was applied", err)}
		}
		return nil, nil, nil, err
	}
	return store, plan, func() { cli.Close() }, nil
}

func newConfigDiffCmd() *cobra.Command {
	var ef etcdFlags
	var files []string
	cmd := &cobra.Command{
		Use:     "diff -f PATH --etcd ENDPOINTS",
		Short:   "Show what `config apply` would change in etcd",
		Example: "  meridian config diff -f deploy/examples --etcd 127.0.0.1:2379",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, plan, done, err := planFromFlags(cmd, &ef, files)
			if err != nil {
				return err
			}
			defer done()
			fmt.Fprint(cmd.OutOrStdout(), plan.Describe())
			return nil
		},
	}
	ef.register(cmd)
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "files or directories to compare")
	return cmd
}

func newConfigApplyCmd() *cobra.Command {
	var ef etcdFlags
	var files []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f PATH --etcd ENDPOINTS",
		Short: "Validate and write configuration to etcd in one transaction",
		Long: "Create or replace the objects in PATH. The whole resulting configuration is validated\n" +
			"first; the changed objects are then written in one etcd transaction guarded by the revision\n" +
			"that was read, so a concurrent apply makes this one fail with a conflict instead of losing\n" +
			"an update. Objects not named in PATH are kept.",
		Example: "  meridian config apply -f deploy/examples --etcd 127.0.0.1:2379 --dry-run",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			store, plan, done, err := planFromFlags(cmd, &ef, files)
			if err != nil {
				return err
			}
			defer done()
			out := cmd.OutOrStdout()
			fmt.Fprint(out, plan.Describe())
			if dryRun {
				fmt.Fprintln(out, "dry run: nothing written")
				return nil
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
			defer cancel()
			rev, err := store.Commit(ctx, plan)
			if err != nil {
				return &exitError{1, err}
			}
			fmt.Fprintf(out, "applied %d change(s) at revision %d\n", len(plan.Changes), rev)
			return nil
		},
	}
	ef.register(cmd)
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "files or directories to apply")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate and show the changes without writing")
	return cmd
}
