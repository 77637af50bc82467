package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raftlockd/raftlockd/internal/testutil"
)

func TestMain(m *testing.M) {
	var err error
	if dataHome, err = os.MkdirTemp("", "raftlockd-cli-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testutil.RemoveBinary()
	os.RemoveAll(dataHome)
	os.Exit(code)
}

// TestGroupsRefuseUnknownSubcommands walks the whole command tree: every
// command that groups others prints its help and exits 0 when given no
// subcommand, and fails with cobra's "unknown command" error on stderr
// when given a word that names none of its subcommands.
func TestGroupsRefuseUnknownSubcommands(t *testing.T) {
	t.Parallel()
	var groups [][]string
	walkCommands(func(c *cobra.Command, path []string) {
		if c.HasSubCommands() {
			groups = append(groups, path)
		}
	})
	for _, want := range []string{"", "client", "client queue", "tc rm", "auth new", "completion"} {
		if !slices.ContainsFunc(groups, func(g []string) bool { return strings.Join(g, " ") == want }) {
			t.Fatalf("the walk found the groups %q, not %q", groups, want)
		}
	}
	for _, g := range groups {
		path := strings.Join(append([]string{"raftlockd"}, g...), " ")
		res := cli(t, nil, "", append(slices.Clone(g), "bogus")...)
		if want := fmt.Sprintf("raftlockd: unknown command %q for %q", "bogus", path); res.code != 1 ||
			!strings.Contains(res.stderr, want) || res.stdout != "" {
			t.Errorf("%s bogus: exit %d, stdout %q, stderr %q; want exit 1 and %s on stderr", path, res.code, res.stdout, res.stderr, want)
		}
		res = cli(t, nil, "", g...)
		if res.code != 0 || !strings.Contains(res.stdout, "Available Commands:") || res.stderr != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want its help and exit 0", path, res.code, res.stdout, res.stderr)
		}
	}
	// A misspelt subcommand gets cobra's suggestion, at any depth.
	if res := cli(t, nil, "", "client", "queu"); res.code != 1 || !strings.Contains(res.stderr, "Did you mean this?\n\tqueue") {
		t.Errorf("client queu: exit %d, stderr %q; want a suggestion of queue", res.code, res.stderr)
	}
}

// TestHelpShowsOneDefaultPerFlag: no flag's help names its default twice
// (once in its text and once as pflag adds it), in any command's help.
func TestHelpShowsOneDefaultPerFlag(t *testing.T) {
	t.Parallel()
	var paths [][]string
	walkCommands(func(_ *cobra.Command, path []string) { paths = append(paths, path) })
	for _, p := range paths {
		help := mustCLI(t, nil, "", append(slices.Clone(p), "--help")...)
		for _, line := range strings.Split(help, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "-") && strings.Count(line, "(default") > 1 {
				t.Errorf("raftlockd %s --help names a default twice: %s", strings.Join(p, " "), strings.TrimSpace(line))
			}
		}
	}
}

// walkCommands calls fn with every command of the tree and its path below
// the root (nil for the root itself).
func walkCommands(fn func(c *cobra.Command, path []string)) {
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		fn(c, path)
		for _, sub := range c.Commands() {
			walk(sub, append(slices.Clone(path), sub.Name()))
		}
	}
	walk(newRoot(), nil)
}

// Every flag is also an environment variable, named in its help, except
// those of the commands that only work on files (auth new, extend and
// inspect), which read none, as the README says.
func TestEveryFlagNamesItsVariable(t *testing.T) {
	t.Parallel()
	offline := func(path string) bool {
		return strings.HasPrefix(path, "auth new") || path == "auth extend" || path == "auth inspect"
	}
	checked := 0
	walkCommands(func(c *cobra.Command, p []string) {
		path := strings.Join(p, " ")
		if !c.Runnable() || c.HasSubCommands() || path == "help" || path == "version" || strings.HasPrefix(path, "completion") {
			return
		}
		check := func(f *pflag.Flag) {
			if f.Name == "help" {
				return
			}
			checked++
			switch named := strings.Contains(f.Usage, "(env RAFTLOCKD_"); {
			case offline(path) && named:
				t.Errorf("raftlockd %s --%s names a variable: %s", path, f.Name, f.Usage)
			case !offline(path) && !named:
				t.Errorf("raftlockd %s --%s names no variable: %s", path, f.Name, f.Usage)
			}
		}
		c.LocalFlags().VisitAll(check)
		c.InheritedFlags().VisitAll(check)
	})
	if checked < 100 {
		t.Fatalf("only %d flags checked", checked)
	}
}

// In a shell holding a delivery `client queue dequeue` exported, the
// server leaves alone the delivery's variables that are also its own
// (RAFTLOCKD_QUEUE_MAX_ATTEMPTS, the message's, is also
// --queue-max-attempts's); without one it reads them. A misspelt
// RAFTLOCKD_QUEUE_ variable is warned about like any other.
func TestTheServerLeavesADeliverysVariablesAlone(t *testing.T) {
	maxAttempts := func() string {
		t.Helper()
		cmd := newServerCmd()
		if err := cmd.PreRunE(cmd, nil); err != nil {
			t.Fatal(err)
		}
		return cmd.Flags().Lookup("queue-max-attempts").Value.String()
	}
	def := newServerCmd().Flags().Lookup("queue-max-attempts").DefValue
	t.Setenv(queueEnv+"MAX_ATTEMPTS", "2")
	if got := maxAttempts(); got != "2" {
		t.Fatalf("--queue-max-attempts from %sMAX_ATTEMPTS: %s, want 2", queueEnv, got)
	}
	t.Setenv(queueEnv+"MESSAGE_ID", "m1")
	if got := maxAttempts(); got != def {
		t.Fatalf("--queue-max-attempts in a shell holding a delivery: %s, want the default %s", got, def)
	}

	t.Setenv(queueEnv+"VISIBILTY", "5s")
	fs := newServerCmd().Flags()
	unknown := unknownEnv(fs, serverEnv, deliveryEnv(), clientEnv, healthEnv, benchEnv)
	if !slices.Contains(unknown, queueEnv+"VISIBILTY") || slices.Contains(unknown, queueEnv+"MESSAGE_ID") ||
		slices.Contains(unknown, queueEnv+"MAX_ATTEMPTS") {
		t.Fatalf("unknown variables %v: want %sVISIBILTY and no variable of the delivery", unknown, queueEnv)
	}
}
