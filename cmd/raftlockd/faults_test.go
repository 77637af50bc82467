package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/internal/workload"
)

// These tests run three `raftlockd server` processes on loopback that find
// each other by gossip and bootstrap one cluster, the way an operator
// starts them by hand (with server bundles of one CA: API, Raft and gossip
// run over TLS), and then break the leader for real: SIGKILL and restart,
// SIGSTOP and SIGCONT.

// faultSeedEnv repeats a run's random choices: set it to the seed the run
// logged.
const faultSeedEnv = "RAFTLOCKD_TEST_FAULT_SEED"

func faultSeed(t *testing.T) int64 {
	t.Helper()
	seed := time.Now().UnixNano()
	if s := os.Getenv(faultSeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", faultSeedEnv, s, err)
		}
	}
	t.Logf("seed %d (set %s=%d to repeat this run's choices)", seed, faultSeedEnv, seed)
	return seed
}

// procNode is one server process of a procCluster, with the data dir and
// flags it is restarted with.
type procNode struct {
	id, dir, api string
	args         []string
	proc         *serverProc
}

type procCluster struct {
	t     *testing.T
	nodes []*procNode
	tls   *tls.Config // a client bundle of the cluster's CA
}

// startProcCluster starts size servers that discover each other through
// --join and --bootstrap-expect, and waits until every one is ready.
func startProcCluster(t *testing.T, size int) *procCluster {
	t.Helper()
	c := &procCluster{t: t}
	var gossip []string
	for i := 0; i < size; i++ {
		n := &procNode{id: fmt.Sprintf("n%d", i+1), dir: t.TempDir(), api: testutil.FreeAddr(t)}
		g := testutil.FreeAddr(t)
		n.args = []string{"--node-id", n.id, "--data-dir", n.dir, "--listen", n.api, "--raft-listen", testutil.FreeAddr(t),
			"--gossip-listen", g, "--bootstrap-expect", strconv.Itoa(size), "--gossip-profile", "fast",
			"--raft-heartbeat-timeout", "200ms", "--raft-election-timeout", "200ms", "--leader-wait", "2s"}
		gossip = append(gossip, g)
		c.nodes = append(c.nodes, n)
	}
	var dirs []string
	for _, n := range c.nodes {
		n.args = append(n.args, "--join", strings.Join(gossip, ","))
		dirs = append(dirs, n.dir)
	}
	shareCA(t, dirs...)
	for i := range c.nodes {
		c.start(i)
	}
	for i := range c.nodes {
		c.waitReady(i, 30*time.Second)
	}
	c.tls = c.nodes[0].proc.clientTLS()
	return c
}

// context carries the cluster's client TLS configuration to the workload
// helpers.
func (c *procCluster) context() context.Context {
	return workload.WithTLS(context.Background(), c.tls)
}

// start (re)starts node i with its data dir and flags; it does not wait.
func (c *procCluster) start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	n.proc = spawnServer(c.t, n.api, n.args, nil)
}

// waitReady waits until node i's /readyz answers 200 from node i itself.
func (c *procCluster) waitReady(i int, timeout time.Duration) {
	c.t.Helper()
	n := c.nodes[i]
	n.proc.nodeID = n.id
	if err := n.proc.waitReady(n.dir, timeout); err != nil {
		c.t.Fatal(err)
	}
}

func (c *procCluster) url(i int) string { return c.nodes[i].proc.url }

func (c *procCluster) endpoints() []string {
	var out []string
	for i := range c.nodes {
		out = append(out, c.url(i))
	}
	return out
}

// others lists every node index but i.
func (c *procCluster) others(i int) []int {
	var out []int
	for j := range c.nodes {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

func (c *procCluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := syscall.Kill(c.nodes[i].proc.cmd.Process.Pid, sig); err != nil {
		c.t.Fatalf("%s %s: %v", sig, c.nodes[i].id, err)
	}
}

// converge waits until every node has applied the same log and checks
// that every acknowledged commit is present on each of them.
func (c *procCluster) converge(ctx context.Context, writers []*workload.Writer) {
	c.t.Helper()
	index, err := workload.WaitConverged(ctx, c.endpoints(), 30*time.Second)
	if err != nil {
		c.t.Fatal(err)
	}
	if err := workload.Verify(ctx, c.endpoints(), writers); err != nil {
		c.t.Fatalf("after the nodes converged at applied index %d: %v", index, err)
	}
	acked := 0
	for _, w := range writers {
		acked += len(w.Acked)
	}
	c.t.Logf("all %d nodes applied index %d and hold all %d acknowledged commits", len(c.nodes), index, acked)
}

func startLoad(t *testing.T, c *procCluster, seed int64, prefix string) *workload.Load {
	t.Helper()
	load, err := workload.Start(workload.Config{Endpoints: c.endpoints(), TLS: c.tls, Writers: 6, Seed: seed, Prefix: prefix,
		TTL: 2 * time.Second, Block: 10 * time.Second, Retry: time.Second, RequestTimeout: 4 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { load.Stop() })
	return load
}

func checkViolations(t *testing.T, load *workload.Load) {
	t.Helper()
	for _, v := range load.Violations() {
		t.Error(v)
	}
}

// TestFaultLeaderKilled SIGKILLs the leader while writers commit through
// all three nodes: the survivors elect a leader and serve every writer,
// the killed node restarted on its data dir rejoins by itself, and every
// acknowledged commit ends up on all three nodes.
func TestFaultLeaderKilled(t *testing.T) {
	t.Parallel()
	seed := faultSeed(t)
	rng := rand.New(rand.NewSource(seed))
	c := startProcCluster(t, 3)
	ctx := c.context()
	load := startLoad(t, c, seed, "kill")

	if err := load.WaitAcks(int64(20+rng.Intn(40)), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	leader, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	survivors := c.others(leader)
	before := load.Acks()
	killedAt := time.Now()
	c.nodes[leader].proc.kill()
	took, err := workload.ProbeWrite(ctx, c.url(survivors[rng.Intn(2)]), "kill-probe", killedAt, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("leader %s SIGKILLed after %d commits; first write acknowledged through a survivor %s later (under load)",
		c.nodes[leader].id, before, took.Round(time.Millisecond))
	if err := load.WaitServedSince(killedAt, 20*time.Second); err != nil {
		t.Fatalf("clients were not served by the survivors: %v", err)
	}
	served := time.Since(killedAt)
	if err := load.WaitAcks(before+40, 20*time.Second); err != nil {
		t.Fatalf("while %s was down: %v", c.nodes[leader].id, err)
	}
	newLeader, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second, leader)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("every writer served again within %s of the kill; %s leads; %d commits acknowledged while %s was down",
		served.Round(time.Millisecond), c.nodes[newLeader].id, load.Acks()-before, c.nodes[leader].id)

	// Restarted with the same data dir and flags, the node rejoins without
	// operator action and serves (forwarded) writes.
	c.start(leader)
	c.waitReady(leader, 30*time.Second)
	if _, err := workload.ProbeWrite(ctx, c.url(leader), "rejoined", time.Now(), 15*time.Second); err != nil {
		t.Fatalf("restarted node: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+20, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	writers := load.Stop()
	t.Log(workload.Summary(writers))
	checkViolations(t, load)
	c.converge(ctx, writers)
}

// TestFaultLeaderPaused SIGSTOPs the leader: the others elect a new leader
// and writes continue; after SIGCONT the old leader steps down, catches up
// and serves again.
func TestFaultLeaderPaused(t *testing.T) {
	t.Parallel()
	seed := faultSeed(t)
	rng := rand.New(rand.NewSource(seed))
	c := startProcCluster(t, 3)
	ctx := c.context()
	load := startLoad(t, c, seed, "pause")

	if err := load.WaitAcks(int64(20+rng.Intn(40)), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	old, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	pausedAt := time.Now()
	c.signal(old, syscall.SIGSTOP)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			_ = syscall.Kill(c.nodes[old].proc.cmd.Process.Pid, syscall.SIGCONT)
		}
	})
	// Writes through a follower are forwarded to the paused leader until the
	// follower learns of the new one: they must not wait for the paused
	// process, whose connections stay open, beyond that.
	took, err := workload.ProbeWrite(ctx, c.url(c.others(old)[rng.Intn(2)]), "pause-probe", pausedAt, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	newLeader, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second, old)
	if err != nil {
		t.Fatal(err)
	}
	elected := time.Since(pausedAt)
	if err := load.WaitServedSince(pausedAt, 20*time.Second); err != nil {
		t.Fatalf("writes did not continue while the old leader was paused: %v", err)
	}
	t.Logf("leader %s SIGSTOPped: first write through a follower acknowledged after %s, %s seen leading after %s, every writer served after %s",
		c.nodes[old].id, took.Round(time.Millisecond), c.nodes[newLeader].id, elected.Round(time.Millisecond),
		time.Since(pausedAt).Round(time.Millisecond))
	if took > 3*time.Second {
		t.Errorf("the first write after the leader paused took %s: forwarded requests waited for the paused leader", took)
	}
	if c.nodes[old].proc.exited() {
		t.Fatalf("the paused node exited: %v", c.nodes[old].proc.waitErr)
	}

	resumedAt := time.Now()
	c.signal(old, syscall.SIGCONT)
	resumed = true
	// The old leader learns of the newer term and steps down; the cluster
	// keeps exactly one leader.
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, err := workload.Metrics(ctx, c.url(old))
		leaders, terms := workload.Leaders(ctx, c.endpoints())
		if err == nil && m["raftlockd_raft_is_leader"] == 0 && len(leaders) == 1 && leaders[0] != old &&
			m["raftlockd_raft_term"] >= terms[0] {
			t.Logf("after SIGCONT %s stepped down within %s (term %.0f, leader %s)", c.nodes[old].id,
				time.Since(resumedAt).Round(time.Millisecond), m["raftlockd_raft_term"], c.nodes[leaders[0]].id)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("old leader did not step down within 10s of SIGCONT: metrics err %v, is_leader %v, leaders %v",
				err, m["raftlockd_raft_is_leader"], leaders)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.waitReady(old, 10*time.Second)
	if _, err := workload.ProbeWrite(ctx, c.url(old), "resumed", time.Now(), 15*time.Second); err != nil {
		t.Fatalf("resumed node: %v", err)
	}
	if err := load.WaitAcks(load.Acks()+20, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	writers := load.Stop()
	t.Log(workload.Summary(writers))
	checkViolations(t, load)
	c.converge(ctx, writers)
}

// TestFaultFailoverTime measures, over a few rounds without other load,
// how long after the leader is SIGKILLed a write through a surviving node
// is acknowledged again; the killed node is restarted between rounds.
func TestFaultFailoverTime(t *testing.T) {
	const rounds = 3
	c := startProcCluster(t, 3)
	ctx := c.context()
	var times []time.Duration
	for r := 0; r < rounds; r++ {
		leader, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		survivor := c.url(c.others(leader)[r%2])
		// A warm connection and a known-good path before the kill.
		if _, err := workload.ProbeWrite(ctx, survivor, fmt.Sprintf("warm-%d", r), time.Now(), 10*time.Second); err != nil {
			t.Fatal(err)
		}
		killedAt := time.Now()
		c.nodes[leader].proc.kill()
		took, err := workload.ProbeWrite(ctx, survivor, fmt.Sprintf("failover-%d", r), killedAt, 15*time.Second)
		if err != nil {
			t.Fatalf("round %d: %v", r+1, err)
		}
		times = append(times, took)
		t.Logf("round %d: leader %s SIGKILLed, first write acknowledged through a survivor after %s", r+1,
			c.nodes[leader].id, took.Round(time.Millisecond))
		c.start(leader)
		c.waitReady(leader, 30*time.Second)
		if _, err := workload.WaitConverged(ctx, c.endpoints(), 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(times)
	t.Logf("failover (leader SIGKILL -> first acknowledged write, 200ms raft timeouts): median %s, max %s over %d rounds",
		times[len(times)/2].Round(time.Millisecond), times[len(times)-1].Round(time.Millisecond), rounds)
	// Raft needs about an election timeout or two; far more means requests
	// waited on something they should not.
	if worst := times[len(times)-1]; worst > 5*time.Second {
		t.Errorf("failover took %s", worst)
	}
}

// TestGracefulStopHandsLeadershipOver: a leader stopped with SIGTERM hands
// leadership to another voter before it exits, so the survivors have a
// leader when it is gone instead of waiting for an election timeout, and
// writes through them go on.
func TestGracefulStopHandsLeadershipOver(t *testing.T) {
	t.Parallel()
	c := startProcCluster(t, 3)
	ctx := c.context()
	leader, err := workload.WaitLeader(ctx, c.endpoints(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	survivor := c.url(c.others(leader)[0])
	stoppedAt := time.Now()
	c.signal(leader, syscall.SIGTERM)
	select {
	case <-c.nodes[leader].proc.done:
	case <-time.After(15 * time.Second):
		t.Fatalf("%s did not exit within 15s of SIGTERM", c.nodes[leader].id)
	}
	exited := time.Since(stoppedAt)
	if out := c.nodes[leader].proc.log.String(); !strings.Contains(out, "handed leadership over before stopping") {
		t.Fatalf("%s did not hand leadership over; output:\n%s", c.nodes[leader].id, out)
	}
	took, err := workload.ProbeWrite(ctx, survivor, "after-handoff", stoppedAt, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s exited %s after SIGTERM; first write through a survivor acknowledged %s after it",
		c.nodes[leader].id, exited.Round(time.Millisecond), took.Round(time.Millisecond))
}

// A second process started under a running server's id (the same
// --node-id, its certificates copied, on addresses of its own) stops with
// exit status 70, naming the server that runs; the cluster keeps serving
// from the one that ran first.
func TestASecondServerUnderOneIDStops(t *testing.T) {
	c := startProcCluster(t, 3)
	first := c.nodes[0]
	dir, api := t.TempDir(), testutil.FreeAddr(t)
	if err := os.CopyFS(dir, os.DirFS(first.dir+"/tls")); err != nil {
		t.Fatal(err)
	}
	var args []string
	for i := 0; i < len(first.args); i += 2 {
		flag, val := first.args[i], first.args[i+1]
		switch flag {
		case "--data-dir":
			val = dir
		case "--listen":
			val = api
		case "--raft-listen", "--gossip-listen":
			val = testutil.FreeAddr(t)
		}
		args = append(args, flag, val)
	}
	args = append(args, "--bundle", dir+"/server.pem")
	twin := spawnServer(t, api, args, nil)
	select {
	case <-twin.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("a second server under %s kept running", first.id)
	}
	var exit *exec.ExitError
	if !errors.As(twin.waitErr, &exit) || exit.ExitCode() != 70 ||
		!strings.Contains(twin.log.String(), "another server already runs under this node's id "+first.id) {
		t.Fatalf("the second server under %s ended with %v:\n%s", first.id, twin.waitErr, twin.log.String())
	}
	if first.proc.exited() {
		t.Fatalf("%s, which ran first, stopped:\n%s", first.id, first.proc.log.String())
	}
	c.waitReady(0, 10*time.Second)
}

// A second SIGTERM (or Ctrl-C) stops a server that is still shutting down
// at once, as a crash would, instead of being ignored until the shutdown
// ends: here a client that sent half a request holds the shutdown for its
// ten seconds. Restarted, the server serves what it held.
func TestASecondSignalStopsAShutdownAtOnce(t *testing.T) {
	t.Parallel()
	dir, listen := t.TempDir(), testutil.FreeAddr(t)
	args := append(serverFlags(dir, listen, testutil.FreeAddr(t)), "--disable-mtls")
	srv := startServer(t, dir, listen, args, nil)
	mustCLI(t, srv.clientEnv(), "", "client", "acquire", "--key", "kept", "--ttl", "10m")
	half, err := net.Dial("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	defer half.Close()
	// The server asks for the body (100 Continue) once its handler reads
	// it: the request has begun before the shutdown does, on a busy
	// machine too (a connection not yet accepted, or not yet read, would
	// be closed at once by the shutdown).
	if _, err := io.WriteString(half, "POST /v1/acquire HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_ = half.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(half).ReadString('\n')
	if err != nil || !strings.Contains(line, " 100 ") {
		t.Fatalf("the server did not ask for the body: %q %v", line, err)
	}
	if _, err := io.WriteString(half, "{"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(srv.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the server to begin shutting down", func() bool {
		return strings.Contains(srv.log.String(), "shutting down")
	})
	second := time.Now()
	if err := syscall.Kill(srv.cmd.Process.Pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("the server still runs 5s after a second SIGTERM; output:\n%s", srv.log.String())
	}
	t.Logf("stopped %s after the second SIGTERM (%v)", time.Since(second).Round(time.Millisecond), srv.waitErr)
	srv = startServer(t, dir, listen, args, nil)
	if d := describe(t, srv.clientEnv(), "kept"); d.LeaseID == "" {
		t.Fatalf("after the restart the key is not held: %+v", d)
	}
}
