package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

const clientEnv = "RAFTLOCKD_CLIENT_"

// clientOpts are the flags shared by every client command.
type clientOpts struct {
	conn
	namespace string
}

// open connects to the server with the namespace as the default.
func (o *clientOpts) open(cmd *cobra.Command) (*client.Client, context.Context, context.CancelFunc, error) {
	return o.conn.open(cmd, client.WithNamespace(o.namespace))
}

// leaseFlags name a held lease; `acquire` exports them for later commands.
type leaseFlags struct {
	key     string
	lease   string
	txnID   string
	fencing int64
	// queueState names the state sidecar of the delivery the shell holds
	// (RAFTLOCKD_QUEUE_STATE_*, from `client queue dequeue --with-state`).
	queueState bool
	queueNS    string // the sidecar's namespace, with queueState
	otherKey   string // the key of the lease in the environment, when the command names another
	tokenOf    string // the key RAFTLOCKD_CLIENT_FENCING_TOKEN is the token of, when it was not presented
	named      string // the command's key, as messages about otherKey name it
	flags      *pflag.FlagSet
}

// registerQueueState adds --queue-state, for the commands that read and
// change a message's state sidecar like any key.
func (l *leaseFlags) registerQueueState(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&l.queueState, "queue-state", false, "use the state sidecar of the delivery \"client queue dequeue --with-state\" "+
		"exported ("+queueEnv+"STATE_KEY, _STATE_LEASE, _STATE_TXN_ID, _STATE_FENCING_TOKEN) instead of --key, --lease, --txn-id and --fencing-token")
}

// envHeld reports whether the command names another key than the one
// the lease in the environment holds (acquire's RAFTLOCKD_CLIENT_KEY, in
// RAFTLOCKD_CLIENT_NAMESPACE): another key, or the same key in another
// namespace. It names both as messages do: by key, or as namespace/key
// when the namespaces differ.
func (l *leaseFlags) envHeld() (named, held string, other bool) {
	envKey := os.Getenv(clientEnv + "KEY")
	if envKey == "" {
		return l.key, "", false
	}
	ns, envNS := wire.DefaultNamespace, namespaceOf(os.Getenv(clientEnv+"NAMESPACE"))
	if f := l.flags.Lookup("namespace"); f != nil {
		ns = namespaceOf(f.Value.String())
	}
	if ns != envNS {
		return ns + "/" + l.key, envNS + "/" + envKey, true
	}
	return l.key, envKey, l.key != envKey
}

// namespaceOf is the namespace ns names: the default one when empty, in
// lower case (as the server reads it).
func namespaceOf(ns string) string {
	if ns == "" {
		return wire.DefaultNamespace
	}
	return strings.ToLower(ns)
}

// resolve fills the lease from the sidecar variables with --queue-state.
// Without it, a lease that came from the environment (acquire's exports)
// is dropped when --key or --namespace names another key than the one it
// holds there, and so is its fencing token (RAFTLOCKD_CLIENT_FENCING_TOKEN)
// when --lease names the other key's lease: a token is one key's. The
// transaction stays (another key of the shell's transaction is its to
// update and release).
func (l *leaseFlags) resolve() error {
	if !l.queueState {
		envLease := os.Getenv(clientEnv + "LEASE")
		if named, held, other := l.envHeld(); envLease != "" && other {
			l.named = named
			if l.lease == envLease {
				l.otherKey, l.lease, l.fencing = held, "", 0
				if l.txnID == os.Getenv(clientEnv+"TXN_ID") {
					l.txnID = ""
				}
			}
			if fromEnv(l.flags, "fencing-token") {
				l.fencing, l.tokenOf = 0, held
			}
		}
		return nil
	}
	l.key, l.lease, l.txnID = os.Getenv(queueEnv+"STATE_KEY"), os.Getenv(queueEnv+"STATE_LEASE"), os.Getenv(queueEnv+"STATE_TXN_ID")
	l.queueNS = os.Getenv(queueEnv + "NAMESPACE")
	if l.key == "" || l.lease == "" {
		return fmt.Errorf("--queue-state: no state sidecar named: eval the output of `raftlockd client queue dequeue --with-state`, "+
			"which sets %sSTATE_KEY and %sSTATE_LEASE", queueEnv, queueEnv)
	}
	l.fencing = 0
	if v := os.Getenv(queueEnv + "STATE_FENCING_TOKEN"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("%sSTATE_FENCING_TOKEN: %w", queueEnv, err)
		}
		l.fencing = n
	}
	return nil
}

func (l *leaseFlags) register(cmd *cobra.Command, withLease bool) {
	l.flags = cmd.Flags()
	cmd.Flags().StringVar(&l.key, "key", "", "key")
	if withLease {
		cmd.Flags().StringVar(&l.lease, "lease", "", "lease id (from acquire)")
		cmd.Flags().Int64Var(&l.fencing, "fencing-token", 0, "fencing token (from acquire)")
	}
	cmd.Flags().StringVar(&l.txnID, "txn-id", "", "transaction id (from acquire)")
}

// require refuses a command that needs a lease when none is named.
func (l *leaseFlags) require() error {
	if err := l.resolve(); err != nil {
		return err
	}
	if l.otherKey != "" && l.lease == "" {
		return fmt.Errorf("no lease named for key %q: the lease in %sLEASE holds %q; pass --lease", l.named, clientEnv, l.otherKey)
	}
	if l.key == "" || l.lease == "" {
		return fmt.Errorf("no lease named: pass --key and --lease, or eval the output of `raftlockd client acquire`, "+
			"which sets %sKEY and %sLEASE", clientEnv, clientEnv)
	}
	return nil
}

func (l *leaseFlags) ref(ns string) client.LeaseRef {
	return client.LeaseRef{Namespace: l.namespace(ns), Key: l.key, LeaseID: l.lease, TxnID: l.txnID, FencingToken: l.fencing}
}

// namespace is the lease's namespace: ns, or with --queue-state the
// namespace of the delivery (RAFTLOCKD_QUEUE_NAMESPACE) when it is set.
func (l *leaseFlags) namespace(ns string) string {
	if l.queueNS != "" {
		return l.queueNS
	}
	return ns
}

// parseSeconds reads "30s", "1m" or a bare number of seconds and, for a
// wait flag (wait), the words "nowait" (-1: do not wait) and "forever" (0:
// as long as the server allows). A positive duration is rounded up to
// whole seconds, so a lease or a wait is never shorter than asked for, and
// a fraction of a second does not become 0 (which means "the server's
// default/maximum"); a negative one means -1 or less ("do not wait").
func parseSeconds(s string, wait bool) (int64, error) {
	if wait {
		switch s {
		case "nowait":
			return -1, nil
		case "forever":
			return 0, nil
		}
	}
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		return n, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		if wait {
			return 0, fmt.Errorf("%q is neither seconds, a duration, nowait nor forever", s)
		}
		return 0, fmt.Errorf("%q is neither seconds nor a duration such as 30s", s)
	}
	secs := int64(d / time.Second)
	switch {
	case d > 0 && d%time.Second != 0:
		secs++
	case d < 0 && secs == 0:
		secs = -1
	}
	return secs, nil
}

// secondsFlag is a flag of whole seconds, read by parseSeconds: a bad
// value is refused while the flags are parsed, naming the flag (or its
// environment variable).
type secondsFlag struct {
	secs *int64
	text string
	wait bool
}

func (f *secondsFlag) Set(s string) error {
	n, err := parseSeconds(s, f.wait)
	if err != nil {
		return err
	}
	if n < 0 && !f.wait {
		// Only a wait has a meaning for a negative value (nowait).
		return fmt.Errorf("%q must not be negative", s)
	}
	*f.secs, f.text = n, s
	return nil
}

func (f *secondsFlag) String() string { return f.text }
func (f *secondsFlag) Type() string   { return "duration" }

// secondsVar defines a flag of whole seconds, 0 unless given.
func secondsVar(fs *pflag.FlagSet, p *int64, name, usage string) {
	fs.Var(&secondsFlag{secs: p, text: "0"}, name, usage)
}

// waitVar defines a wait flag: whole seconds, nowait or forever, 0 unless
// given.
func waitVar(fs *pflag.FlagSet, p *int64, name, usage string) {
	fs.Var(&secondsFlag{secs: p, text: "0", wait: true}, name, usage)
}

func defaultOwner() string {
	name := "raftlockd"
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s@%s:%d", name, host, os.Getpid())
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// shellQuote quotes s for POSIX shells.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// printExports prints an export line for each name and value, the name
// under prefix.
func printExports(w io.Writer, prefix string, kvs [][2]string) {
	for _, kv := range kvs {
		fmt.Fprintf(w, "export %s%s=%s\n", prefix, kv[0], shellQuote(kv[1]))
	}
}

// printUnset prints the unset line for names under prefix.
func printUnset(w io.Writer, prefix string, names []string) {
	full := make([]string, len(names))
	for i, n := range names {
		full[i] = prefix + n
	}
	fmt.Fprintf(w, "unset %s\n", strings.Join(full, " "))
}

// leaseVars are the variables of acquire's exports that name a lease and
// its transaction. They are unset when the transaction is over, so that
// the next acquire starts a new one; the key, namespace and owner stay.
var leaseVars = []string{"LEASE", "TXN_ID", "FENCING_TOKEN", "EXPIRES_AT", "VERSION"}

// txnOver reports whether err, the answer to a release, an ack or a nack,
// leaves the transaction it ended over for good: it succeeded, or it was
// refused because the transaction is already decided (txn_committed, or
// txn_outcome_mixed: decided, but an island had decided the other way), or
// can only roll back (txn_rolled_back: a lease of it expired).
func txnOver(err error) bool {
	return err == nil || errors.Is(err, errcode.TxnRolledBack) || errors.Is(err, errcode.TxnCommitted) ||
		errors.Is(err, errcode.TxnOutcomeMixed)
}

func newClientCmd() *cobra.Command {
	opts := &clientOpts{}
	cmd := &cobra.Command{Use: "client", Short: "Drive leases and state on a raftlockd server"}
	opts.register(cmd, auth.ClientFile, "")
	pf := cmd.PersistentFlags()
	pf.StringVar(&opts.namespace, "namespace", wire.DefaultNamespace, "namespace")
	annotateEnv(pf, clientEnv)
	for _, sub := range []*cobra.Command{newAcquireCmd(opts), newKeepAliveCmd(opts), newGetCmd(opts), newUpdateCmd(opts),
		newRemoveCmd(opts), newReleaseCmd(opts), newDescribeCmd(opts)} {
		bindEnv(sub, clientEnv)
		cmd.AddCommand(sub)
	}
	cmd.AddCommand(newQueueCmd(opts), newUTXOCmd(opts))
	return cmd
}

func newAcquireCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var owner, idem string
	var ttl, block int64
	var ifNotExists bool
	cmd := &cobra.Command{
		Use:   "acquire",
		Short: "Acquire a lease and print shell exports for it",
		Long: `Acquire a lease on a key (a generated key when none is given) and print
export lines, so that

    eval "$(raftlockd client acquire --key orders/1)"

leaves RAFTLOCKD_CLIENT_KEY, _LEASE, _TXN_ID and _FENCING_TOKEN set for the
commands that follow. With RAFTLOCKD_CLIENT_TXN_ID already set, the new lease
joins that transaction.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			req := wire.AcquireRequest{Namespace: opts.namespace, Key: l.key, Owner: owner, TTLSeconds: ttl,
				BlockSecs: block, IfNotExists: ifNotExists, TxnID: l.txnID}
			if idem == "" {
				idem = defaultIdempotencyKey()
			}
			lease, err := c.AcquireWithKey(ctx, req, idem)
			if err != nil {
				return err
			}
			printExports(cmd.OutOrStdout(), clientEnv, [][2]string{
				{"NAMESPACE", lease.Namespace}, {"KEY", lease.Key}, {"OWNER", lease.Owner}, {"LEASE", lease.LeaseID},
				{"TXN_ID", lease.TxnID}, {"FENCING_TOKEN", strconv.FormatInt(lease.FencingToken, 10)},
				{"EXPIRES_AT", strconv.FormatInt(lease.ExpiresAt, 10)}, {"VERSION", strconv.FormatInt(lease.Version, 10)},
			})
			return nil
		},
	}
	l.register(cmd, false)
	f := cmd.Flags()
	f.StringVar(&owner, "owner", defaultOwner(), "owner recorded on the lease")
	secondsVar(f, &ttl, "ttl", "lease TTL, e.g. 30s (0: server default)")
	waitVar(f, &block, "block", "how long to wait for a held key, e.g. 10s (0 or forever: server maximum, -1 or nowait: do not wait)")
	f.BoolVar(&ifNotExists, "if-not-exists", false, "fail with already_exists when the key has state or a holder")
	f.StringVar(&idem, "idempotency-key", "", "request identity; retries with the same key get the same lease")
	return cmd
}

// defaultIdempotencyKey makes one acquire invocation's retries share an identity.
func defaultIdempotencyKey() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("cli-%s-%d-%d", host, os.Getpid(), time.Now().UnixNano())
}

func newKeepAliveCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var ttl int64
	cmd := &cobra.Command{
		Use:   "keepalive",
		Short: "Extend a held lease",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := l.require(); err != nil {
				return err
			}
			if l.fencing == 0 && l.tokenOf != "" {
				// The server requires the token of a keepalive.
				return fmt.Errorf("no fencing token named for key %q: %sFENCING_TOKEN is the token of %q; pass --fencing-token",
					l.named, clientEnv, l.tokenOf)
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.KeepAlive(ctx, l.ref(opts.namespace), time.Duration(ttl)*time.Second)
			if _, _, other := l.envHeld(); err != nil || l.queueState || other {
				// The sidecar's expiry, or another key's, is not the key
				// lease's of this shell (RAFTLOCKD_CLIENT_EXPIRES_AT):
				// nothing to export.
				return err
			}
			printExports(cmd.OutOrStdout(), clientEnv, [][2]string{{"EXPIRES_AT", strconv.FormatInt(out.ExpiresAt, 10)}})
			return nil
		},
	}
	l.register(cmd, true)
	l.registerQueueState(cmd)
	secondsVar(cmd.Flags(), &ttl, "ttl", "new TTL, e.g. 30s (0: the lease's TTL)")
	return cmd
}

func newGetCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var public, stale bool
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Print a key's JSON state (the holder's view with --lease, the committed one otherwise)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := l.resolve(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			var doc *client.Document
			switch {
			case stale:
				doc, err = c.GetPublicStale(ctx, l.namespace(opts.namespace), l.key)
			case public || l.lease == "":
				doc, err = c.GetPublic(ctx, l.namespace(opts.namespace), l.key)
			default:
				doc, err = c.Get(ctx, l.ref(opts.namespace))
			}
			if err != nil {
				return err
			}
			if doc.Exists {
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", doc.Body)
			}
			return err
		},
	}
	l.register(cmd, true)
	l.registerQueueState(cmd)
	cmd.Flags().BoolVar(&public, "public", false, "read the committed state even when a lease is set")
	cmd.Flags().BoolVar(&stale, "stale", false, "read the committed state from the server's own copy, without asking the leader (may be behind)")
	return cmd
}

// readInput reads the file named by the command's only argument, or stdin
// when there is none or it is "-".
func readInput(cmd *cobra.Command, args []string) ([]byte, error) {
	if len(args) == 1 && args[0] != "-" {
		return os.ReadFile(args[0])
	}
	return io.ReadAll(cmd.InOrStdin())
}

// casFlags are the compare-and-swap conditions of update and remove.
type casFlags struct {
	ifVersion int64
	ifETag    string
}

func (c *casFlags) register(cmd *cobra.Command) {
	cmd.Flags().Int64Var(&c.ifVersion, "if-version", 0, "only if the current version is this")
	cmd.Flags().StringVar(&c.ifETag, "if-etag", "", "only if the current state ETag is this")
}

// conditions are the conditions cmd was given; a version only when set.
func (c *casFlags) conditions(cmd *cobra.Command) client.Conditions {
	cond := client.Conditions{IfETag: c.ifETag}
	if cmd.Flags().Changed("if-version") {
		cond.IfVersion = &c.ifVersion
	}
	return cond
}

func newUpdateCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var cas casFlags
	cmd := &cobra.Command{
		Use:   "update [FILE|-]",
		Short: "Stage new JSON state for a held key, read from FILE or stdin",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := l.require(); err != nil {
				return err
			}
			doc, err := readInput(cmd, args)
			if err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.Update(ctx, l.ref(opts.namespace), doc, cas.conditions(cmd))
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	l.register(cmd, true)
	l.registerQueueState(cmd)
	cas.register(cmd)
	return cmd
}

func newRemoveCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var cas casFlags
	cmd := &cobra.Command{
		Use:   "remove",
		Short: "Stage the removal of a held key's state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := l.require(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.Remove(ctx, l.ref(opts.namespace), cas.conditions(cmd))
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	l.register(cmd, true)
	l.registerQueueState(cmd)
	cas.register(cmd)
	return cmd
}

func newReleaseCmd(opts *clientOpts) *cobra.Command {
	var l leaseFlags
	var rollback bool
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Release a lease: commit its transaction's staged state (or roll it back)",
		Long: `Release a lease. Its transaction's staged writes, on every key the
transaction holds, are committed (or discarded with --rollback) and all its
leases are released. It prints an unset line for the lease variables, so that

    eval "$(raftlockd client release)"

also ends the transaction in the shell and the next acquire starts a new one
(a lease of another transaction than RAFTLOCKD_CLIENT_TXN_ID, released with
--txn-id, leaves the shell's lease and its variables alone).
A release refused because the transaction is over already (txn_rolled_back:
a lease of it expired, so it can only roll back; txn_committed) exits
non-zero with the error on stderr and prints the unset line all the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := l.require(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			_, err = c.Release(ctx, l.ref(opts.namespace), rollback)
			// Only the shell's transaction is over when it was the one
			// named: a lease of another, released by flags, leaves the
			// shell's lease held, and its variables set.
			if shellTxn := os.Getenv(clientEnv + "TXN_ID"); txnOver(err) && (shellTxn == "" || shellTxn == l.txnID) {
				printUnset(cmd.OutOrStdout(), clientEnv, leaseVars)
			}
			return err
		},
	}
	l.register(cmd, true)
	cmd.Flags().BoolVar(&rollback, "rollback", false, "discard the transaction's staged changes")
	return cmd
}

func newDescribeCmd(opts *clientOpts) *cobra.Command {
	var key string
	var stale bool
	cmd := &cobra.Command{
		Use:   "describe",
		Short: "Print a key's lease and state metadata",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			describe := c.Describe
			if stale {
				describe = c.DescribeStale
			}
			out, err := describe(ctx, opts.namespace, key)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVar(&key, "key", "", "key")
	cmd.Flags().BoolVar(&stale, "stale", false, "read from the server's own copy, without asking the leader (may be behind)")
	return cmd
}
