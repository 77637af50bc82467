package testcluster

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// TestMain fails the package when goroutines outlive its tests. memberlist's
// last probe of a crashed or frozen peer outlives its Shutdown by up to its
// probe timeout, which grows (up to eightfold) while the node's view of its
// peers is poor, so goroutines get a few seconds to end by themselves.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(5 * time.Second); err != nil && time.Now().Before(deadline); err = goleak.Find() {
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func acquire(t *testing.T, c *client.Client, key string, ttl int64) *client.Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: key, Owner: "t", TTLSeconds: ttl, BlockSecs: -1})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return l
}

func commit(t *testing.T, l *client.Lease, doc string) {
	t.Helper()
	ctx := context.Background()
	if _, err := l.Update(ctx, []byte(doc), client.Conditions{}); err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx, false); err != nil {
		t.Fatal(err)
	}
}

func others(c *Cluster, except ...int) []int {
	var out []int
	for _, i := range c.Running() {
		skip := false
		for _, e := range except {
			skip = skip || i == e
		}
		if !skip {
			out = append(out, i)
		}
	}
	return out
}

// Any node serves any request: writes reaching followers are forwarded and
// reads on followers see every acknowledged write.
func TestAnyNodeServesAnyRequest(t *testing.T) {
	c := Start(t, 3)
	ctx := context.Background()
	for i := range c.Nodes {
		l := acquire(t, c.Client(i), "k", 30)
		commit(t, l, `{"by":"`+c.Nodes[i].Name+`"}`)
		for j := range c.Nodes {
			d, err := c.Client(j).GetPublic(ctx, "", "k")
			if err != nil || string(d.Body) != `{"by":"`+c.Nodes[i].Name+`"}` {
				t.Fatalf("read on %s after write on %s: %q %v", c.Nodes[j].Name, c.Nodes[i].Name, d.Body, err)
			}
		}
	}
	c.WaitConverged(10 * time.Second)
}

// A minority accepts no writes, the majority keeps serving, and after the
// partition heals every node holds identical state.
func TestMinorityPartitionAcceptsNoWrites(t *testing.T) {
	c := Start(t, 3)
	old := c.Leader()
	majority := others(c, old)
	c.Partition([]int{old}, majority)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Client(old).Acquire(ctx, wire.AcquireRequest{Key: "minority", Owner: "t", BlockSecs: -1})
	var e *client.Error
	if !errors.As(err, &e) || e.Status != 503 || e.Envelope.RetryAfter == 0 {
		t.Fatalf("write on the minority side: %v", err)
	}
	for _, i := range majority {
		commit(t, acquire(t, c.RetryingClient(i), "majority-"+c.Nodes[i].Name, 30), `{"ok":true}`)
	}
	c.Heal()
	c.WaitConverged(15 * time.Second)
	d, err := c.Client(old).GetPublic(context.Background(), "", "minority")
	if err != nil || d.Exists {
		t.Fatalf("minority write became visible: %+v %v", d, err)
	}
	for _, i := range majority {
		if d, err := c.Client(old).GetPublic(context.Background(), "", "majority-"+c.Nodes[i].Name); err != nil || !d.Exists {
			t.Fatalf("majority write missing on the healed node: %+v %v", d, err)
		}
	}
}

// Leadership changes are invisible to lease users: a queued acquirer on a
// surviving node is served by the new leader, remaining TTLs are kept and
// fencing tokens keep growing.
func TestFailoverKeepsLeasesQueuesAndTokens(t *testing.T) {
	c := Start(t, 3)
	leader := c.Leader()
	rest := others(c, leader)
	waiterNode, other := rest[0], rest[1]
	ctx := context.Background()

	held := acquire(t, c.Client(other), "queued", 60)
	short := acquire(t, c.Client(other), "short", 3)
	got := make(chan *client.Lease, 1)
	go func() {
		l, err := c.Client(waiterNode).Acquire(ctx, wire.AcquireRequest{Key: "queued", Owner: "w", TTLSeconds: 30, BlockSecs: 30})
		if err != nil {
			t.Errorf("queued acquire: %v", err)
		}
		got <- l
	}()
	waitQueued(t, c.Client(other), "queued", 1)

	c.Stop(leader)
	c.WaitLeader(10 * time.Second)
	if _, err := c.RetryingClient(other).Release(ctx, held.Ref(), false); err != nil {
		t.Fatalf("release after failover: %v", err)
	}
	select {
	case l := <-got:
		if l == nil || l.FencingToken != held.FencingToken+1 {
			t.Fatalf("queued acquirer got %+v", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("queued acquirer was not served after failover")
	}
	// The short lease keeps its deadline across the failover.
	d, err := c.RetryingClient(other).Describe(ctx, "", "short")
	if err != nil || d.ExpiresAt != short.ExpiresAt {
		t.Fatalf("short lease after failover: %+v %v (want expiry %d)", d, err, short.ExpiresAt)
	}
	deadline := time.Unix(short.ExpiresAt, 0)
	waitFor(t, 10*time.Second, "the short lease to expire", func() bool {
		d, err := c.Client(other).Describe(ctx, "", "short")
		return err == nil && d.LeaseID == ""
	})
	if late := time.Since(deadline); late > 2*time.Second {
		t.Fatalf("lease expired %s after its deadline", late)
	}
	next := acquire(t, c.Client(waiterNode), "short", 30)
	if next.FencingToken != short.FencingToken+1 {
		t.Fatalf("token after failover %d, want %d", next.FencingToken, short.FencingToken+1)
	}
	c.Start(leader)
	c.WaitConverged(15 * time.Second)
}

func waitQueued(t *testing.T, c *client.Client, key string, n int64) {
	t.Helper()
	waitFor(t, 5*time.Second, "the acquire to queue", func() bool {
		d, err := c.Describe(context.Background(), "", key)
		return err == nil && d.Waiters == n
	})
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var _ = errcode.NoLeader

// A frozen (paused) leader is replaced, and nothing it holds or is sent
// while paused comes back stale once it resumes: requests sent to it hang
// until the thaw, a proposal it took in its old term is never
// acknowledged while it cannot reach a quorum, a write it answers after the
// thaw is committed, and every read started after the new leader's write
// was acknowledged sees that write.
func TestFrozenLeaderIsReplacedAndServesNothingStale(t *testing.T) {
	c := Start(t, 3)
	old := c.Leader()
	node := c.Nodes[old].Server.Node()
	commit(t, acquire(t, c.Client(old), "k", 30), `{"v":1}`)
	oldTerm := node.Status().Term

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type outcome struct {
		doc   string
		lease *client.Lease
		err   error
	}
	c.Freeze(old)
	// A write inside the paused leader (as if in a handler when it was
	// paused) and one sent to it over HTTP.
	proposed := make(chan outcome, 1)
	go func() {
		_, err := node.Propose(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}})
		proposed <- outcome{err: err}
	}()
	written := make(chan outcome, 1)
	go func() {
		l, err := c.Client(old).Acquire(ctx, wire.AcquireRequest{Key: "w", Owner: "t", TTLSeconds: 60, BlockSecs: -1})
		written <- outcome{lease: l, err: err}
	}()

	var leader int
	waitFor(t, 10*time.Second, "a new leader", func() bool {
		leader = -1
		for _, i := range others(c, old) {
			if n := c.Nodes[i].Server.Node(); n.IsLeader() && n.Status().Term > oldTerm {
				leader = i
			}
		}
		return leader >= 0
	})
	commit(t, acquire(t, c.RetryingClient(leader), "k", 30), `{"v":2}`)

	// Reads started after {"v":2} was acknowledged: over HTTP, and inside
	// the paused node.
	httpRead := make(chan outcome, 1)
	go func() {
		d, err := c.Client(old).GetPublic(ctx, "", "k")
		var doc string
		if err == nil {
			doc = string(d.Body)
		}
		httpRead <- outcome{doc: doc, err: err}
	}()
	nodeRead := make(chan outcome, 1)
	go func() {
		var doc string
		err := node.Read(ctx, func(v *fsm.View) error {
			doc = string(v.PublicDoc(wire.DefaultNamespace, "k").Bytes)
			return nil
		})
		nodeRead <- outcome{doc: doc, err: err}
	}()

	select {
	case o := <-written:
		t.Fatalf("a request to the frozen leader was answered while it was frozen: %+v", o)
	default:
	}
	select {
	case o := <-proposed:
		if o.err == nil {
			t.Fatal("the frozen leader acknowledged a proposal without a quorum")
		}
		proposed <- o
	default:
	}
	c.Thaw(old)

	wait := func(ch chan outcome, what string) outcome {
		t.Helper()
		select {
		case o := <-ch:
			return o
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: no answer 20s after the thaw", what)
			return outcome{}
		}
	}
	for what, ch := range map[string]chan outcome{"HTTP read": httpRead, "read inside the old leader": nodeRead} {
		if o := wait(ch, what); o.err == nil && o.doc != `{"v":2}` {
			t.Fatalf("%s after the thaw returned %s, want the acknowledged {\"v\":2}", what, o.doc)
		} else {
			t.Logf("%s after the thaw: %q %v", what, o.doc, o.err)
		}
	}
	if o := wait(written, "write sent while frozen"); o.err == nil {
		d, err := c.RetryingClient(leader).Describe(context.Background(), "", "w")
		if err != nil || d.LeaseID != o.lease.LeaseID {
			t.Fatalf("acknowledged acquire %s is not in the cluster: %+v %v", o.lease.LeaseID, d, err)
		}
	} else {
		t.Logf("write sent while frozen: %v", o.err)
	}
	if o := wait(proposed, "proposal inside the old leader"); o.err != nil {
		t.Logf("proposal inside the old leader: %v", o.err)
	}
	waitFor(t, 10*time.Second, "the old leader to learn the new term", func() bool {
		return node.Status().Term > oldTerm
	})
	c.WaitConverged(15 * time.Second)
}

// A leader cut off from its peers is replaced before it has taken in that it
// no longer leads (here its leadership goroutine is held up by a watcher).
// A read it serves meanwhile confirms its leadership with a quorum first, so
// it fails rather than return the state from before the new leader's write.
func TestCutOffLeaderServesNoStaleReadBeforeItNoticesItsLoss(t *testing.T) {
	c := Start(t, 3)
	old := c.Leader()
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // before the cluster stops
	for _, i := range others(c, old) {
		c.Nodes[i].Server.Node().OnLeadership(func(isLeader bool) {
			if isLeader {
				<-release
			}
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !c.Nodes[old].Server.Node().HandOff(ctx) {
		t.Fatal("leadership was not handed over")
	}
	cut := -1
	waitFor(t, 10*time.Second, "a follower to take leadership over", func() bool {
		for _, i := range others(c, old) {
			if c.Nodes[i].Server.Node().IsLeader() {
				cut = i
			}
		}
		return cut >= 0
	})
	node := c.Nodes[cut].Server.Node()
	commit(t, acquire(t, c.Client(cut), "k", 30), `{"v":1}`)
	term := node.Status().Term

	c.Fabric.Isolate(c.Nodes[cut].Name)
	leader := -1
	waitFor(t, 10*time.Second, "a leader among the others", func() bool {
		for _, i := range others(c, cut) {
			if n := c.Nodes[i].Server.Node(); n.IsLeader() && n.Status().Term > term {
				leader = i
			}
		}
		return leader >= 0
	})
	commit(t, acquire(t, c.RetryingClient(leader), "k", 30), `{"v":2}`)
	if !node.IsLeader() {
		t.Fatal("the cut-off node already noticed that it no longer leads")
	}
	var doc string
	err := node.Read(ctx, func(v *fsm.View) error {
		doc = string(v.PublicDoc(wire.DefaultNamespace, "k").Bytes)
		return nil
	})
	if err == nil {
		t.Fatalf("the cut-off node served a read (%s) after another leader acknowledged {\"v\":2}", doc)
	}
	t.Logf("read on the cut-off node: %v", err)
	c.Heal()
}

// A crash is abrupt where Stop is graceful: a request waiting on the
// crashed leader gets no answer at all (Stop answers it with a retryable
// error), the survivors elect a leader, and the node restarts from its
// data directory, keeping its state file after a crash and rebuilding it
// from the Raft snapshot and log after a power loss.
func TestCrashedNodesRestartFromTheirDataDirs(t *testing.T) {
	c := Start(t, 3)
	old := c.Leader()
	rest := others(c, old)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := acquire(t, c.Client(rest[0]), "q", 60)
	waited := make(chan error, 1)
	go func() {
		_, err := c.Client(old).Acquire(ctx, wire.AcquireRequest{Key: "q", Owner: "w", TTLSeconds: 30, BlockSecs: 30})
		waited <- err
	}()
	waitQueued(t, c.Client(rest[0]), "q", 1)

	c.Crash(old)
	select {
	case err := <-waited:
		var ce *client.Error
		if err == nil || errors.As(err, &ce) {
			t.Fatalf("a request in flight on the crashed node got an answer: %v", err)
		}
		t.Logf("request in flight on the crashed node: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("a request in flight on the crashed node still waits")
	}
	c.WaitLeader(10 * time.Second)
	if _, err := c.RetryingClient(rest[0]).Release(ctx, held.Ref(), false); err != nil {
		t.Fatal(err)
	}
	commit(t, acquire(t, c.RetryingClient(rest[1]), "k", 30), `{"after":"crash"}`)
	c.PowerOff(rest[1])
	c.Start(old)
	if !c.Nodes[old].Server.Node().FSM().Trusted() {
		t.Error("the state file was not kept after a crash")
	}
	c.Start(rest[1])
	if c.Nodes[rest[1]].Server.Node().FSM().Trusted() {
		t.Error("the state file was kept after a power loss")
	}
	c.WaitConverged(20 * time.Second)
	for i := range c.Nodes {
		if d, err := c.RetryingClient(i).GetPublic(ctx, "", "k"); err != nil || string(d.Body) != `{"after":"crash"}` {
			t.Fatalf("%s after the restarts: %+v %v", c.Nodes[i].Name, d, err)
		}
	}
}

// Gossip goes through the fabric: the majority of a frozen node sees it
// fail (no TCP fallback ping or push/pull reaches it around the fault).
func TestGossipSeesFrozenNodeFail(t *testing.T) {
	c := Start(t, 3)
	frozen := others(c, c.Leader())[0]
	watcher := others(c, frozen)[0]
	c.Freeze(frozen)
	waitFor(t, 15*time.Second, "gossip to see the frozen node fail", func() bool {
		for _, m := range c.Nodes[watcher].Server.Node().Members() {
			if m.ID == c.Nodes[frozen].Name {
				return m.Status == "dead"
			}
		}
		return false
	})
	c.Thaw(frozen)
}

// A server that crashed and comes back withdraws the requests that were
// waiting on it, for a key and for a message: their clients are gone, and
// the next grant goes to a request still waiting instead.
func TestARestartedServerWithdrawsTheRequestsItsCrashLeftWaiting(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	f := others(c, leader)[0]
	ctx := context.Background()
	holder := acquire(t, c.Client(leader), "k", 60)
	go func() {
		_, _ = c.Client(f).Acquire(ctx, wire.AcquireRequest{Key: "k", Owner: "ghost", TTLSeconds: 60, BlockSecs: 30})
	}()
	go func() {
		_, _ = c.Client(f).Dequeue(ctx, wire.DequeueRequest{Queue: "q", Owner: "ghost", WaitSeconds: 30})
	}()
	waiting := func(acquirers, consumers int) func() bool {
		return func() bool {
			d, err := c.Client(leader).Describe(ctx, "", "k")
			st, serr := c.Client(leader).QueueStats(ctx, "", "q", false)
			return err == nil && serr == nil && d.Waiters == int64(acquirers) && st.WaitingConsumers == consumers
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the requests to wait on "+c.Nodes[f].Name, waiting(1, 1))
	c.Crash(f)
	c.Start(f)
	testutil.WaitFor(t, 20*time.Second, "the restarted server to withdraw them", waiting(0, 0))
	if err := holder.Release(ctx, false); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Client(leader).Describe(ctx, "", "k"); err != nil || d.LeaseID != "" {
		t.Fatalf("the key after the release: %+v %v", d, err)
	}
}

// A rolling restart that moves on once the restarted server is ready
// (/readyz: it knows a leader and has caught up) keeps a quorum: the
// restarted server gets what it missed at once, so when the next server
// stops, a write needs it and gets it. (Raft's own backoff would have left
// it without entries for seconds after an absence of a few.)
func TestARollingRestartGatedOnReadinessKeepsAQuorum(t *testing.T) {
	c := Start(t, 3)
	leader := c.WaitLeader(10 * time.Second)
	first, next := others(c, leader)[0], others(c, leader)[1]
	c.Stop(first)
	commit(t, acquire(t, c.Client(leader), "while-away", 30), `{"n":1}`)
	time.Sleep(6 * time.Second) // the absence: raft's wait between attempts grows past two seconds
	c.Start(first)
	probe := c.HTTPClient("probe")
	testutil.WaitFor(t, 10*time.Second, c.Nodes[first].Name+" to be ready", func() bool {
		resp, err := probe.Get(c.URL(first) + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	c.Stop(next)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	l, err := c.Client(leader).Acquire(ctx, wire.AcquireRequest{Key: "after", Owner: "t", TTLSeconds: 30, BlockSecs: -1})
	if err != nil {
		t.Fatalf("a write with %s back and %s stopped: %v after %v", c.Nodes[first].Name, c.Nodes[next].Name, err,
			time.Since(start).Round(time.Millisecond))
	}
	t.Logf("a write with %s back and %s stopped took %v", c.Nodes[first].Name, c.Nodes[next].Name,
		time.Since(start).Round(time.Millisecond))
	commit(t, l, `{"n":2}`)
	c.Start(next)
	c.WaitConverged(20 * time.Second)
}
