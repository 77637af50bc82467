package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/server"
)

func newServerCmd() *cobra.Command {
	cfg := config.Default()
	var logFormat string
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run a raftlockd node (a single-node cluster by default)",
		Long: `Run a raftlockd node. With no flags it starts a single-node cluster that
bootstraps itself in the default data directory and resumes from it on restart.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(cfg.Join) > 0 && !cmd.Flags().Changed("bootstrap-expect") {
				cfg.BootstrapExpect = 0 // joining an existing cluster
			}
			log, err := newLogger(cfg.LogLevel, logFormat)
			if err != nil {
				return err
			}
			srv, err := server.Start(cfg, log)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			select {
			case <-ctx.Done():
				log.Info("shutting down")
				// A leader stopped on purpose hands over first: the
				// cluster goes on without waiting for an election.
				srv.Node().HandOff(sctx)
			case <-srv.Done(): // it left the cluster and closed itself
			}
			return srv.Close(sctx)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "directory holding the Raft log, snapshots and state")
	f.StringVar(&cfg.NodeID, "node-id", "", "node id (default: generated once and kept in the data dir)")
	f.StringVar(&cfg.Listen, "listen", cfg.Listen, "HTTP API address")
	f.StringVar(&cfg.RaftListen, "raft-listen", cfg.RaftListen, "Raft transport address")
	f.StringVar(&cfg.RaftAdvertise, "raft-advertise", "", "Raft address peers dial (default: --raft-listen)")
	f.StringVar(&cfg.APIAdvertise, "api-advertise", "", "API endpoint peers send clients to (default: http://<listen>)")
	f.StringVar(&cfg.GossipListen, "gossip-listen", cfg.GossipListen, "gossip address (UDP and TCP) for discovery")
	f.StringVar(&cfg.GossipAdvertise, "gossip-advertise", "", "gossip address peers reach (default: --gossip-listen)")
	f.StringSliceVar(&cfg.Join, "join", nil, "gossip addresses of cluster members to join (host:port,...)")
	f.IntVar(&cfg.BootstrapExpect, "bootstrap-expect", cfg.BootstrapExpect, "servers that must see each other before a new cluster starts (default 1, or 0 with --join: only join)")
	f.StringVar(&cfg.ClusterName, "cluster-name", cfg.ClusterName, "gossip label; nodes of other clusters are ignored")
	f.DurationVar(&cfg.DeadServerTimeout, "dead-server-timeout", cfg.DeadServerTimeout, "how long a server must stay dead before the leader removes it from the voters")
	f.IntVar(&cfg.MinQuorum, "min-quorum", 0, "fewest voters dead-server cleanup may leave (default: a majority of --bootstrap-expect)")
	f.StringVar(&cfg.GossipProfile, "gossip-profile", cfg.GossipProfile, "gossip timing: lan, or fast for loopback clusters")
	f.BoolVar(&cfg.Pprof, "pprof", false, "serve Go's profiler (net/http/pprof) under /debug/pprof/ on the API address")
	f.BoolVar(&cfg.DisableMTLS, "disable-mtls", false, "serve plain HTTP (mTLS is not available yet; plain HTTP is the only mode)")
	f.DurationVar(&cfg.DefaultTTL, "default-ttl", cfg.DefaultTTL, "lease TTL when a request names none")
	f.DurationVar(&cfg.MaxTTL, "max-ttl", cfg.MaxTTL, "longest TTL a lease may ask for")
	f.DurationVar(&cfg.AcquireBlock, "acquire-block", cfg.AcquireBlock, "longest an acquire waits for a held lease (block_seconds=0 waits this long)")
	f.Int64Var(&cfg.MaxStateBytes, "max-state-bytes", cfg.MaxStateBytes, "largest JSON state document accepted")
	f.DurationVar(&cfg.TxnRetention, "txn-retention", cfg.TxnRetention, "how long final transaction decisions are kept to answer retries")
	f.DurationVar(&cfg.LeaderWait, "leader-wait", cfg.LeaderWait, "how long a request waits for a leader before answering 503")
	f.DurationVar(&cfg.HeartbeatTimeout, "raft-heartbeat-timeout", cfg.HeartbeatTimeout, "Raft heartbeat timeout")
	f.DurationVar(&cfg.ElectionTimeout, "raft-election-timeout", cfg.ElectionTimeout, "Raft election timeout")
	f.Uint64Var(&cfg.SnapshotThreshold, "snapshot-threshold", cfg.SnapshotThreshold, "log entries between automatic snapshots")
	f.Uint64Var(&cfg.TrailingLogs, "snapshot-trailing-logs", cfg.TrailingLogs, "log entries kept after a snapshot; a follower further behind catches up by snapshot")
	f.DurationVar(&cfg.SnapshotInterval, "snapshot-interval", cfg.SnapshotInterval, "how often to check whether a snapshot is due")
	f.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "text", "text or json")
	bindEnv(cmd, "RAFTLOCKD_")
	return cmd
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
