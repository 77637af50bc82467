package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/wire"
)

// `raftlockd txn prepare|commit|rollback|replay|status`: the coordinator's
// decisions on transactions that may span islands, and `raftlockd tc rm
// register|unregister|list`: the registry of islands' RM endpoints.

// parseParticipant reads ns:key@backend_hash; the namespace and the
// backend hash may be left out (default namespace, the serving island).
func parseParticipant(s string) (wire.TxnParticipant, error) {
	var p wire.TxnParticipant
	rest := s
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		p.BackendHash, rest = rest[i+1:], rest[:i]
	}
	if i := strings.Index(rest, ":"); i >= 0 {
		p.Namespace, rest = rest[:i], rest[i+1:]
	}
	p.Key = rest
	if p.Key == "" {
		return p, fmt.Errorf("participant %q: want [namespace:]key[@backend_hash]", s)
	}
	return p, nil
}

func newTxnCmd() *cobra.Command {
	o := &adminOpts{}
	var (
		txnID, owner string
		parts        []string
		expires      time.Duration
	)
	cmd := &cobra.Command{
		Use:   "txn",
		Short: "Decide transactions with the coordinator: prepare, commit, rollback, replay, status",
		Long: `Decide transactions with the island's transaction coordinator (any node; it
forwards to the leader). Participants are given as [namespace:]key[@backend_hash];
a participant without a backend hash belongs to the island of --server.

  prepare   record a pending decision: lock this island's participants and
            prepare every other island's; a participant held by another
            transaction fails the transaction for good (LOCKED:<holder>)
  commit    prepare what is not prepared, record commit, apply it everywhere
  rollback  record rollback and apply it everywhere
  replay    apply the recorded decision again where it is missing
  status    show this island's record of the transaction`,
	}
	cmd.PersistentFlags().StringVar(&txnID, "txn-id", "", "transaction id (an xid; required)")
	addAdminFlags(cmd, o, true, auth.TCClientFile, "")
	// needTxnID refuses a command without a transaction id before anything
	// is sent, rather than have the server refuse "" as no xid.
	needTxnID := func() error {
		if txnID == "" {
			return fmt.Errorf("--txn-id is required (or %sTXN_ID, which acquire exports)", clientEnv)
		}
		return nil
	}
	decide := func(state string) func(ctx context.Context, c *client.Client, _ []string) (*wire.TxnDecisionResponse, error) {
		return func(ctx context.Context, c *client.Client, _ []string) (*wire.TxnDecisionResponse, error) {
			if err := needTxnID(); err != nil {
				return nil, err
			}
			if expires < 0 {
				return nil, fmt.Errorf("--expires %s: want a positive duration", expires)
			}
			req := wire.TxnDecisionRequest{TxnID: txnID, State: state, Owner: owner}
			for _, s := range parts {
				p, err := parseParticipant(s)
				if err != nil {
					return nil, err
				}
				req.Participants = append(req.Participants, p)
			}
			if expires > 0 {
				req.ExpiresAtUnix = time.Now().Add(expires).Unix()
			}
			return c.TxnDecide(ctx, req)
		}
	}
	show := func(w io.Writer, out *wire.TxnDecisionResponse) {
		fmt.Fprintf(w, "txn\t%s\nstate\t%s\ntc_term\t%d\n", out.TxnID, out.State, out.TCTerm)
	}
	var subs []*cobra.Command
	for _, s := range []struct{ use, state, short string }{
		{"prepare", wire.TxnStatePending, "Record a pending decision and prepare every participant"},
		{"commit", wire.TxnStateCommit, "Commit the transaction on every island"},
		{"rollback", wire.TxnStateRollback, "Roll the transaction back on every island"},
	} {
		sub := &cobra.Command{Use: s.use + " --txn-id X [--participant ns:key@backend_hash ...]", Short: s.short,
			Args: cobra.NoArgs, RunE: runAdmin(o, decide(s.state), show)}
		sub.Flags().StringArrayVar(&parts, "participant", nil, "participant as [namespace:]key[@backend_hash] (repeatable)")
		sub.Flags().StringVar(&owner, "owner", "", "owner holding the keys a prepare locks; keys it holds already are no conflict")
		if s.state == wire.TxnStatePending {
			sub.Flags().DurationVar(&expires, "expires", 0, "roll the transaction back unless decided within this long (default: the server's --tc-pending-ttl; at most its --max-ttl)")
		}
		subs = append(subs, sub)
	}
	subs = append(subs, &cobra.Command{
		Use:   "replay --txn-id X",
		Short: "Apply the recorded decision again wherever it is missing",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TxnReplayResponse, error) {
			if err := needTxnID(); err != nil {
				return nil, err
			}
			return c.TxnReplay(ctx, txnID)
		}, func(w io.Writer, out *wire.TxnReplayResponse) {
			fmt.Fprintf(w, "txn\t%s\nstate\t%s\ntc_term\t%d\n", out.TxnID, out.State, out.TCTerm)
		}),
	}, &cobra.Command{
		Use:   "status --txn-id X",
		Short: "Show the island's record of the transaction",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TxnStatusResponse, error) {
			if err := needTxnID(); err != nil {
				return nil, err
			}
			return c.TxnStatus(ctx, txnID)
		}, txnStatusTable),
	})
	addSubcommands(cmd, subs...)
	return cmd
}

func txnStatusTable(w io.Writer, out *wire.TxnStatusResponse) {
	fmt.Fprintf(w, "txn\t%s\nstate\t%s\n", out.TxnID, out.State)
	if out.Reason != "" {
		fmt.Fprintf(w, "reason\t%s\n", out.Reason)
	}
	if out.Detail != "" {
		fmt.Fprintf(w, "detail\t%s\n", out.Detail)
	}
	fmt.Fprintf(w, "island\t%s\n", out.BackendHash)
	if out.TCBackendHash != "" {
		fmt.Fprintf(w, "coordinator\t%s\n", out.TCBackendHash)
	}
	fmt.Fprintf(w, "tc_term\t%d\n", out.TCTerm)
	if out.ExpiresAtUnix != 0 {
		fmt.Fprintf(w, "expires\t%s\n", time.Unix(out.ExpiresAtUnix, 0).UTC().Format(time.RFC3339))
	}
	for _, p := range out.Participants {
		fmt.Fprintf(w, "participant\t%s:%s@%s\n", p.Namespace, p.Key, p.BackendHash)
	}
	if len(out.Prepared) > 0 {
		fmt.Fprintf(w, "prepared\t%s\n", strings.Join(out.Prepared, ","))
	}
	if len(out.Acked) > 0 {
		fmt.Fprintf(w, "applied\t%s\n", strings.Join(out.Acked, ","))
	}
	if len(out.Refused) > 0 {
		fmt.Fprintf(w, "refused\t%s\n", strings.Join(out.Refused, ","))
	}
}

// newRMCmd is `raftlockd tc rm register|unregister|list`.
func newRMCmd(o *adminOpts) *cobra.Command {
	var backend, endpoint string
	cmd := &cobra.Command{Use: "rm", Short: "The registry of islands' resource manager endpoints"}
	reg := func(remove bool) func(ctx context.Context, c *client.Client, _ []string) (*wire.TCRMRegisterResponse, error) {
		return func(ctx context.Context, c *client.Client, _ []string) (*wire.TCRMRegisterResponse, error) {
			if backend == "" || endpoint == "" {
				return nil, fmt.Errorf("--backend-hash and --endpoint are required")
			}
			return c.RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: backend, Endpoint: endpoint}, remove)
		}
	}
	entry := func(w io.Writer, out *wire.TCRMRegisterResponse) {
		fmt.Fprintf(w, "%s\t%s\n", out.BackendHash, strings.Join(out.Endpoints, ","))
	}
	register := &cobra.Command{Use: "register --backend-hash H --endpoint URL", Short: "Register an island's RM endpoint",
		Args: cobra.NoArgs, RunE: runAdmin(o, reg(false), entry)}
	unregister := &cobra.Command{Use: "unregister --backend-hash H --endpoint URL", Short: "Remove an island's RM endpoint",
		Args: cobra.NoArgs, RunE: runAdmin(o, reg(true), entry)}
	for _, c := range []*cobra.Command{register, unregister} {
		c.Flags().StringVar(&backend, "backend-hash", "", "the island's backend hash")
		c.Flags().StringVar(&endpoint, "endpoint", "", "an API endpoint of the island")
	}
	useBundle(auth.ServerFile, register, unregister)
	addSubcommands(cmd, register, unregister, &cobra.Command{
		Use:   "list",
		Short: "List the islands and their RM endpoints",
		Args:  cobra.NoArgs,
		RunE: runAdmin(o, func(ctx context.Context, c *client.Client, _ []string) (*wire.TCRMListResponse, error) {
			return c.RMList(ctx)
		}, func(w io.Writer, out *wire.TCRMListResponse) {
			for _, b := range out.Backends {
				fmt.Fprintf(w, "%s\t%s\n", b.BackendHash, strings.Join(b.Endpoints, ","))
			}
		}),
	})
	return cmd
}
