package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/bench"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/server"
	"github.com/raftlockd/raftlockd/wire"
)

// startCPUProfile profiles this process into path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// benchFlags are the flags of `raftlockd bench`.
type benchFlags struct {
	target, workloads, clients, runs, format string
	embedded                                 bool
	spawn, failoverRounds, rounds, islands   int
	raftTimeout                              time.Duration
	cpuProfile, second, bundlePath, dir      string
	peer, etcdBin, serverProfile, goalsOut   string
	blocks                                   string
	rollbackBlocks                           int
	etcd                                     bench.EtcdOptions
	opts                                     bench.Options
}

func newBenchCmd() *cobra.Command {
	var bf benchFlags
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure lock workloads against a raftlockd server, side by side with etcd",
		Long: `Measure lock workloads and print ops/s with p50/p95/p99/max latency per
workload and client count. Workloads: lock (acquire + update + release of a
key per client), handoff (all clients contend for ONE key), xa-commit (two
keys committed in one transaction: on one island, or on two with
--islands 2 or --second-island), queue (a producer/consumer pair per
client: enqueue, dequeue, ack), public-read (linearizable read of a
committed key without a lease), put (an update of the client's key under a
lease it holds for the run: raftlockd's closest to a plain write),
utxo-spend (a transaction spending two unspent outputs, of two parent
transactions with --utxo-parent-outputs outputs each that every client
creates for itself before the run and again whenever it has spent them, in
one all-or-nothing /v1/utxo/spend; the parents' creation is outside the
latencies but, during the measured phase, inside its wall-clock time),
utxo-create (a new transaction with two outputs, one /v1/utxo/create). With
--embedded it starts throw-away single-node servers in a temporary
directory, with --spawn a cluster of server processes; both serve mutual
TLS with bundles of a CA made for the run. Against --server the bench
presents --bundle.

With --spawn N --peer etcd it also starts an etcd cluster of N members
(the etcd binary, --etcd-bin) on loopback next to raftlockd's, with data
on the same disk (utxo-spend and utxo-create are refused: etcd has no
UTXO records), runs every workload against both with etcd's Go client
expressing the same workload, alternating (raftlockd, etcd, raftlockd,
etcd, ... --rounds times), and prints one table with the ratio
(raftlockd/etcd) per row; --failover-rounds then alternates leader kills
on both.

With --blocks it measures blocks instead: one chain of blocks of two-input,
two-output transactions ("1000x100,10000x10": 100 blocks of 1,000
transactions, then 10 of 10,000) applied in order through
/v1/utxo/blocks/apply, the last --rollback-blocks of each size rolled back
one at a time and applied again, while the leader prunes spent
transactions (the servers keep them 10 blocks and prune every 100 ms).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd, &bf) },
	}
	f := cmd.Flags()
	f.StringVar(&bf.target, "server", "", fmt.Sprintf("server URL(s), comma-separated; clients are spread over them "+
		"(default https://%s with a bundle, http://%[1]s without; a URL without a scheme gets https:// with a bundle)", defaultAPIAddr))
	f.StringVar(&bf.bundlePath, "bundle", "", "with --server and --second-island: the bundle (PEM: certificate, key and CA) the bench "+
		"presents and checks the servers with (default: client.pem in $RAFTLOCKD_DATA_DIR/tls, else in the default data "+
		"directory, when it exists); xa-commit across islands asks the coordinator and the other island's status, "+
		"which takes a server bundle of the islands' CA")
	f.IntVar(&bf.spawn, "spawn", 0, "start this many server processes forming one cluster and measure them")
	f.StringVar(&bf.dir, "dir", "", "with --spawn: where the clusters' temporary data directory is made (default: the system's temporary directory)")
	f.DurationVar(&bf.raftTimeout, "raft-timeout", 200*time.Millisecond, "Raft heartbeat and election timeout of spawned servers")
	f.IntVar(&bf.failoverRounds, "failover-rounds", 0, "with --spawn 3 or more: kill the leader this many times and time the recovery (with --peer: of both)")
	f.BoolVar(&bf.embedded, "embedded", false, "start a temporary single-node server and measure it")
	f.IntVar(&bf.islands, "islands", 1, "with --embedded: start this many single-node islands (2: xa-commit puts its second key on the other island)")
	f.StringVar(&bf.second, "second-island", "", "server URL(s) of another island, comma-separated: xa-commit puts its second key there")
	f.StringVar(&bf.workloads, "workload", "lock,handoff", "comma-separated workloads: "+strings.Join(bench.Workloads, ", "))
	f.StringVar(&bf.clients, "clients", "1,64", "comma-separated client counts; one run per count")
	f.StringVar(&bf.runs, "runs", "", `rows to run instead of --workload x --clients: workload=clients[,clients...] separated by spaces, `+
		`e.g. "lock=1,64 queue=1,8" (with none of --runs, --workload and --clients: "`+defaultRuns+`")`)
	f.IntVar(&bf.rounds, "rounds", 1, "run every row this many times (alternating with the peer) and combine the runs")
	f.StringVar(&bf.peer, "peer", "", "with --spawn: also measure this system alongside (etcd)")
	f.StringVar(&bf.etcdBin, "etcd-bin", "etcd", "the etcd server binary of --peer etcd")
	f.DurationVar(&bf.etcd.Heartbeat, "etcd-heartbeat", 100*time.Millisecond, "--peer etcd: etcd's --heartbeat-interval")
	f.DurationVar(&bf.etcd.Election, "etcd-election-timeout", time.Second, "--peer etcd: etcd's --election-timeout")
	f.DurationVar(&bf.opts.Duration, "duration", 10*time.Second, "measured time per run")
	f.IntVar(&bf.opts.Ops, "ops", 0, "measure this many operations instead of a duration")
	f.DurationVar(&bf.opts.Warmup, "warmup", 2*time.Second, "unmeasured warm-up per run")
	f.IntVar(&bf.opts.Payload, "payload", 256, "bytes written per lock cycle")
	f.IntVar(&bf.opts.ParentOutputs, "utxo-parent-outputs", bench.DefaultParentOutputs,
		"utxo-spend: outputs of each parent transaction a client creates to spend")
	f.StringVar(&bf.blocks, "blocks", "", `measure block applies instead of workloads: TXSxBLOCKS[,...], e.g. "1000x100,10000x10"`)
	f.IntVar(&bf.rollbackBlocks, "rollback-blocks", 5, "with --blocks: blocks of each size rolled back (and applied again) to time rollbacks")
	f.StringVar(&bf.format, "format", "table", "table, json or markdown")
	f.StringVar(&bf.cpuProfile, "cpuprofile", "", "write a CPU profile of the bench process (with --embedded: client and server) to this file")
	f.StringVar(&bf.serverProfile, "server-profile", "", "with --spawn: for every raftlockd run, write a CPU profile of the leader "+
		"(<dir>/<workload>-<clients>.pprof) and what it reported of Raft (<workload>-<clients>.txt) to this directory; "+
		"the servers serve the profiler")
	f.StringVar(&bf.goalsOut, "goals-out", "", "with --peer etcd: write one line per missed goal (profile name, tab, goal) to this file")
	bindEnv(cmd, benchEnv)
	return cmd
}

// benchEnv is the prefix of the variables of `raftlockd bench`.
const benchEnv = "RAFTLOCKD_BENCH_"

// defaultRuns are the rows measured when none are asked for.
const defaultRuns = "lock=1,64 handoff=8"

// runBench is `raftlockd bench`.
func runBench(cmd *cobra.Command, bf *benchFlags) (err error) {
	// An interrupt (Ctrl-C) or SIGTERM ends the run through ctx, so that the
	// servers the bench started are stopped and their directories removed
	// on the way out; a second one ends the process at once.
	parent := cmd.Context()
	ctx, stop := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()
	defer func() {
		if err != nil && ctx.Err() != nil && parent.Err() == nil {
			err = fmt.Errorf("bench: interrupted (%w)", err)
		}
	}()
	var plan []bench.PlanRow
	if bf.runs == "" && !cmd.Flags().Changed("workload") && !cmd.Flags().Changed("clients") {
		// The issues' rows: a lock cycle alone and with many clients, and a
		// hand-off contended by eight.
		bf.runs = defaultRuns
	}
	if bf.runs != "" {
		var err error
		if plan, err = bench.ParsePlan(bf.runs); err != nil {
			return fmt.Errorf("--runs: %w", err)
		}
	} else {
		counts, err := bench.ParseCounts(bf.clients)
		if err != nil {
			return fmt.Errorf("--clients: %w", err)
		}
		var ws []string
		for _, w := range strings.Split(bf.workloads, ",") {
			w = strings.TrimSpace(w)
			if !slices.Contains(bench.Workloads, w) {
				return fmt.Errorf("--workload: unknown workload %q (want one of %s)", w, strings.Join(bench.Workloads, ", "))
			}
			ws = append(ws, w)
		}
		plan = bench.CrossPlan(ws, counts)
	}
	switch {
	case bf.spawn < 0:
		return fmt.Errorf("--spawn %d: want a number of servers to start (0: measure --server)", bf.spawn)
	case bf.opts.Ops < 0, bf.opts.Payload < 0, bf.opts.Warmup < 0, bf.failoverRounds < 0, bf.rollbackBlocks < 0:
		return fmt.Errorf("--ops, --payload, --warmup, --failover-rounds and --rollback-blocks cannot be negative")
	case bf.opts.Ops == 0 && bf.opts.Duration <= 0:
		return fmt.Errorf("--duration %v: want a positive time to measure (or --ops)", bf.opts.Duration)
	case bf.islands < 1:
		return fmt.Errorf("--islands: must be positive")
	case bf.format != "table" && bf.format != "json" && bf.format != "markdown":
		return fmt.Errorf("--format: want table, json or markdown")
	case bf.peer != "" && bf.peer != "etcd":
		return fmt.Errorf("--peer: only etcd is supported")
	case bf.peer != "" && bf.spawn == 0:
		return fmt.Errorf("--peer needs --spawn: both systems run as local clusters on the same disk")
	case bf.serverProfile != "" && bf.spawn == 0:
		return fmt.Errorf("--server-profile needs --spawn")
	case bf.rounds < 1:
		return fmt.Errorf("--rounds: must be positive")
	// Flags that would otherwise be ignored, or apply to what is not measured.
	case bf.spawn > 0 && bf.embedded:
		return fmt.Errorf("--spawn and --embedded: measure one or the other")
	case bf.failoverRounds > 0 && bf.spawn < 3:
		return fmt.Errorf("--failover-rounds needs --spawn 3 or more: killing the leader must leave a majority to elect another")
	case bf.islands > 1 && !bf.embedded:
		return fmt.Errorf("--islands needs --embedded (with other servers: --second-island)")
	case bf.goalsOut != "" && bf.peer == "":
		return fmt.Errorf("--goals-out needs --peer etcd: the goals compare raftlockd with etcd")
	case bf.blocks != "" && bf.peer != "":
		return fmt.Errorf("--blocks measures raftlockd alone: drop --peer")
	}
	if bf.peer == "etcd" {
		for _, r := range plan {
			if !bench.Supports(&bench.Etcd{}, r.Workload) {
				return fmt.Errorf("--peer etcd: etcd does not run %s; measure it without --peer", r.Workload)
			}
		}
	}
	var (
		cl       *bench.Cluster
		lease    *auth.Bundle // what the lease, state and queue requests present
		tcBundle *auth.Bundle // what transaction decisions present (default lease)
		hashes   []string     // the embedded islands' backend hashes
		dir      string
	)
	if bf.spawn > 0 {
		var err error
		if dir, err = os.MkdirTemp(bf.dir, "raftlockd-bench-"); err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		bin, err := os.Executable()
		if err != nil {
			return err
		}
		var extra []string
		if bf.serverProfile != "" {
			if err := os.MkdirAll(bf.serverProfile, 0o755); err != nil {
				return err
			}
			extra = append(extra, "--pprof")
		}
		if bf.blocks != "" {
			extra = append(extra, blockBenchFlags...)
		}
		if cl, err = bench.SpawnCluster(ctx, bin, dir, bf.spawn, bf.raftTimeout, extra...); err != nil {
			return err
		}
		defer cl.Stop()
		bf.target, lease = strings.Join(cl.Endpoints(), ","), cl.Client
	}
	if bf.embedded {
		is, stop, err := startEmbedded(ctx, bf.islands, bf.blocks != "")
		if err != nil {
			return err
		}
		defer stop()
		bf.target, lease, tcBundle = is.urls[0], is.client, is.tcclient
		hashes = is.hashes
		if len(is.urls) > 1 {
			bf.second = is.urls[1]
		}
	}
	if bf.spawn == 0 && !bf.embedded {
		var err error
		if lease, err = findBundle(bf.bundlePath, auth.ClientFile); err != nil {
			return err
		}
	}
	if bf.cpuProfile != "" {
		stop, err := startCPUProfile(bf.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	driver, err := raftlockdDriver(ctx, bf, lease, tcBundle, hashes)
	if err != nil {
		return err
	}
	if bf.blocks != "" {
		return runBlockBench(ctx, cmd, bf, driver.Clients[0])
	}
	systems := []bench.System{{Driver: driver}}
	if cl != nil {
		systems[0].Pids = cl.Pids
		systems[0].Failover = cl.FailoverRound
		if bf.serverProfile != "" {
			systems[0].Measure = profileMeter(cl, bf.serverProfile, cmd.ErrOrStderr())
		}
	}
	if bf.peer == "etcd" {
		ec, err := bench.SpawnEtcd(ctx, bf.etcdBin, dir, bf.spawn, bf.etcd)
		if err != nil {
			return err
		}
		defer ec.Stop()
		ed := &bench.Etcd{}
		for _, ep := range ec.Endpoints() {
			c, err := ec.Client(ep)
			if err != nil {
				return err
			}
			defer c.Close()
			ed.Clients = append(ed.Clients, c)
		}
		defer ed.Close()
		systems = append(systems, bench.System{Driver: ed, Pids: ec.Pids, Failover: ec.FailoverRound})
	}
	progress := func(st bench.Step, res bench.Result) {
		if bf.format != "json" {
			fmt.Fprintf(cmd.ErrOrStderr(), "done: round %d %s %s x%d %.0f ops/s\n", st.Round+1, res.System, res.Workload,
				res.Clients, res.OpsPerSec)
		}
	}
	cmp, err := bench.Compare(ctx, systems, plan, bf.rounds, bf.opts, progress)
	if err != nil {
		return err
	}
	for i := range cmp.Rows {
		if cmp.Rows[i].Workload == bench.XACommit {
			cmp.Rows[i].Label = fmt.Sprintf("%s/%di", bench.XACommit, 1+min(len(driver.Second), 1))
		}
	}
	if cl != nil && bf.failoverRounds > 0 {
		if cmp.Failovers, err = bench.CompareFailover(ctx, systems, bf.failoverRounds); err != nil {
			return err
		}
	}
	if err := writeBench(cmd.OutOrStdout(), bf, cmp); err != nil {
		return err
	}
	// Errors are figures; a run that completed nothing is a broken bench.
	var empty []string
	for _, r := range cmp.Rows {
		for _, rs := range r.Rounds {
			for _, res := range rs {
				if res.Ops == 0 {
					empty = append(empty, fmt.Sprintf("%s %s x%d (%s)", res.System, r.Name(), r.Clients, res.FirstErr))
				}
			}
		}
	}
	if len(empty) > 0 {
		return fmt.Errorf("bench: runs completed no operation: %s", strings.Join(empty, "; "))
	}
	return nil
}

// raftlockdDriver dials the raftlockd servers the flags name.
func raftlockdDriver(ctx context.Context, bf *benchFlags, lease, tcBundle *auth.Bundle, hashes []string) (*bench.Raftlockd, error) {
	dial := func(flag, list string, b *auth.Bundle) ([]*client.Client, error) {
		urls, err := serverURLs(flag, list, b != nil)
		if err != nil {
			return nil, err
		}
		var out []*client.Client
		for _, u := range urls {
			var opts []client.Option
			if b != nil {
				opts = append(opts, client.WithBundle(b))
			} else if strings.HasPrefix(u, "https://") {
				return nil, errNoBundle(u, "--bundle, RAFTLOCKD_BENCH_BUNDLE", auth.ClientFile)
			}
			c, err := client.New(u, opts...)
			if err != nil {
				return nil, err
			}
			out = append(out, c)
		}
		return out, nil
	}
	conns, err := dial("--server", bf.target, lease)
	if err != nil {
		return nil, err
	}
	driver := &bench.Raftlockd{Clients: conns}
	if tcBundle != nil {
		if driver.TC, err = dial("--server", bf.target, tcBundle); err != nil {
			return nil, err
		}
	}
	if bf.second != "" {
		if driver.Second, err = dial("--second-island", bf.second, lease); err != nil {
			return nil, err
		}
		if len(hashes) > 1 {
			driver.SecondHash = hashes[1]
		} else {
			st, err := driver.Second[0].ClusterStatus(ctx)
			if err != nil {
				return nil, fmt.Errorf("second island: %w", err)
			}
			driver.SecondHash = st.BackendHash
		}
	}
	return driver, nil
}

// profileMeter profiles the leader of cl over each measured phase into
// dir/<workload>-<clients>.pprof and writes what the leader reported of
// Raft, with the run's figures, to dir/<workload>-<clients>.txt.
func profileMeter(cl *bench.Cluster, dir string, log io.Writer) func(context.Context, bench.Options) func(*bench.Result) {
	return func(ctx context.Context, o bench.Options) func(*bench.Result) {
		leader := cl.Leader()
		if leader < 0 {
			fmt.Fprintln(log, "server profile: no leader to profile")
			return nil
		}
		name := filepath.Join(dir, fmt.Sprintf("%s-%d", o.Workload, o.Clients))
		before, berr := cl.Metrics(ctx, leader)
		profiled := make(chan error, 1)
		go func() { profiled <- cl.Profile(ctx, leader, o.Duration, name+".pprof") }()
		return func(res *bench.Result) {
			after, aerr := cl.Metrics(ctx, leader)
			if berr == nil && aerr == nil {
				res.Raft = bench.RaftStatsBetween(before, after, res.Ops)
			}
			if err := <-profiled; err != nil {
				fmt.Fprintf(log, "server profile: %v\n", err)
			}
			var b strings.Builder
			fmt.Fprintf(&b, "%s x%d: %.0f ops/s, p50 %s, p99 %s; CPU: servers %.2f cores, bench client %.2f cores (of %d)\n",
				o.Workload, o.Clients, res.OpsPerSec, res.P50.Round(10*time.Microsecond), res.P99.Round(10*time.Microsecond),
				res.ServerCPU, res.ClientCPU, runtime.NumCPU())
			if res.Raft != nil {
				fmt.Fprintf(&b, "leader %s: %s\n", cl.Nodes[leader].Name, res.Raft)
			}
			fmt.Fprintf(&b, "%s\n", bench.Explain(*res, runtime.NumCPU()))
			if err := os.WriteFile(name+".txt", []byte(b.String()), 0o644); err != nil {
				fmt.Fprintf(log, "server profile: %v\n", err)
			}
		}
	}
}

// writeBench prints the comparison as the flags ask.
func writeBench(w io.Writer, bf *benchFlags, cmp *bench.Comparison) error {
	if len(cmp.Systems) == 1 {
		var results []bench.Result
		for _, r := range cmp.Rows {
			res := r.Results[0]
			res.Workload = r.Name()
			results = append(results, res)
		}
		failovers := cmp.Failovers[cmp.Systems[0]]
		if bf.format == "json" {
			return bench.WriteJSON(w, bench.Report{Results: results, Failovers: failovers})
		}
		if err := bench.WriteTable(w, results); err != nil {
			return err
		}
		if len(failovers) > 0 {
			fmt.Fprintf(w, "\nfailover (leader SIGKILL -> first acknowledged write), %d rounds: %s\n",
				len(failovers), bench.Summarize(failovers))
		}
		return nil
	}
	goals := bench.Goals(cmp)
	if bf.goalsOut != "" {
		var b strings.Builder
		bench.WriteMissed(&b, goals)
		if err := os.WriteFile(bf.goalsOut, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	switch bf.format {
	case "json":
		return bench.WriteJSON(w, struct {
			*bench.Comparison
			Goals []bench.Goal `json:"goals"`
		}{cmp, goals})
	case "markdown":
		if err := bench.WriteComparisonMarkdown(w, cmp); err != nil {
			return err
		}
		fmt.Fprintln(w, "\n### Goals")
		fmt.Fprintln(w)
		bench.WriteGoalsMarkdown(w, goals)
		fmt.Fprintln(w, "\n### etcd: reference figures and this run")
		fmt.Fprintln(w)
		bench.WriteReferenceMarkdown(w, cmp)
		return nil
	}
	if err := bench.WriteComparison(w, cmp); err != nil {
		return err
	}
	fmt.Fprintln(w)
	bench.WriteGoalsTable(w, goals)
	return nil
}

// embeddedIslands are the single-node islands of --embedded and the
// bundles of their CA the bench presents.
type embeddedIslands struct {
	urls, hashes []string
	client       *auth.Bundle // a client certificate allowed every namespace
	tcclient     *auth.Bundle // a TC client certificate, for transaction decisions
}

// startEmbedded starts n single-node islands in temporary directories,
// with server bundles of one CA made for the run (so that they trust each
// other) and registered with each other.
func startEmbedded(ctx context.Context, n int, blocks bool) (is *embeddedIslands, stop func(), err error) {
	if n < 1 || n > 2 {
		return nil, nil, fmt.Errorf("--islands: want 1 or 2")
	}
	var srvs []*server.Server
	var dirs []string
	stop = func() {
		for _, s := range srvs {
			_ = s.Close(context.Background())
		}
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	}
	fail := func(err error) (*embeddedIslands, func(), error) {
		stop()
		return nil, nil, err
	}
	ca, err := auth.NewCA(auth.IssueOptions{Name: "raftlockd bench CA"})
	if err != nil {
		return nil, nil, err
	}
	is = &embeddedIslands{}
	if is.client, err = ca.Issue(auth.RoleClient, auth.IssueOptions{Name: "raftlockd bench",
		Perms: []auth.Perm{{Namespace: "*", Write: true}}}); err != nil {
		return nil, nil, err
	}
	if is.tcclient, err = ca.Issue(auth.RoleTCClient, auth.IssueOptions{Name: "raftlockd bench"}); err != nil {
		return nil, nil, err
	}
	operator, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: "raftlockd bench operator"})
	if err != nil {
		return nil, nil, err
	}
	for i := 0; i < n; i++ {
		dir, err := os.MkdirTemp("", "raftlockd-bench-")
		if err != nil {
			return fail(err)
		}
		dirs = append(dirs, dir)
		cfg := config.Default()
		cfg.DataDir, cfg.Listen, cfg.RaftListen, cfg.GossipListen = dir, "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
		if blocks {
			cfg.UTXORetentionBlocks, cfg.UTXORollbackWindow = blockBenchRetention, 2*blockBenchRetention
			cfg.UTXOPruneInterval, cfg.UTXOPruneBatch = blockBenchPruneInterval, blockBenchPruneBatch
		}
		srvBundle, err := ca.Issue(auth.RoleServer, auth.IssueOptions{Name: fmt.Sprintf("island %d", i+1),
			Hosts: []string{"127.0.0.1", "localhost"}})
		if err != nil {
			return fail(err)
		}
		cfg.Bundle = filepath.Join(dir, auth.ServerFile)
		if err := srvBundle.WriteFile(cfg.Bundle); err != nil {
			return fail(err)
		}
		srv, err := server.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			return fail(err)
		}
		srvs = append(srvs, srv)
		is.urls = append(is.urls, srv.URL())
	}
	for _, s := range srvs {
		for s.Node().BackendHash() == "" {
			if ctx.Err() != nil {
				return fail(ctx.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
		is.hashes = append(is.hashes, s.Node().BackendHash())
	}
	for _, at := range srvs {
		c, err := client.New(at.URL(), client.WithRetry(10*time.Second), client.WithBundle(operator))
		if err != nil {
			return fail(err)
		}
		for _, other := range srvs {
			if _, err := c.RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: other.Node().BackendHash(), Endpoint: other.URL()}, false); err != nil {
				return fail(fmt.Errorf("register islands: %w", err))
			}
		}
	}
	return is, stop, nil
}

// The servers of a blocks benchmark keep spent transactions a few blocks
// only, so that pruning runs while blocks are applied.
const (
	blockBenchRetention     = 10
	blockBenchPruneInterval = 100 * time.Millisecond
	blockBenchPruneBatch    = 5000
)

var blockBenchFlags = []string{
	fmt.Sprintf("--utxo-retention-blocks=%d", blockBenchRetention),
	fmt.Sprintf("--utxo-rollback-window=%d", 2*blockBenchRetention),
	fmt.Sprintf("--utxo-prune-interval=%s", blockBenchPruneInterval),
	fmt.Sprintf("--utxo-prune-batch=%d", blockBenchPruneBatch),
}

// runBlockBench is `raftlockd bench --blocks`.
func runBlockBench(ctx context.Context, cmd *cobra.Command, bf *benchFlags, c *client.Client) error {
	runs, err := bench.ParseBlockRuns(bf.blocks)
	if err != nil {
		return fmt.Errorf("--blocks: %w", err)
	}
	res, err := bench.RunBlocks(ctx, c, runs, bf.rollbackBlocks)
	if err != nil {
		return err
	}
	if bf.format == "json" {
		return bench.WriteJSON(cmd.OutOrStdout(), res)
	}
	return bench.WriteBlockTable(cmd.OutOrStdout(), res)
}
