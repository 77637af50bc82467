// Command raftlockd is the daemon and its command line: `raftlockd server`
// runs a node (a self-bootstrapping single-node cluster by default),
// `raftlockd client ...` drives leases and state from a shell, `raftlockd
// snapshot`, `raftlockd cluster` and `raftlockd tc` are the operator's
// commands, `raftlockd auth` issues, inspects and revokes certificate
// bundles, `raftlockd health` probes a node for container health checks,
// `raftlockd bench` measures a cluster, `raftlockd version` says what was
// built. Client and operator commands present a bundle over mutual TLS; on
// the server's machine they find its bundles without flags. Every flag can
// also be set through an environment variable named after it
// (RAFTLOCKD_<FLAG> for the server, RAFTLOCKD_CLIENT_<FLAG> for client and
// operator commands), which is how `eval "$(raftlockd client acquire ...)"`
// hands a lease to the commands that follow.
package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"reflect"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raftlockd/raftlockd/errcode"
)

var version = "" // set with -ldflags "-X main.version=..."

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				v += " (" + s.Value[:12] + ")"
			}
		}
		return v
	}
	return "unknown"
}

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "raftlockd:", errorText(err))
		os.Exit(1)
	}
}

// errorText is err as the command line prints it: followed, for a
// server's refusal, by what its error envelope holds besides the code and
// the detail (the version and ETag a failed condition was compared with,
// the leader, the island coordinating a transaction), which a caller
// needs to act on it.
func errorText(err error) string {
	var e *errcode.Error
	if !errors.As(err, &e) {
		return err.Error()
	}
	var extra []string
	if e.CurrentVersion != 0 || e.CurrentETag != "" {
		extra = append(extra, fmt.Sprintf("current version %d", e.CurrentVersion))
	}
	for _, kv := range [][2]string{{"current ETag", e.CurrentETag}, {"leader", e.LeaderEndpoint},
		{"coordinating island", e.Home}, {"transaction", e.TxnID}} {
		if kv[1] != "" {
			extra = append(extra, kv[0]+" "+kv[1])
		}
	}
	if len(extra) == 0 {
		return err.Error()
	}
	return err.Error() + " [" + strings.Join(extra, ", ") + "]"
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "raftlockd",
		Short:         "Raft-replicated lock, state and transaction daemon",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServerCmd(), newClientCmd(), newSnapshotCmd(), newClusterCmd(), newTCCmd(), newTxnCmd(), newBenchCmd(), &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(cmd *cobra.Command, _ []string) { fmt.Fprintln(cmd.OutOrStdout(), "raftlockd", buildVersion()) },
	})
	root.AddCommand(newHealthCmd(), newAuthCmd())
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	requireSubcommands(root)
	return root
}

// requireSubcommands makes every command of the tree under cmd that only
// groups others (cmd itself included) print its help when given no
// subcommand and fail, naming the word, when given one it does not have.
// Left to cobra, a group below the root takes any word for an argument,
// prints its help and exits 0.
func requireSubcommands(cmd *cobra.Command) {
	if cmd.HasSubCommands() && !cmd.Runnable() {
		cmd.Args = cobra.ArbitraryArgs
		cmd.RunE = func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return c.Help()
			}
			return unknownCommand(c, args[0])
		}
	}
	for _, sub := range cmd.Commands() {
		requireSubcommands(sub)
	}
}

// unknownCommand is cobra's error for a word that names no subcommand of
// cmd, with its suggestions.
func unknownCommand(cmd *cobra.Command, word string) error {
	msg := fmt.Sprintf("unknown command %q for %q", word, cmd.CommandPath())
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	if s := cmd.SuggestionsFor(word); len(s) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
	}
	return errors.New(msg)
}

// envName is the environment variable that stands in for flag name under prefix.
func envName(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// envAnnotation names, on a flag, the environment variable that stands in
// for it when that is not the one its command's prefix gives.
const envAnnotation = "raftlockd_env"

// envSetAnnotation marks, on a flag, that its value came from its
// environment variable rather than from the command line (bindEnv sets it
// through the flag set, which counts it as changed all the same).
const envSetAnnotation = "raftlockd_env_set"

// fromEnv reports whether the flag name of fs took its value from its
// environment variable.
func fromEnv(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && len(f.Annotations[envSetAnnotation]) > 0
}

// flagEnv is the environment variable of flag f under prefix.
func flagEnv(prefix string, f *pflag.Flag) string {
	if v := f.Annotations[envAnnotation]; len(v) == 1 {
		return v[0]
	}
	return envName(prefix, f.Name)
}

// annotateEnv names, in the help of every flag of fs, the environment
// variable that stands in for it.
func annotateEnv(fs *pflag.FlagSet, prefix string) {
	fs.VisitAll(func(f *pflag.Flag) {
		if strings.Contains(f.Usage, "(env ") {
			return
		}
		if listFlag(f) {
			f.Usage += fmt.Sprintf(" (env %s, a comma-separated list; quote a value holding a comma in \"...\")", flagEnv(prefix, f))
		} else {
			f.Usage += fmt.Sprintf(" (env %s)", flagEnv(prefix, f))
		}
	})
}

// listFlag reports whether f is a repeatable flag whose values its
// variable lists, comma-separated: one whose every occurrence on the
// command line is one value, commas included. (A comma-separated flag,
// such as a string slice, splits its variable itself.)
func listFlag(f *pflag.Flag) bool { return f.Value.Type() == "stringArray" }

// envValues are the values the variable of f stands for: its text, or
// for a repeatable flag the comma-separated values in it, read as CSV (so
// a value holding a comma or a quote is written in double quotes).
func envValues(f *pflag.Flag, v string) ([]string, error) {
	if !listFlag(f) {
		return []string{v}, nil
	}
	r := csv.NewReader(strings.NewReader(v))
	r.TrimLeadingSpace = true // "a, b" lists a and b
	records, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("want a comma-separated list: %w", err)
	}
	var vals []string
	for _, r := range records {
		vals = append(vals, r...)
	}
	return vals, nil
}

// bindEnv documents the environment variable of every flag of cmd (and its
// persistent parents) and, before cmd runs, fills each flag the command
// line left unset from its variable.
func bindEnv(cmd *cobra.Command, prefix string) { bindEnvSkipping(cmd, prefix, nil) }

// aliasChanged reports whether another flag of fs that sets the same
// variable as f (a deprecated name kept as an alias) is set: on the
// command line, or from its own variable before f's is read (flags are
// visited in name order). Either way f's variable must not override it.
func aliasChanged(fs *pflag.FlagSet, f *pflag.Flag) bool {
	target := reflect.ValueOf(f.Value)
	if target.Kind() != reflect.Pointer {
		return false
	}
	set := false
	fs.VisitAll(func(g *pflag.Flag) {
		if g != f && g.Changed {
			if v := reflect.ValueOf(g.Value); v.Type() == target.Type() && v.Pointer() == target.Pointer() {
				set = true
			}
		}
	})
	return set
}

// bindEnvSkipping is bindEnv that leaves alone each variable skip (when
// not nil) reports.
func bindEnvSkipping(cmd *cobra.Command, prefix string, skip func(name string) bool) {
	annotateEnv(cmd.Flags(), prefix)
	annotateEnv(cmd.PersistentFlags(), prefix)
	prev := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		var errs []error
		c.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Changed || aliasChanged(c.Flags(), f) {
				return
			}
			v, ok := os.LookupEnv(flagEnv(prefix, f))
			if !ok || skip != nil && skip(flagEnv(prefix, f)) {
				return
			}
			vals, err := envValues(f, v)
			for _, v := range vals {
				if err == nil {
					err = c.Flags().Set(f.Name, v)
				}
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", flagEnv(prefix, f), err))
				return
			}
			_ = c.Flags().SetAnnotation(f.Name, envSetAnnotation, []string{flagEnv(prefix, f)})
		})
		if err := errors.Join(errs...); err != nil {
			return err
		}
		if prev != nil {
			return prev(c, args)
		}
		return nil
	}
}
