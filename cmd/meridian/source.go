package main

import (
	"github.com/spf13/cobra"

	"github.com/meridian-router/meridian/config"
	"github.com/meridian-router/meridian/platform"
)

// registerSource adds the configuration source's flags to a
// long-running command.
func registerSource(cmd *cobra.Command, f *platform.Source) {
	cmd.Flags().StringVar(&f.Dir, "config", "", "directory (or file) of YAML configuration, reloaded on change")
	cmd.Flags().StringSliceVar(&f.Etcd, "etcd", nil, "etcd endpoints (host:port,...) to read configuration from")
	cmd.Flags().StringVar(&f.Prefix, "prefix", config.DefaultPrefix, "etcd key prefix")
	cmd.Flags().StringVar(&f.Cache, "cache", "", "last-known-good copy of the etcd configuration (default: in the user cache dir)")
	cmd.Flags().StringVar(&f.Root, "config-root", "", "with --etcd: the directory relative file paths of the configuration (spec.auth.jwt.jwksFile) are resolved against (default: the working directory)")
}
