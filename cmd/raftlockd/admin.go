package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// Operator commands: `snapshot save|restore`, `cluster
// members|status|leave|remove-peer`, lockd-style `tc
// leader|list|announce|leave`, `tc rm ...` and `tc trust ...`. They take
// --server, --bundle and --timeout like the client commands, from the same
// RAFTLOCKD_CLIENT_* variables, and present a server bundle by default
// (a TC client bundle for the coordinator's client endpoints).

// adminOpts are the flags of the operator commands.
type adminOpts struct {
	conn
	format string
}

// addAdminFlags registers the connection flags (presenting file by
// default, described as which in the help) and, when withFormat, --format
// on cmd for all its subcommands.
func addAdminFlags(cmd *cobra.Command, o *adminOpts, withFormat bool, file, which string) {
	o.register(cmd, file, which)
	if withFormat {
		addFormatFlag(cmd.PersistentFlags(), &o.format)
	}
	annotateEnv(cmd.PersistentFlags(), clientEnv)
}

func addFormatFlag(fs *pflag.FlagSet, format *string) {
	fs.StringVar(format, "format", "table", "output: table or json")
}

func addSubcommands(parent *cobra.Command, subs ...*cobra.Command) {
	for _, sub := range subs {
		bindEnv(sub, clientEnv)
		parent.AddCommand(sub)
	}
}

// operatorTimeout bounds, by default, the membership commands (cluster,
// tc): a server that accepts connections but never answers (a paused
// process) does not hold an operator's shell for good.
const operatorTimeout = time.Minute

// limitByDefault makes d the default --timeout of cmd and its subcommands.
func (o *adminOpts) limitByDefault(cmd *cobra.Command, d time.Duration) {
	o.timeout = d
	f := cmd.PersistentFlags().Lookup("timeout")
	f.DefValue = d.String()
}

// output prints v as JSON, or with table when --format is table.
func (o *adminOpts) output(w io.Writer, v any, table func(w *tabwriter.Writer)) error {
	return render(w, o.format, v, table)
}

// render prints v as JSON when format is json, or with table.
func render(w io.Writer, format string, v any, table func(w *tabwriter.Writer)) error {
	if err := checkFormat(format); err != nil {
		return err
	}
	if format == "json" {
		return printJSON(w, v)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}

// checkFormat refuses a --format render cannot print.
func checkFormat(format string) error {
	switch format {
	case "json", "table", "":
		return nil
	}
	return fmt.Errorf("--format %q: want table or json", format)
}

func newSnapshotCmd() *cobra.Command {
	o := &adminOpts{}
	cmd := &cobra.Command{Use: "snapshot", Short: "Save the cluster's state to a file, or restore it from one"}
	addAdminFlags(cmd, o, false, auth.ServerFile, "")
	addSubcommands(cmd, &cobra.Command{
		Use:   "save FILE",
		Short: "Save a snapshot of the cluster's state (every acknowledged write) to FILE",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ctx, cancel, err := o.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			// An interrupt ends the transfer rather than the process, so
			// that the partial temporary file is removed; a second one
			// ends the process.
			sctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				<-sctx.Done()
				stop()
			}()
			p := newProgress(cmd.ErrOrStderr(), "received")
			h := sha256.New()
			n, err := writeFileAtomic(args[0], func(w io.Writer) (int64, error) {
				return c.SaveSnapshot(sctx, io.MultiWriter(w, h), p.update)
			})
			if err != nil && sctx.Err() != nil && ctx.Err() == nil {
				return fmt.Errorf("interrupted; %s was not written: %w", args[0], err)
			}
			if err != nil {
				return err
			}
			sum := hex.EncodeToString(h.Sum(nil))
			if _, err := writeFileAtomic(checksumFile(args[0]), func(w io.Writer) (int64, error) {
				n, err := fmt.Fprintf(w, "%s  %s\n", sum, filepath.Base(args[0]))
				return int64(n), err
			}); err != nil {
				return fmt.Errorf("saved snapshot to %s, but not its checksum: %w", args[0], err)
			}
			p.finish(fmt.Sprintf("saved snapshot to %s (SHA-256 %s, in %s)", args[0], sum, checksumFile(args[0])), n)
			return nil
		},
	}, &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the whole cluster's state with the snapshot in FILE",
		Long: `Replace the whole cluster's state with a snapshot saved by 'snapshot save'.
The leader restores it (any other node forwards the upload to the leader, so
--server may name any member) and installs it on every member. Documents, versions, leases and transactions
return to the moment of the snapshot; fencing tokens do not go back: every
key's next token is above any token issued before the restore.

'snapshot save' writes FILE's SHA-256 next to it, in FILE.sha256 (the
format of sha256sum). When that file is there, a FILE that does not match it
is refused before anything is sent; the upload carries the checksum, so the
cluster restores exactly FILE's bytes or nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			st, err := f.Stat()
			if err != nil {
				return err
			}
			sum, err := verifyChecksum(cmd.ErrOrStderr(), args[0], f)
			if err != nil {
				return err
			}
			c, ctx, cancel, err := o.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			p := newProgress(cmd.ErrOrStderr(), "sent")
			var sent atomic.Int64
			if sum == "" {
				if sum, err = client.SHA256Of(f); err != nil {
					return err
				}
			}
			out, err := c.RestoreSnapshotSHA256(ctx, f, st.Size(), sum, func(done, total int64) {
				sent.Store(max(sent.Load(), done))
				p.update(done, total)
			})
			var answered *client.Error
			if err != nil && sent.Load() > 0 && !errors.As(err, &answered) {
				// The server had the file, or part of it, and said nothing.
				return fmt.Errorf("%w\nthe connection ended after %s of %s were sent, before any answer: the "+
					"restore may or may not have happened; run it again to be sure (a restore of the same file "+
					"gives the same state)", err, humanBytes(sent.Load()), humanBytes(st.Size()))
			}
			if err != nil {
				return err
			}
			p.finish(fmt.Sprintf("restored snapshot from %s (applied index %d)", args[0], out.Index), out.Bytes)
			return nil
		},
	})
	return cmd
}

// checksumFile names the file that holds the SHA-256 of the snapshot at
// path.
func checksumFile(path string) string { return path + ".sha256" }

// verifyChecksum checks the snapshot f (at path) against the checksum file
// next to it, when there is one, says on w what it did and returns the
// verified SHA-256 ("" without a checksum file).
func verifyChecksum(w io.Writer, path string, f io.ReadSeeker) (string, error) {
	raw, err := os.ReadFile(checksumFile(path))
	if errors.Is(err, fs.ErrNotExist) {
		fmt.Fprintf(w, "no %s: the snapshot's integrity is not checked\n", checksumFile(path))
		return "", nil
	}
	if err != nil {
		return "", err
	}
	fields := strings.Fields(string(raw))
	if len(fields) == 0 || len(fields[0]) != sha256.Size*2 {
		return "", fmt.Errorf("%s does not hold a SHA-256 (want the format of sha256sum)", checksumFile(path))
	}
	want := strings.ToLower(fields[0])
	got, err := client.SHA256Of(f)
	if err != nil {
		return "", err
	}
	if got != want {
		return "", fmt.Errorf("%s is damaged: its SHA-256 is %s, but %s says %s; nothing was restored", path, got,
			checksumFile(path), want)
	}
	fmt.Fprintf(w, "%s matches %s\n", path, checksumFile(path))
	return got, nil
}

// writeFileAtomic writes path through a temporary file in the same
// directory, renamed into place once complete and synced.
func writeFileAtomic(path string, write func(io.Writer) (int64, error)) (n int64, err error) {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		// Said before anything is written (a snapshot is not fetched only
		// to be refused).
		return 0, fmt.Errorf("%s is a directory: name the file to write", path)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if n, err = write(tmp); err != nil {
		return n, err
	}
	if err = tmp.Sync(); err != nil {
		return n, err
	}
	if err = tmp.Close(); err != nil {
		return n, err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return n, err
	}
	if d, derr := os.Open(filepath.Dir(path)); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return n, nil
}

// progress prints a transfer's progress on stderr, at most twice a second
// and only once it has run for half a second (small files stay quiet),
// then one summary line.
type progress struct {
	mu    sync.Mutex
	w     io.Writer
	verb  string
	now   func() time.Time
	every time.Duration
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, verb string) *progress {
	p := &progress{w: w, verb: verb, now: time.Now, every: 500 * time.Millisecond}
	p.start = p.now()
	p.last = p.start
	return p
}

func (p *progress) update(done, total int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := fmt.Sprintf("%s %s", p.verb, humanBytes(done))
	if total > 0 {
		line += fmt.Sprintf(" of %s (%d%%)", humanBytes(total), done*100/total)
	}
	fmt.Fprintf(p.w, "%s at %s/s\n", line, humanBytes(rate(done, now.Sub(p.start))))
}

func (p *progress) finish(what string, n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	took := p.now().Sub(p.start)
	fmt.Fprintf(p.w, "%s: %s in %s (%s/s)\n", what, humanBytes(n), took.Round(time.Millisecond), humanBytes(rate(n, took)))
}

func rate(n int64, d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(float64(n) / d.Seconds())
}

// humanBytes renders n bytes with a binary unit: 512 B, 1.5 KiB, 3.2 GiB.
func humanBytes(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " B"
	}
	v, unit := float64(n)/1024, 0
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	for v >= 1024 && unit < len(units)-1 {
		v /= 1024
		unit++
	}
	return fmt.Sprintf("%.1f %s", v, units[unit])
}

// runAdmin returns a RunE that calls the server with call and prints its
// answer (as JSON or through table).
func runAdmin[T any](o *adminOpts, call func(context.Context, *client.Client, []string) (T, error),
	table func(io.Writer, T)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		// Before anything is sent: a command that changes something must
		// not do so and then fail to say what it did.
		if err := checkFormat(o.format); err != nil {
			return err
		}
		c, ctx, cancel, err := o.open(cmd)
		defer cancel()
		if err != nil {
			return err
		}
		out, err := call(ctx, c, args)
		if err != nil {
			return err
		}
		return o.output(cmd.OutOrStdout(), out, func(w *tabwriter.Writer) { table(w, out) })
	}
}

func newClusterCmd() *cobra.Command {
	o := &adminOpts{}
	cmd := &cobra.Command{Use: "cluster", Short: "Inspect and change the cluster's membership"}
	addAdminFlags(cmd, o, true, auth.ServerFile, "")
	o.limitByDefault(cmd, operatorTimeout)
	addSubcommands(cmd, &cobra.Command{
		Use:   "members",
		Short: "List the servers with their suffrage, gossip status and Raft progress",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.ClusterMembersResponse, error) {
			return c.ClusterMembers(ctx)
		}, membersTable),
	}, &cobra.Command{
		Use:   "status",
		Short: "Show the server's view of the cluster: its Raft state and the leader",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.ClusterStatusResponse, error) {
			return c.ClusterStatus(ctx)
		}, statusTable),
	}, &cobra.Command{
		Use:   "leave",
		Short: "Make the server (the first of --server) leave the cluster gracefully; it shuts down afterwards",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.LeaveResponse, error) {
			return c.ClusterLeave(ctx)
		}, func(w io.Writer, out *wire.LeaveResponse) { fmt.Fprintf(w, "node %s left the cluster\n", out.NodeID) }),
	}, &cobra.Command{
		Use:   "remove-peer ID",
		Short: "Take server ID out of the Raft configuration (for servers that are gone)",
		Args:  cobra.ExactArgs(1),
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, args []string) (*wire.RemovePeerResponse, error) {
			return c.RemovePeer(ctx, args[0])
		}, removedTable),
	})
	return cmd
}

// removedTable tells what became of a removed server, and what a running
// one does next.
func removedTable(w io.Writer, out *wire.RemovePeerResponse) {
	fmt.Fprintf(w, "removed %s\n", out.ID)
	if out.Running {
		fmt.Fprintf(w, "%s is still running: it serves no requests (503 no_leader) and takes no part in the cluster until it is\n"+
			"restarted, and rejoins as a new member then. To retire it, stop it and delete its data directory;\n"+
			"`raftlockd cluster leave` on a running server retires it gracefully.\n", out.ID)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func membersTable(w io.Writer, m *wire.ClusterMembersResponse) {
	fmt.Fprintln(w, "ID\tSUFFRAGE\tGOSSIP\tSTATE\tTERM\tAPPLIED\tCOMMIT\tLAST CONTACT\tRAFT ADDRESS\tAPI\tERROR")
	for _, s := range m.Members {
		state, term, applied, commit, contact := "-", "-", "-", "-", "-"
		if r := s.Raft; r != nil {
			state, term = r.State, strconv.FormatUint(r.Term, 10)
			if r.Joining {
				state += " (joining)"
			}
			applied, commit = strconv.FormatUint(r.AppliedIndex, 10), strconv.FormatUint(r.CommitIndex, 10)
			contact = lastContact(r.State, r.LastContactMs)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, s.Suffrage, s.GossipStatus, state, term,
			applied, commit, contact, dash(s.RaftAddr), dash(s.APIEndpoint), dash(s.Error))
	}
}

// elections says whether a server takes part in elections.
func elections(joining bool) string {
	if joining {
		return "not yet: catching up after joining"
	}
	return "takes part"
}

// lastContact shows how long ago a server last heard from its leader.
func lastContact(state string, ms int64) string {
	switch {
	case state == "Leader":
		return "-"
	case ms < 0:
		return "never"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

func statusTable(w io.Writer, st *wire.ClusterStatusResponse) {
	leader := dash(st.LeaderID)
	if st.LeaderEndpoint != "" {
		leader += " (" + st.LeaderEndpoint + ")"
	}
	contact := lastContact(st.State, st.LastContactMs)
	for _, kv := range [][2]string{
		{"node", st.NodeID}, {"raft address", st.RaftAddr}, {"state", st.State}, {"leader", leader},
		{"term", strconv.FormatUint(st.Term, 10)}, {"last index", strconv.FormatUint(st.LastIndex, 10)},
		{"commit index", strconv.FormatUint(st.CommitIndex, 10)}, {"applied index", strconv.FormatUint(st.AppliedIndex, 10)},
		{"last contact", contact}, {"backend hash", dash(st.BackendHash)}, {"elections", elections(st.Joining)},
	} {
		fmt.Fprintf(w, "%s\t%s\n", kv[0], kv[1])
	}
}

func newTCCmd() *cobra.Command {
	o := &adminOpts{}
	var self string
	cmd := &cobra.Command{Use: "tc", Short: "lockd-style transaction coordinator membership (leader, list, announce, leave), " +
		"RM registry (rm) and trusted CAs (trust)"}
	addAdminFlags(cmd, o, true, auth.TCClientFile, auth.TCClientFile+" (leader, list, rm list) or "+auth.ServerFile+" (the others)")
	o.limitByDefault(cmd, operatorTimeout)
	endpoints := func(w io.Writer, list []string) {
		for _, e := range list {
			fmt.Fprintln(w, e)
		}
	}
	announce := &cobra.Command{
		Use:   "announce --self URL",
		Short: "Check that URL is a member's endpoint and print the membership list",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TCClusterAnnounceResponse, error) {
			if self == "" {
				return nil, fmt.Errorf("--self is required")
			}
			return c.TCAnnounce(ctx, self)
		}, func(w io.Writer, out *wire.TCClusterAnnounceResponse) {
			endpoints(w, out.Endpoints)
			fmt.Fprintf(w, "membership of %s expires at %s unless it stays alive\n", self,
				time.Unix(out.ExpiresAt, 0).UTC().Format(time.RFC3339))
		}),
	}
	announce.Flags().StringVar(&self, "self", "", "the member's API endpoint")
	leave := &cobra.Command{
		Use:   "leave [--self URL]",
		Short: "Make the member serving URL (default: the server, the first of --server) leave the cluster",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TCClusterLeaveResponse, error) {
			return c.TCLeave(ctx, self)
		}, func(w io.Writer, out *wire.TCClusterLeaveResponse) { endpoints(w, out.Endpoints) }),
	}
	leave.Flags().StringVar(&self, "self", "", "API endpoint of the member that leaves (default: the server, the first of --server)")
	addSubcommands(cmd, &cobra.Command{
		Use:   "leader",
		Short: "Show the leader, its term and how long its leadership is known to last",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TCLeaderResponse, error) {
			return c.TCLeader(ctx)
		}, func(w io.Writer, out *wire.TCLeaderResponse) {
			fmt.Fprintf(w, "leader\t%s\nendpoint\t%s\nterm\t%d\nexpires\t%s\n", out.LeaderID, out.LeaderEndpoint, out.Term,
				time.Unix(out.ExpiresAt, 0).UTC().Format(time.RFC3339))
		}),
	}, &cobra.Command{
		Use:   "list",
		Short: "List the API endpoints of the cluster's live members",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TCClusterListResponse, error) {
			return c.TCList(ctx)
		}, func(w io.Writer, out *wire.TCClusterListResponse) { endpoints(w, out.Endpoints) }),
	}, announce, leave)
	useBundle(auth.ServerFile, announce, leave)
	cmd.AddCommand(newRMCmd(o), newTrustCmd(o))
	return cmd
}
