package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/server"
)

func newServerCmd() *cobra.Command {
	cfg := config.Default()
	var logFormat string
	var heldByDelivery []string // variables of a dequeued delivery left alone
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a raftlockd node (a single-node cluster by default)",
		Long: `Run a raftlockd node. With no flags it starts a single-node cluster that
bootstraps itself in the default data directory and resumes from it on restart.

The API, Raft and gossip are served over mutual TLS. On first start the
single-node default creates a CA with a server, a client and a TC client
bundle in <data-dir>/tls; client commands on this machine find them without
flags. The nodes of a larger cluster need server bundles of one CA
(raftlockd auth new cluster --dir DIR --host NODE ...), given with --bundle.
SIGHUP reloads the bundle: replace its file to rotate certificates without a
restart. --disable-mtls serves plain HTTP to anyone (development only).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(cfg.Join) > 0 && !cmd.Flags().Changed("bootstrap-expect") {
				cfg.BootstrapExpect = 0 // joining an existing cluster
			}
			log, err := newLogger(cfg.LogLevel, logFormat)
			if err != nil {
				return err
			}
			if unknown := unknownEnv(cmd.Flags(), serverEnv, deliveryEnv(), clientEnv, healthEnv, benchEnv); len(unknown) > 0 {
				log.Warn("ignoring environment variables that name no flag of raftlockd server", "variables", strings.Join(unknown, ","))
			}
			if len(heldByDelivery) > 0 {
				log.Warn("ignoring environment variables of the delivery `client queue dequeue` exported into this shell; give the flags instead",
					"variables", strings.Join(heldByDelivery, ","))
			}
			// Signals are taken before the node starts: one that arrives
			// while it starts is handled once it serves.
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			// SIGHUP reloads the TLS bundle (certificate rotation).
			hup := make(chan os.Signal, 1)
			signal.Notify(hup, syscall.SIGHUP)
			defer signal.Stop(hup)
			srv, err := server.Start(cfg, log)
			if err != nil {
				return err
			}
			for {
				select {
				case <-hup:
					if err := srv.Reload(); err != nil {
						log.Error("reload failed; still using the previous bundle", "error", err)
					}
					continue
				case <-ctx.Done():
					// A second signal takes its default effect: the process
					// ends at once, its state kept as after a crash.
					stop()
					log.Info("shutting down; a second SIGINT or SIGTERM stops at once")
					sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					// A leader stopped on purpose hands over first: the
					// cluster goes on without waiting for an election.
					srv.Node().HandOff(sctx)
					return srv.Close(sctx)
				case <-srv.Done(): // it left the cluster and closed itself
					sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					return srv.Close(sctx)
				}
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory holding the Raft log, snapshots and state")
	f.StringVar(&cfg.NodeID, "node-id", "", "node id (default: generated once and kept in the data dir)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API address")
	f.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "Raft transport address")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address peers dial (default: --raft-listen)")
	f.StringVar(&cfg.APIAdvertise, "api-advertise", "", "API endpoint peers send clients to (default: https://<listen>, http:// with --disable-mtls)")
	f.StringVar(&cfg.GossipListen, "gossip-listen", cfg.GossipListen, "gossip address (UDP and TCP) for discovery")
	f.StringVar(&cfg.GossipAdvertise, "gossip-advertise", "", "gossip address peers reach (default: --gossip-listen)")
	f.StringSliceVar(&cfg.Join, "join", nil, "gossip addresses of cluster members to join (host:port,...)")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", cfg.BootstrapExpect, "servers that must see each other before a new cluster starts (with --join it defaults to 0: only join)")
	f.StringVar(&cfg.ClusterName, "cluster-name", cfg.ClusterName, "gossip label; nodes of other clusters are ignored")
	f.DurationVar(&cfg.DeadServerTimeout, "dead-server-timeout", cfg.DeadServerTimeout, "how long a server must stay dead before the leader removes it from the voters")
	f.IntVar(&cfg.MinQuorum, "min-quorum", 0, "fewest voters dead-server cleanup may leave (default: a majority of the most voters the cluster has had alive, recorded in its replicated state)")
	f.StringVar(&cfg.GossipProfile, "gossip-profile", cfg.GossipProfile, "gossip timing: lan, or fast for loopback clusters")
	f.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler (net/http/pprof) under /debug/pprof/ on the API address")
	f.BoolVar(&cfg.DisableMTLS, "disable-mtls", false, "serve plain HTTP to anyone and run Raft and gossip unencrypted (development only; warned about at every start)")
	f.StringVar(&cfg.Bundle, "bundle", "", "the node's server bundle (PEM: certificate, key, CA, gossip key); default <data-dir>/tls/server.pem, created with a new CA by the single-node default; SIGHUP reloads it")
	f.BoolVar(&cfg.TCDisableAuth, "tc-disable-auth", false, "accept coordinator and resource-manager requests (/v1/txn/*, /v1/tc/* but /v1/tc/cluster/leave and /v1/tc/trust) without a certificate")
	f.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "lease TTL when a request names none")
	f.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "longest TTL a lease may ask for")
	f.DurationVar(&cfg.AcquireBlock, "acquire-block", cfg.AcquireBlock, "longest an acquire waits for a held lease (block_seconds=0 waits this long)")
	f.Int64Var(&cfg.MaxStateBytes, "max-state-bytes", cfg.MaxStateBytes, "largest JSON state document accepted")
	f.DurationVar(&cfg.QueueVisibility, "queue-visibility", cfg.QueueVisibility, "how long a delivered message stays leased when neither enqueue nor dequeue names a visibility timeout")
	f.IntVar(&cfg.QueueMaxAttempts, "queue-max-attempts", cfg.QueueMaxAttempts, "failed deliveries before a message moves to the dead-letter queue <queue>.dlq, when the enqueue names none")
	f.Int64Var(&cfg.MaxPayloadBytes, "max-payload-bytes", cfg.MaxPayloadBytes, "largest queue message payload accepted")
	f.IntVar(&cfg.UTXOBatchSize, "utxo-batch-size", cfg.UTXOBatchSize, "outputs per UTXO record; a transaction with more is stored as several records")
	f.Uint32Var(&cfg.UTXORetentionBlocks, "utxo-retention-blocks", cfg.UTXORetentionBlocks, "blocks a spent, mined UTXO transaction is kept before it may be pruned")
	f.Uint32Var(&cfg.UTXORollbackWindow, "utxo-rollback-window", cfg.UTXORollbackWindow, "blocks whose undo deltas are kept for rollbacks (at least the retention)")
	f.IntVar(&cfg.UTXOPruneBatch, "utxo-prune-batch", cfg.UTXOPruneBatch, "transactions one prune pass looks at")
	f.DurationVar(&cfg.UTXOPruneInterval, "utxo-prune-interval", cfg.UTXOPruneInterval, "time between prune passes on the leader")
	f.IntVar(&cfg.MaxEntryBytes, "max-entry-bytes", cfg.MaxEntryBytes, "largest Raft entry a UTXO command may encode to (at least 44 bytes per output of a batch plus 1 KiB)")
	f.Int64Var(&cfg.MaxUTXORequestBytes, "max-utxo-request-bytes", cfg.MaxUTXORequestBytes, "largest body of a UTXO create or spend request")
	f.DurationVar(&cfg.TxnRetention, "tc-decision-retention", cfg.TxnRetention, "how long final transaction decisions, and how queue deliveries ended, are kept to answer retries and late replays")
	f.DurationVar(&cfg.TxnRetention, "txn-retention", cfg.TxnRetention, "")
	_ = f.MarkDeprecated("txn-retention", "use --tc-decision-retention")
	f.StringSliceVar(&cfg.TCPeers, "tc-peer", nil, "API endpoints of other islands (raftlockd clusters) to register this island with")
	f.DurationVar(&cfg.TCFanoutTimeout, "tc-fanout-timeout", cfg.TCFanoutTimeout, "one attempt to reach another island's resource manager")
	f.IntVar(&cfg.TCFanoutAttempts, "tc-fanout-attempts", cfg.TCFanoutAttempts, "attempts per island before a decision answers txn_fanout_failed (the leader keeps replaying it)")
	f.DurationVar(&cfg.TCFanoutBaseDelay, "tc-fanout-base-delay", cfg.TCFanoutBaseDelay, "first delay between attempts (exponential, with jitter)")
	f.DurationVar(&cfg.TCFanoutMaxDelay, "tc-fanout-max-delay", cfg.TCFanoutMaxDelay, "longest delay between attempts")
	f.Float64Var(&cfg.TCFanoutMultiplier, "tc-fanout-multiplier", cfg.TCFanoutMultiplier, "growth factor of the delay between attempts (1-100)")
	f.DurationVar(&cfg.TCPendingTTL, "tc-pending-ttl", cfg.TCPendingTTL, "how long a pending decision lasts when the request names no expiry, and a transaction holding only staged enqueues after its last one; then it is rolled back")
	f.DurationVar(&cfg.LeaderWait, "leader-wait", cfg.LeaderWait, "how long a request waits for a leader before answering 503")
	f.DurationVar(&cfg.HeartbeatTimeout, "raft-heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	f.DurationVar(&cfg.ElectionTimeout, "raft-election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	f.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries between automatic snapshots")
	f.Uint64Var(&cfg.TrailingLogs, "snapshot-trailing-logs", cfg.TrailingLogs, "log entries kept after a snapshot; a follower further behind catches up by snapshot")
	f.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often to check whether a snapshot is due")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	// A shell that ran `eval "$(raftlockd client queue dequeue ...)"` holds
	// the delivery's RAFTLOCKD_QUEUE_* variables, one of which names a flag
	// of the server too (RAFTLOCKD_QUEUE_MAX_ATTEMPTS): there they describe
	// the message, not the server.
	bindEnvSkipping(cmd, serverEnv, func(name string) bool {
		if _, ok := os.LookupEnv(queueEnv + "MESSAGE_ID"); ok && slices.Contains(deliveryEnv(), name) {
			heldByDelivery = append(heldByDelivery, name)
			return true
		}
		return false
	})
	return cmd
}

// serverEnv is the prefix of the variables of `raftlockd server`.
const serverEnv = "RAFTLOCKD_"

// unknownEnv lists the variables under prefix that stand in for no flag of
// fs and are none of names, leaving out those under the prefixes of other
// commands (others).
func unknownEnv(fs *pflag.FlagSet, prefix string, names []string, others ...string) []string {
	known := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) { known[flagEnv(prefix, f)] = true })
	for _, n := range names {
		known[n] = true
	}
	var unknown []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, prefix) && !known[name] &&
			!slices.ContainsFunc(others, func(p string) bool { return strings.HasPrefix(name, p) }) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown
}

func newLogger(level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want text or json", format)
}
