package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/wire"
)

// queueEnv prefixes the variables `client queue dequeue` exports for the
// delivery it leased, which ack, nack and extend read.
const queueEnv = "RAFTLOCKD_QUEUE_"

// deliveryVars are the variables dequeue exports, in the order it prints
// them; ack and nack unset them.
var deliveryVars = []string{"NAMESPACE", "NAME", "MESSAGE_ID", "LEASE", "FENCING_TOKEN", "TXN_ID", "ATTEMPTS",
	"FAILURE_ATTEMPTS", "MAX_ATTEMPTS", "LEASE_EXPIRES_AT", "CONTENT_TYPE", "PAYLOAD_BYTES", "PAYLOAD_FILE",
	"STATE_KEY", "STATE_LEASE", "STATE_TXN_ID", "STATE_FENCING_TOKEN", "STATE_FILE", "TEMP_FILES"}

// deliveryEnv returns the names of the variables dequeue exports.
func deliveryEnv() []string {
	names := make([]string, len(deliveryVars))
	for i, v := range deliveryVars {
		names[i] = queueEnv + v
	}
	return names
}

func newQueueCmd(opts *clientOpts) *cobra.Command {
	cmd := &cobra.Command{Use: "queue", Short: "Enqueue, dequeue, ack, nack and extend queue messages"}
	for _, sub := range []*cobra.Command{newEnqueueCmd(opts), newDequeueCmd(opts), newAckCmd(opts), newNackCmd(opts),
		newExtendCmd(opts), newQueueStatsCmd(opts)} {
		bindEnv(sub, clientEnv)
		if sub.Flags().Lookup("message-id") != nil {
			preferQueueNamespace(sub)
		}
		cmd.AddCommand(sub)
	}
	return cmd
}

// preferQueueNamespace makes RAFTLOCKD_QUEUE_NAMESPACE, the namespace of the
// delivery dequeue exported, win over RAFTLOCKD_CLIENT_NAMESPACE; --namespace
// wins over both.
func preferQueueNamespace(cmd *cobra.Command) {
	if cmd.Long == "" {
		cmd.Long = cmd.Short + "."
	}
	cmd.Long += "\n\nThe namespace is --namespace's when it is given, else " + queueEnv + "NAMESPACE's\n(the delivery's, which dequeue exported), else " + clientEnv + "NAMESPACE's."
	bound := cmd.PreRunE
	cmd.PreRunE = func(c *cobra.Command, args []string) error {
		if ns := c.Flags().Lookup("namespace"); ns != nil && !ns.Changed {
			if v, ok := os.LookupEnv(queueEnv + "NAMESPACE"); ok {
				if err := c.Flags().Set("namespace", v); err != nil {
					return fmt.Errorf("%sNAMESPACE: %w", queueEnv, err)
				}
			}
		}
		if bound != nil {
			return bound(c, args)
		}
		return nil
	}
}

// deliveryFlags name a leased message; `dequeue` exports them.
type deliveryFlags struct {
	queue   string
	id      string
	lease   string
	fencing int64
}

// register adds the flags, read from the RAFTLOCKD_QUEUE_* variables (not
// the RAFTLOCKD_CLIENT_* ones, which name a key's lease).
func (d *deliveryFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&d.queue, "queue", "", "queue of the delivery")
	f.StringVar(&d.id, "message-id", "", "message id (from dequeue)")
	f.StringVar(&d.lease, "lease", "", "the delivery's lease id (from dequeue)")
	f.Int64Var(&d.fencing, "fencing-token", 0, "the delivery's fencing token (from dequeue)")
	for flag, env := range map[string]string{"queue": "NAME", "message-id": "MESSAGE_ID", "lease": "LEASE", "fencing-token": "FENCING_TOKEN"} {
		_ = f.SetAnnotation(flag, envAnnotation, []string{queueEnv + env})
	}
}

// require refuses a command that needs a delivery when none is named.
func (d *deliveryFlags) require() error {
	if d.queue == "" || d.id == "" || d.lease == "" {
		return fmt.Errorf("no delivery named: pass --queue, --message-id and --lease, or eval the output of "+
			"`raftlockd client queue dequeue`, which sets %sNAME, %sMESSAGE_ID and %sLEASE", queueEnv, queueEnv, queueEnv)
	}
	return nil
}

// end prints the unset line for the delivery variables and, when they
// name the delivery d that ended, removes the temporary files dequeue wrote
// for it (RAFTLOCKD_QUEUE_TEMP_FILES; never a --payload-file). Variables
// naming another delivery, which the shell still holds, are left set. A
// delivery enlisted in the shell's transaction (RAFTLOCKD_CLIENT_TXN_ID)
// ended with that transaction, so the lease variables are unset too, as
// release does.
func (d *deliveryFlags) end(w io.Writer) {
	named := os.Getenv(queueEnv+"MESSAGE_ID") == d.id && os.Getenv(queueEnv+"LEASE") == d.lease
	if named {
		removeFiles(filepath.SplitList(os.Getenv(queueEnv + "TEMP_FILES")))
	}
	if named || os.Getenv(queueEnv+"MESSAGE_ID") == "" {
		printUnset(w, queueEnv, deliveryVars)
	}
	if txn := os.Getenv(queueEnv + "TXN_ID"); named && txn != "" && txn == os.Getenv(clientEnv+"TXN_ID") {
		printUnset(w, clientEnv, leaseVars)
	}
}

func newEnqueueCmd(opts *clientOpts) *cobra.Command {
	var queue, attributes, contentType, txnID, idem string
	var delay, visibility, ttl int64
	var maxAttempts int
	cmd := &cobra.Command{
		Use:   "enqueue [FILE|-]",
		Short: "Enqueue a message whose payload is read from FILE or stdin",
		Long: `Enqueue a message. The payload is read from FILE, or from stdin when no
file (or -) is given. With --txn-id the message is staged in that
transaction and appears when it commits. Prints the enqueue answer as JSON.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := wire.EnqueueRequest{Namespace: opts.namespace, Queue: queue, MaxAttempts: maxAttempts,
				PayloadContentType: contentType, TxnID: txnID, DelaySeconds: delay, VisibilityTimeoutSeconds: visibility,
				TTLSeconds: ttl}
			if attributes != "" {
				if !json.Valid([]byte(attributes)) {
					return fmt.Errorf("--attributes: not JSON")
				}
				req.Attributes = json.RawMessage(attributes)
			}
			payload, err := readInput(cmd, args)
			if err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			if idem == "" {
				idem = defaultIdempotencyKey()
			}
			out, err := c.EnqueueWithKey(ctx, req, payload, idem)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	f := cmd.Flags()
	f.StringVar(&queue, "queue", "", "queue")
	secondsVar(f, &delay, "delay", "keep the message invisible this long, e.g. 10s")
	secondsVar(f, &visibility, "visibility", "how long a delivery stays leased, e.g. 30s (0: server default)")
	secondsVar(f, &ttl, "message-ttl", "drop the message when not delivered within this time, e.g. 1h (0: keep)")
	f.IntVar(&maxAttempts, "max-attempts", 0, "failed deliveries before the message moves to <queue>.dlq (0: server default)")
	f.StringVar(&attributes, "attributes", "", `JSON object stored with the message, e.g. '{"kind":"mail"}'`)
	f.StringVar(&contentType, "content-type", "", "media type of the payload")
	f.StringVar(&txnID, "txn-id", "", "stage the message in this transaction (visible when it commits)")
	f.StringVar(&idem, "idempotency-key", "", "request identity; retries with the same key enqueue once")
	return cmd
}

func newDequeueCmd(opts *clientOpts) *cobra.Command {
	var queue, owner, txnID, payloadFile string
	var visibility, wait int64
	var withState bool
	cmd := &cobra.Command{
		Use:   "dequeue",
		Short: "Lease the next message of a queue and print shell exports for it",
		Long: `Lease the next message of a queue and print export lines, so that

    eval "$(raftlockd client queue dequeue --queue jobs)"
    cat "$RAFTLOCKD_QUEUE_PAYLOAD_FILE"
    raftlockd client queue ack

works from the environment: RAFTLOCKD_QUEUE_NAMESPACE, _NAME, _MESSAGE_ID,
_LEASE, _FENCING_TOKEN and _TXN_ID name the delivery; the payload is
written to a file (a new temporary file unless --payload-file is given)
named by RAFTLOCKD_QUEUE_PAYLOAD_FILE. ack and nack remove the temporary
files dequeue wrote (RAFTLOCKD_QUEUE_TEMP_FILES). With --with-state the message's state
sidecar is leased too: RAFTLOCKD_QUEUE_STATE_KEY, _STATE_LEASE,
_STATE_TXN_ID and _STATE_FENCING_TOKEN name it ('client get|update|remove
--queue-state' use them), and its
committed document is written to RAFTLOCKD_QUEUE_STATE_FILE (empty when it
has none). With --txn-id (or RAFTLOCKD_CLIENT_TXN_ID) the delivery is
enlisted in that transaction: committing it acknowledges the message.
When no message comes within --wait the command fails with "waiting". When
the payload or the state cannot be written, the delivery is handed back to
the queue (a nack that defers, spending no attempt) and the command fails;
an enlisted delivery stays leased, since a nack would end its transaction.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			req := wire.DequeueRequest{Namespace: opts.namespace, Queue: queue, Owner: owner, VisibilityTimeoutSeconds: visibility,
				WaitSeconds: wait, TxnID: txnID}
			dequeue := c.Dequeue
			if withState {
				dequeue = c.DequeueWithState
			}
			d, err := dequeue(ctx, req)
			if err != nil {
				return err
			}
			var temp []string // removed by ack and nack
			path, err := writeFile(payloadFile, "raftlockd-payload-*", d.Payload)
			if err != nil {
				return d.HandBack(ctx, fmt.Errorf("writing the payload: %w", err))
			}
			if payloadFile == "" {
				temp = append(temp, path)
			}
			m := d.Message
			kvs := [][2]string{{"NAMESPACE", m.Namespace}, {"NAME", m.Queue}, {"MESSAGE_ID", m.MessageID},
				{"LEASE", m.LeaseID}, {"FENCING_TOKEN", strconv.FormatInt(m.FencingToken, 10)}, {"TXN_ID", m.TxnID},
				{"ATTEMPTS", strconv.Itoa(m.Attempts)}, {"FAILURE_ATTEMPTS", strconv.Itoa(m.FailureAttempts)},
				{"MAX_ATTEMPTS", strconv.Itoa(m.MaxAttempts)}, {"LEASE_EXPIRES_AT", strconv.FormatInt(m.LeaseExpiresAtUnix, 10)},
				{"CONTENT_TYPE", m.PayloadContentType}, {"PAYLOAD_BYTES", strconv.FormatInt(m.PayloadBytes, 10)},
				{"PAYLOAD_FILE", path}}
			if ref, ok := d.StateRef(); ok {
				var state []byte
				if d.State != nil {
					state = d.State.Body
				}
				statePath, err := writeFile("", "raftlockd-state-*", state)
				if err != nil {
					removeFiles(temp)
					return d.HandBack(ctx, fmt.Errorf("writing the state: %w", err))
				}
				kvs = append(kvs, [2]string{"STATE_KEY", ref.Key}, [2]string{"STATE_LEASE", ref.LeaseID},
					[2]string{"STATE_TXN_ID", ref.TxnID}, [2]string{"STATE_FENCING_TOKEN", strconv.FormatInt(ref.FencingToken, 10)},
					[2]string{"STATE_FILE", statePath})
				temp = append(temp, statePath)
			}
			kvs = append(kvs, [2]string{"TEMP_FILES", strings.Join(temp, string(os.PathListSeparator))})
			printExports(cmd.OutOrStdout(), queueEnv, kvs)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&queue, "queue", "", "queue")
	f.StringVar(&owner, "owner", defaultOwner(), "owner recorded on the delivery")
	secondsVar(f, &visibility, "visibility", "how long the delivery stays leased, e.g. 30s (0: the message's own)")
	waitVar(f, &wait, "wait", "how long to wait for a message, e.g. 10s (0 or forever: server maximum, -1 or nowait: do not wait)")
	f.StringVar(&txnID, "txn-id", "", "enlist the delivery in this transaction")
	f.BoolVar(&withState, "with-state", false, "also lease the message's state sidecar")
	f.StringVar(&payloadFile, "payload-file", "", "write the payload to this file (default: a new temporary file)")
	return cmd
}

func removeFiles(paths []string) {
	for _, p := range paths {
		_ = os.Remove(p)
	}
}

// writeFile writes data to path, or to a new temporary file named after
// pattern when path is empty, and returns the file's path.
func writeFile(path, pattern string, data []byte) (string, error) {
	var f *os.File
	var err error
	if path == "" {
		f, err = os.CreateTemp("", pattern)
	} else {
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	}
	if err != nil {
		return "", err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return "", err
	}
	return f.Name(), f.Close()
}

func (d *deliveryFlags) ack(ns string) wire.AckRequest {
	return wire.AckRequest{Namespace: ns, Queue: d.queue, MessageID: d.id, LeaseID: d.lease, FencingToken: d.fencing}
}

func newAckCmd(opts *clientOpts) *cobra.Command {
	var d deliveryFlags
	cmd := &cobra.Command{
		Use:   "ack",
		Short: "Acknowledge a delivery: the message (and its state sidecar) is removed",
		Long: `Acknowledge the delivery named by the flags or by the RAFTLOCKD_QUEUE_*
variables dequeue exported. A delivery enlisted in a transaction is
acknowledged by committing that transaction. Prints an unset line for the
delivery variables, so that eval "$(raftlockd client queue ack)" clears them
(unless they name another delivery than the flags do), and, when the delivery was enlisted in the shell's transaction
(RAFTLOCKD_CLIENT_TXN_ID), one for the lease variables, as release does. An
ack refused because that transaction can only roll back (txn_rolled_back)
exits non-zero and prints the unset lines all the same.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := d.require(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			_, err = c.Ack(ctx, d.ack(opts.namespace))
			if txnOver(err) {
				d.end(cmd.OutOrStdout())
			}
			return err
		},
	}
	d.register(cmd)
	return cmd
}

func newNackCmd(opts *clientOpts) *cobra.Command {
	var d deliveryFlags
	var lastError string
	var delay int64
	var deferred bool
	cmd := &cobra.Command{
		Use:   "nack",
		Short: "Hand a delivery back to its queue (after --delay)",
		Long: `Hand the delivery back: it becomes visible again after --delay. A failure
(the default) counts against the message's max_attempts, and the last
allowed one moves it to the dead-letter queue <queue>.dlq; --defer hands it
back without counting. A delivery enlisted in a transaction is handed back
by rolling that transaction back. Prints an unset line for the delivery
variables (unless they name another delivery than the flags do) and, when the delivery was enlisted in the shell's transaction
(RAFTLOCKD_CLIENT_TXN_ID), one for the lease variables, as release does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a := d.ack(opts.namespace)
			req := wire.NackRequest{Namespace: a.Namespace, Queue: a.Queue, MessageID: a.MessageID, LeaseID: a.LeaseID,
				FencingToken: a.FencingToken, DelaySeconds: delay, Intent: wire.NackIntentFailure}
			if deferred {
				req.Intent = wire.NackIntentDefer
			}
			if lastError != "" {
				if !json.Valid([]byte(lastError)) {
					raw, _ := json.Marshal(lastError)
					lastError = string(raw)
				}
				req.LastError = json.RawMessage(lastError)
			}
			if err := d.require(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.Nack(ctx, req)
			if err == nil && out.DeadLetterQueue != "" {
				fmt.Fprintf(cmd.ErrOrStderr(), "message moved to %s\n", out.DeadLetterQueue)
			}
			if txnOver(err) {
				d.end(cmd.OutOrStdout())
			}
			return err
		},
	}
	d.register(cmd)
	f := cmd.Flags()
	secondsVar(f, &delay, "delay", "keep the message invisible this long, e.g. 10s")
	f.BoolVar(&deferred, "defer", false, "hand back without counting a failed attempt")
	f.StringVar(&lastError, "last-error", "", "why the delivery failed (JSON, or text stored as a JSON string)")
	return cmd
}

func newExtendCmd(opts *clientOpts) *cobra.Command {
	var d deliveryFlags
	var by int64
	cmd := &cobra.Command{
		Use:   "extend",
		Short: "Extend a delivery's lease (and its state sidecar's)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			a := d.ack(opts.namespace)
			if err := d.require(); err != nil {
				return err
			}
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.Extend(ctx, wire.ExtendRequest{Namespace: a.Namespace, Queue: a.Queue, MessageID: a.MessageID,
				LeaseID: a.LeaseID, FencingToken: a.FencingToken, ExtendBySeconds: by})
			if err != nil {
				return err
			}
			printExports(cmd.OutOrStdout(), queueEnv, [][2]string{{"LEASE_EXPIRES_AT", strconv.FormatInt(out.LeaseExpiresAtUnix, 10)}})
			return nil
		},
	}
	d.register(cmd)
	secondsVar(cmd.Flags(), &by, "by", "new lease length from now, e.g. 60s (0: the message's visibility timeout)")
	return cmd
}

func newQueueStatsCmd(opts *clientOpts) *cobra.Command {
	var queue string
	var stale bool
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Print a queue's counts and head message as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, ctx, cancel, err := opts.open(cmd)
			defer cancel()
			if err != nil {
				return err
			}
			out, err := c.QueueStats(ctx, opts.namespace, queue, stale)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), out)
		},
	}
	cmd.Flags().StringVar(&queue, "queue", "", "queue")
	cmd.Flags().BoolVar(&stale, "stale", false, "read from the server's own copy, without asking the leader (may be behind)")
	return cmd
}
