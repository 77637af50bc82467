package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// `raftlockd client utxo ...`: the UTXO endpoints, one command each. A
// command reads its request, the endpoint's JSON body, from --file or
// stdin and prints the answer as JSON.

func newUTXOCmd(opts *clientOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "utxo",
		Short: "Create, spend, freeze and read UTXO records",
		Long: `Create, spend, freeze and read UTXO records. Every command but get reads its
request, the JSON body of the endpoint, from --file or from stdin (the
default, or --file -) and prints the answer as JSON. Transaction ids and
hashes are 64 lowercase hex digits. For example:

    echo '{"txid":"<txid>","outputs":[{"vout":0,"utxo_hash":"<hash>","satoshis":1000}]}' |
      raftlockd client utxo create
    echo '{"spends":[{"txid":"<txid>","vout":0,"utxo_hash":"<hash>","spending_txid":"<child>","vin":0}]}' |
      raftlockd client utxo spend
    raftlockd client utxo get --txid <txid>

A rejected request fails with its error code; when items of a batch failed
(utxo_spend_failed, utxo_outpoint_failed) every failed item is listed with
its index in the request and its reason (SPENT names the spender).`,
	}
	for _, sub := range []*cobra.Command{
		utxoCmd(opts, "create", "Record a transaction and its outputs", (*client.Client).UTXOCreate),
		utxoCmd(opts, "spend", "Spend outputs, all or none", (*client.Client).UTXOSpend),
		utxoCmd(opts, "unspend", "Take the spends of outputs back", (*client.Client).UTXOUnspend),
		utxoCmd(opts, "freeze", "Freeze outputs", (*client.Client).UTXOFreeze),
		utxoCmd(opts, "unfreeze", "Unfreeze outputs", (*client.Client).UTXOUnfreeze),
		utxoCmd(opts, "reassign", "Give a frozen output a new hash", (*client.Client).UTXOReassign),
		utxoCmd(opts, "conflicting", "Set or clear transactions' conflicting flag", (*client.Client).UTXOSetConflicting),
		utxoCmd(opts, "locked", "Set or clear transactions' locked flag", (*client.Client).UTXOSetLocked),
		utxoCmd(opts, "preserve", "Keep transactions until a block height", (*client.Client).UTXOPreserve),
		utxoCmd(opts, "mined", "Place transactions in a block, or take them out", (*client.Client).UTXOSetMined),
		utxoCmd(opts, "longest-chain", "Say whether transactions' blocks are on the longest chain",
			(*client.Client).UTXOSetLongestChain),
		utxoCmd(opts, "height", "Set the chain height", (*client.Client).UTXOSetHeight),
		newUTXOGetCmd(opts),
		newUTXOBlockCmd(opts),
		utxoFlagCmd(opts, "status", "Print the UTXO status: chain height, last block, pruning and timings",
			func(cmd *cobra.Command) func(*client.Client, context.Context) (any, error) {
				stale := cmd.Flags().Bool("stale", false, "read from the server's own copy, without asking the leader (may be behind)")
				return func(c *client.Client, ctx context.Context) (any, error) { return c.UTXOStatus(ctx, *stale) }
			}),
		utxoFlagCmd(opts, "prune", "Run one prune pass now and print what it did",
			func(*cobra.Command) func(*client.Client, context.Context) (any, error) {
				return func(c *client.Client, ctx context.Context) (any, error) { return c.UTXOPrune(ctx) }
			}),
	} {
		bindEnv(sub, clientEnv)
		cmd.AddCommand(sub)
	}
	return cmd
}

// utxoCmd is a command that sends the request read from --file or stdin
// through call and prints the answer.
func utxoCmd[Req, Resp any](opts *clientOpts, use, short string,
	call func(*client.Client, context.Context, Req) (*Resp, error)) *cobra.Command {
	var file string
	cmd := &cobra.Command{
		Use:   use + " [FILE|-]",
		Short: short,
		Long: short + " (the JSON request read from FILE, --file or stdin).\n\nThe request is a JSON object with the fields\n\n" +
			wrap(jsonFields(reflect.TypeFor[Req]()), "    ", 76),
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if cmd.Flags().Changed("file") && !fromEnv(cmd.Flags(), "file") && args[0] != file {
					return fmt.Errorf("the request is read from %s or from --file %s, not both", args[0], file)
				}
				file = args[0]
			}
			var req Req
			if err := readRequest(cmd, file, &req); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := call(c, ctx, req)
			if err != nil {
				return withItems(err)
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVar(&file, "file", "-", "read the JSON request from this file (-: stdin)")
	return cmd
}

// jsonFields lists the JSON fields of struct type t, with the fields of
// the objects (or lists of objects) they hold in braces.
func jsonFields(t reflect.Type) string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		inner := f.Type
		for inner.Kind() == reflect.Pointer || inner.Kind() == reflect.Slice {
			if inner.Kind() == reflect.Slice {
				name += "[]"
			}
			inner = inner.Elem()
		}
		if inner.Kind() == reflect.Struct {
			name += " {" + jsonFields(inner) + "}"
		}
		names = append(names, name)
	}
	return strings.Join(names, ", ")
}

// wrap breaks text at spaces into lines of at most width characters, each
// starting with indent.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, w := range strings.Fields(text) {
		if len(line) > len(indent) && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if len(line) > len(indent) {
			line += " "
		}
		line += w
	}
	return b.String() + line
}

// readRequest decodes the JSON request in file (stdin for "-" or "") into
// v, refusing fields the request does not have and anything after it.
func readRequest(cmd *cobra.Command, file string, v any) error {
	var raw []byte
	var err error
	from := "on stdin"
	if file == "" || file == "-" {
		raw, err = io.ReadAll(cmd.InOrStdin())
	} else {
		from = "in " + file
		raw, err = os.ReadFile(file)
	}
	if err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return fmt.Errorf("no request %s: give its JSON body with --file or on stdin", from)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the request %s: %w", from, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("the request %s: unexpected data after the JSON object", from)
	}
	// The request is sent again from v, where an absent field is its zero
	// value: what the API would refuse is refused here.
	if f := wire.MissingRequired(raw, v); f != "" {
		return fmt.Errorf("the request %s needs %s", from, f)
	}
	return nil
}

func newUTXOBlockCmd(opts *clientOpts) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "block",
		Short: "Apply a block, or roll blocks back",
		Long: `Apply a block, or roll blocks back. apply reads the block, the JSON body of
/v1/utxo/blocks/apply, from --file or stdin:

    {"height":N,"hash":"<hash>","prev_hash":"<hash>","txs":[{"txid":"<txid>","coinbase":false,
      "inputs":[{"txid":"<parent>","vout":0,"utxo_hash":"<hash>"}],
      "outputs":[{"vout":0,"utxo_hash":"<hash>","satoshis":1000}]}]}

A block is applied whole or not at all; a rejected block lists every
failing transaction and input.`,
	}
	apply := utxoCmd(opts, "apply", "Apply a whole block", (*client.Client).UTXOApplyBlock)
	rollback := utxoFlagCmd(opts, "rollback", "Undo the blocks above --to-height",
		func(cmd *cobra.Command) func(*client.Client, context.Context) (any, error) {
			to := cmd.Flags().Int64("to-height", -1, "the height to roll back to (required)")
			return func(c *client.Client, ctx context.Context) (any, error) {
				switch {
				case !cmd.Flags().Changed("to-height"):
					return nil, errors.New("--to-height is required: a block height")
				case *to < 0 || *to > 1<<32-1:
					return nil, fmt.Errorf("--to-height %d: a block height is 0 to %d", *to, uint32(1<<32-1))
				}
				return c.UTXORollback(ctx, uint32(*to))
			}
		})
	for _, sub := range []*cobra.Command{apply, rollback} {
		bindEnv(sub, clientEnv)
		cmd.AddCommand(sub)
	}
	return cmd
}

// utxoFlagCmd is a command without a request body: setup declares its
// flags and returns the call, whose answer is printed as JSON.
func utxoFlagCmd(opts *clientOpts, use, short string,
	setup func(cmd *cobra.Command) func(*client.Client, context.Context) (any, error)) *cobra.Command {
	cmd := &cobra.Command{Use: use, Short: short, Args: cobra.NoArgs}
	call := setup(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		c, ctx, cancel, err := opts.open(cmd)
		defer cancel()
		if err != nil {
			return err
		}
		out, err := call(c, ctx)
		if err != nil {
			return withItems(err)
		}
		return printJSON(cmd.OutOrStdout(), out)
	}
	return cmd
}

func newUTXOGetCmd(opts *clientOpts) *cobra.Command {
	var txid string
	var stale bool
	cmd := &cobra.Command{
		Use:   "get --txid TXID",
		Short: "Print every record of a transaction as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if txid == "" {
				return errors.New("--txid is required")
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.UTXOGet(ctx, txid, stale)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVar(&txid, "txid", "", "transaction id (64 hex digits)")
	cmd.Flags().BoolVar(&stale, "stale", false, "read from the server's own copy, without asking the leader (may be behind)")
	return cmd
}

// itemsError is a rejection that names the failed items of a batch, one
// per line after the error itself.
type itemsError struct {
	err   error
	items string
}

func (e *itemsError) Error() string { return e.err.Error() + e.items }
func (e *itemsError) Unwrap() error { return e.err }

// withItems adds the failed items an error envelope lists to err's message.
func withItems(err error) error {
	var e *errcode.Error
	if !errors.As(err, &e) || len(e.Spends)+len(e.Outpoints) == 0 {
		return err
	}
	var b strings.Builder
	list := func(what string, items []errcode.Item) {
		for _, it := range items {
			if it.TxID != "" { // a block's transaction
				what = "txs"
			}
			fmt.Fprintf(&b, "\n  %s[%d]", what, it.Index)
			if it.TxID != "" {
				fmt.Fprintf(&b, " %s", it.TxID)
			}
			if it.Input != nil {
				fmt.Fprintf(&b, " input %d", *it.Input)
			}
			fmt.Fprintf(&b, ": %s", it.Code)
			if it.SpendingTxID != "" {
				fmt.Fprintf(&b, " by %s", it.SpendingTxID)
				if it.Vin != nil {
					fmt.Fprintf(&b, " vin %d", *it.Vin)
				}
			}
		}
	}
	list("spends", e.Spends)
	list("outpoints", e.Outpoints)
	return &itemsError{err: err, items: b.String()}
}
