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
	"github.com/meridian-router/meridian/config/kube"
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

// storeFlags select where config get, diff and apply read and write:
// etcd (--etcd) or the cluster's objects (--kubeconfig).
type storeFlags struct {
	etcdFlags
	kubeconfig, namespace string
}

func (f *storeFlags) register(cmd *cobra.Command) {
	f.etcdFlags.register(cmd)
	cmd.Flags().StringVar(&f.kubeconfig, "kubeconfig", "", "read and write the configuration as objects of this cluster (instead of etcd)")
	cmd.Flags().StringVar(&f.namespace, "namespace", "", "with --kubeconfig: the namespace of Meridian's objects (default: the context's)")
}

func (f *storeFlags) selected() bool { return len(f.endpoints) > 0 || f.kubeconfig != "" }

// configStore is etcd's config.Store or the cluster's kube.Store.
type configStore interface {
	Load(ctx context.Context) (*config.Snapshot, error)
	Plan(ctx context.Context, docs []config.Document) (configPlan, error)
	Name() string
}

// configPlan is a validated change that Commit writes all or nothing
// (etcd) or object by object under resourceVersion preconditions
// (Kubernetes).
type configPlan interface {
	Describe() string
	Changes() int
	Commit(ctx context.Context) (string, error)
}

func (f *storeFlags) open() (configStore, func(), error) {
	switch {
	case len(f.endpoints) > 0 && f.kubeconfig != "":
		return nil, nil, &exitError{2, errors.New("set either --etcd or --kubeconfig, not both")}
	case f.kubeconfig != "":
		clients, ns, err := kube.Connect(f.kubeconfig, f.namespace, "meridian-config")
		if err != nil {
			return nil, nil, err
		}
		return kubeStore{&kube.Store{Dynamic: clients.Dynamic, Client: clients.Client, Namespace: ns}}, func() {}, nil
	}
	cli, err := f.client()
	if err != nil {
		return nil, nil, err
	}
	return etcdStore{&config.Store{Client: cli, Prefix: f.prefix}}, func() { cli.Close() }, nil
}

type etcdStore struct{ *config.Store }

func (s etcdStore) Name() string { return "etcd " + s.Prefix }

func (s etcdStore) Plan(ctx context.Context, docs []config.Document) (configPlan, error) {
	p, err := s.PlanApply(ctx, docs, nil)
	if err != nil {
		return nil, err
	}
	return etcdPlan{s.Store, p}, nil
}

type etcdPlan struct {
	s *config.Store
	*config.Plan
}

func (p etcdPlan) Changes() int { return len(p.Plan.Changes) }

func (p etcdPlan) Commit(ctx context.Context) (string, error) {
	rev, err := p.s.Commit(ctx, p.Plan)
	return fmt.Sprintf("at revision %d", rev), err
}

type kubeStore struct{ *kube.Store }

func (s kubeStore) Name() string { return "kubernetes namespace " + s.Namespace }

func (s kubeStore) Plan(ctx context.Context, docs []config.Document) (configPlan, error) {
	p, err := s.PlanApply(ctx, docs, nil)
	if err != nil {
		return nil, err
	}
	return kubePlan{s.Store, p}, nil
}

type kubePlan struct {
	s *kube.Store
	*kube.Plan
}

func (p kubePlan) Changes() int { return len(p.Plan.Changes) }

func (p kubePlan) Commit(ctx context.Context) (string, error) {
	n, err := p.s.Commit(ctx, p.Plan)
	return fmt.Sprintf("to %d object(s) in namespace %s", n, p.s.Namespace), err
}

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "config",
		Short: "Validate, inspect and change Meridian's configuration",
	}
	cmd.AddCommand(newConfigValidateCmd(), newConfigGetCmd(), newConfigDiffCmd(), newConfigApplyCmd(), newConfigDriftCmd(), newConfigCRDsCmd())
	return cmd
}

func newConfigValidateCmd() *cobra.Command {
	var ef storeFlags
	cmd := &cobra.Command{
		Use:   "validate [PATH...]",
		Short: "Check configuration files (or what etcd or the cluster holds) without applying them",
		Long: "Decode every YAML file under each PATH strictly and validate the whole configuration\n" +
			"(fields and the relations between documents). Every problem is reported, each with its\n" +
			"file and field path. Exits 1 when the configuration is invalid.",
		Example: "  meridian config validate deploy/examples\n  meridian config validate --etcd 127.0.0.1:2379\n  meridian config validate --kubeconfig ~/.kube/config --namespace meridian",
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && !ef.selected() {
				return &exitError{2, errors.New("name a file or directory to validate, or --etcd, or --kubeconfig")}
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
			if ef.selected() {
				store, done, err := ef.open()
				if err != nil {
					return err
				}
				defer done()
				ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
				defer cancel()
				s, err := store.Load(ctx)
				if err == nil && len(s.Objects) == 0 {
					err = fmt.Errorf("%s: no Meridian objects found", store.Name())
				}
				if err != nil {
					failed = true
					fmt.Fprintln(cmd.ErrOrStderr(), err)
				} else {
					fmt.Fprintf(out, "%s (revision %d): valid: %d objects\n", store.Name(), s.Revision, len(s.Objects))
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
	var ef storeFlags
	var dir, output string
	cmd := &cobra.Command{
		Use:   "get [KIND[/NAME]]",
		Short: "Print objects from etcd, the cluster (or a directory)",
		Example: "  meridian config get Tenant --etcd 127.0.0.1:2379\n" +
			"  meridian config get InferenceModelRewrite --kubeconfig ~/.kube/config --namespace meridian\n" +
			"  meridian config get InferenceGatewayConfig/us-east-1a --config deploy/examples -o json",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s *config.Snapshot
			var err error
			switch {
			case dir != "":
				s, err = config.LoadDir(dir)
			default:
				store, done, oerr := ef.open()
				if oerr != nil {
					return oerr
				}
				defer done()
				ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
				defer cancel()
				s, err = store.Load(ctx)
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

// planFromFlags reads -f paths and plans applying them to the store.
func planFromFlags(cmd *cobra.Command, ef *storeFlags, files []string) (configPlan, func(), error) {
	if len(files) == 0 {
		return nil, nil, &exitError{2, errors.New("-f PATH is required")}
	}
	var docs []config.Document
	for _, f := range files {
		d, _, err := config.ReadDir(f)
		if err != nil {
			return nil, nil, &exitError{1, err}
		}
		docs = append(docs, d...)
	}
	store, done, err := ef.open()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), ef.timeout)
	defer cancel()
	plan, err := store.Plan(ctx, docs)
	if err != nil {
		done()
		if _, ok := config.AsErrors(err); ok {
			return nil, nil, &exitError{1, fmt.Errorf("%w\nthe resulting configuration would be invalid; nothing was applied", err)}
		}
		return nil, nil, err
	}
	return plan, done, nil
}

func newConfigDiffCmd() *cobra.Command {
	var ef storeFlags
	var files []string
	cmd := &cobra.Command{
		Use:     "diff -f PATH --etcd ENDPOINTS",
		Short:   "Show what `config apply` would change in etcd",
		Example: "  meridian config diff -f deploy/examples --etcd 127.0.0.1:2379",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			plan, done, err := planFromFlags(cmd, &ef, files)
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
	var ef storeFlags
	var files []string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "apply -f PATH --etcd ENDPOINTS",
		Short: "Validate and write configuration to etcd in one transaction",
		Long: "Create or replace the objects in PATH. The whole resulting configuration is validated\n" +
			"first; the changed objects are then written in one etcd transaction guarded by the revision\n" +
			"that was read, so a concurrent apply makes this one fail with a conflict instead of losing\n" +
			"an update. Objects not named in PATH are kept. With --kubeconfig the objects are written to the\n" +
			"cluster one by one, each with the resourceVersion that was read (and a guard ConfigMap first), so\n" +
			"a concurrent apply or edit makes this one fail with a conflict: read again and retry.",
		Example: "  meridian config apply -f deploy/examples --etcd 127.0.0.1:2379 --dry-run\n" +
			"  meridian config apply -f deploy/examples/platform --kubeconfig ~/.kube/config --namespace meridian",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			plan, done, err := planFromFlags(cmd, &ef, files)
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
			at, err := plan.Commit(ctx)
			if err != nil {
				if errors.Is(err, config.ErrConflict) {
					return &exitError{1, fmt.Errorf("%w\nretry: run the command again to apply over the new state", err)}
				}
				return &exitError{1, err}
			}
			fmt.Fprintf(out, "applied %d change(s) %s\n", plan.Changes(), at)
			return nil
		},
	}
	ef.register(cmd)
	cmd.Flags().StringSliceVarP(&files, "filename", "f", nil, "files or directories to apply")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "validate and show the changes without writing")
	return cmd
}

func newConfigCRDsCmd() *cobra.Command {
	var kubeconfig string
	cmd := &cobra.Command{
		Use:   "crds",
		Short: "Print the CustomResourceDefinitions the Kubernetes source reads",
		Long: "Print, as one YAML stream, every CustomResourceDefinition the Kubernetes configuration source\n" +
			"(--source kubernetes) reads: Meridian's kinds (meridian.dev: InferenceGatewayConfig, Tenant,\n" +
			"Topology, StaticEndpoints), the HyperPod-style InferenceGatewayConfig\n" +
			"(inference.sagemaker.aws.amazon.com), InferenceModelRewrite and InferenceObjective\n" +
			"(inference.networking.x-k8s.io/v1alpha2) and GIE's InferencePool (inference.networking.k8s.io/v1).\n" +
			"With --kubeconfig, definitions the cluster already has that Meridian did not install (llm-d's\n" +
			"InferenceObjective, GIE's own InferencePool) are left out, and named on stderr.",
		Example: "  meridian config crds | kubectl apply -f -\n" +
			"  meridian config crds --kubeconfig ~/.kube/config | kubectl apply -f -",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			docs := kube.CRDDocuments()
			if kubeconfig != "" {
				clients, _, err := kube.Connect(kubeconfig, "", "meridian-config")
				if err != nil {
					return err
				}
				ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
				defer cancel()
				var foreign []string
				if docs, foreign, err = kube.NotInstalledByOthers(ctx, clients.Dynamic, docs); err != nil {
					return err
				}
				for _, f := range foreign {
					fmt.Fprintf(cmd.ErrOrStderr(), "left out %s: the cluster has it from another owner; Meridian reads its objects through it\n", f)
				}
			}
			for i, d := range docs {
				if i > 0 {
					fmt.Fprintln(cmd.OutOrStdout(), "---")
				}
				if _, err := cmd.OutOrStdout().Write(d); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&kubeconfig, "kubeconfig", "", "leave out the definitions this cluster already has from another owner")
	return cmd
}
