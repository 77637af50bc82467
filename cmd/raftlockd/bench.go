package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/bench"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/server"
)

func newBenchCmd() *cobra.Command {
	var (
		target, workloads, clients, format string
		embedded                           bool
		spawn, failoverRounds              int
		raftTimeout                        time.Duration
		opts                               bench.Options
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure lock workloads against a raftlockd server",
		Long: `Measure lock workloads and print ops/s with p50/p95/p99/max latency per
workload and client count. Workloads: lock (acquire + update + release of a
key per client), handoff (all clients contend for ONE key). With --embedded
it starts a throw-away single-node server in a temporary directory.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cl *bench.Cluster
			if spawn > 0 {
				dir, err := os.MkdirTemp("", "raftlockd-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				bin, err := os.Executable()
				if err != nil {
					return err
				}
				if cl, err = bench.SpawnCluster(cmd.Context(), bin, dir, spawn, raftTimeout); err != nil {
					return err
				}
				defer cl.Stop()
				target = strings.Join(cl.Endpoints(), ",")
			}
			if embedded {
				dir, err := os.MkdirTemp("", "raftlockd-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				cfg := config.Default()
				cfg.DataDir, cfg.Listen, cfg.RaftListen = dir, "127.0.0.1:0", "127.0.0.1:0"
				srv, err := server.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					return err
				}
				defer srv.Close(context.Background())
				target = srv.URL()
			}
			var conns []*client.Client
			for _, u := range strings.Split(target, ",") {
				c, err := client.New(strings.TrimSpace(u))
				if err != nil {
					return err
				}
				conns = append(conns, c)
			}
			var results []bench.Result
			for _, w := range strings.Split(workloads, ",") {
				for _, cs := range strings.Split(clients, ",") {
					n, err := strconv.Atoi(strings.TrimSpace(cs))
					if err != nil {
						return fmt.Errorf("--clients: %w", err)
					}
					o := opts
					o.Workload, o.Clients = strings.TrimSpace(w), n
					res, err := bench.Run(cmd.Context(), &bench.Raftlockd{Clients: conns}, o)
					if err != nil {
						return err
					}
					results = append(results, res)
					if format == "table" {
						fmt.Fprintf(cmd.ErrOrStderr(), "done: %s x%d %.0f ops/s\n", res.Workload, res.Clients, res.OpsPerSec)
					}
				}
			}
			var failovers []time.Duration
			if cl != nil && failoverRounds > 0 {
				var err error
				if failovers, err = bench.Failover(cmd.Context(), cl, failoverRounds); err != nil {
					return err
				}
			}
			if format == "json" {
				return bench.WriteJSON(cmd.OutOrStdout(), bench.Report{Results: results, Failovers: failovers})
			}
			if err := bench.WriteTable(cmd.OutOrStdout(), results); err != nil {
				return err
			}
			if len(failovers) > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "\nfailover (leader SIGKILL -> first acknowledged write), %d rounds: %s\n",
					len(failovers), bench.Summarize(failovers))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&target, "server", "http://127.0.0.1:9341", "server URL(s), comma-separated; clients are spread over them")
	f.IntVar(&spawn, "spawn", 0, "start this many server processes forming one cluster and measure them")
	f.DurationVar(&raftTimeout, "raft-timeout", 200*time.Millisecond, "Raft heartbeat and election timeout of spawned servers")
	f.IntVar(&failoverRounds, "failover-rounds", 0, "with --spawn: kill the leader this many times and time the recovery")
	f.BoolVar(&embedded, "embedded", false, "start a temporary single-node server and measure it")
	f.StringVar(&workloads, "workload", "lock,handoff", "comma-separated workloads: lock, handoff")
	f.StringVar(&clients, "clients", "1,64", "comma-separated client counts; one run per count")
	f.DurationVar(&opts.Duration, "duration", 10*time.Second, "measured time per run")
	f.IntVar(&opts.Ops, "ops", 0, "measure this many operations instead of a duration")
	f.DurationVar(&opts.Warmup, "warmup", 2*time.Second, "unmeasured warm-up per run")
	f.IntVar(&opts.Payload, "payload", 256, "bytes written per lock cycle")
	f.StringVar(&format, "format", "table", "table or json")
	bindEnv(cmd, "RAFTLOCKD_BENCH_")
	return cmd
}
