package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
	autopilot "github.com/hashicorp/raft-autopilot"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/sweeper"
)

// blackhole is a cluster port that never answers an RPC: it holds every
// RPC connection open and silent (a paused process), and closes Raft
// connections at once so that replication to it fails fast.
type blackhole struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	rpcs  chan struct{} // one value per RPC connection accepted
	wg    sync.WaitGroup
}

func newBlackhole(t *testing.T) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// It holds a certificate of the cluster's CA: the nodes get through
	// the handshake and send their requests, which go unanswered.
	ln = tls.NewListener(ln, peerTLS().PeerServerConfig())
	b := &blackhole{ln: ln, rpcs: make(chan struct{}, 1024)}
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.wg.Add(1)
			go func() {
				defer b.wg.Done()
				var proto [1]byte
				if _, err := c.Read(proto[:]); err != nil || proto[0] != protoRPC {
					c.Close()
					return
				}
				b.mu.Lock()
				b.conns = append(b.conns, c)
				b.mu.Unlock()
				b.rpcs <- struct{}{}
			}()
		}
	}()
	t.Cleanup(b.close)
	return b
}

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) close() {
	b.ln.Close()
	b.wg.Wait()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		c.Close()
	}
}

// A watcher that is slow to return (which the contract forbids, but a slow
// one must not stall the node) holds up neither the new leader's term nor
// requests waiting for a leader.
func TestSlowLeadershipWatcherDoesNotHoldUpRequests(t *testing.T) {
	var nodes []*Node
	release := make(chan struct{})
	called := make(chan string, 16)
	for i := 0; i < 3; i++ {
		cfg := testConfig(t.TempDir(), "boot-a")
		cfg.NodeID = "n" + strconv.Itoa(i+1)
		cfg.Bootstrap = false
		n := openNode(t, cfg)
		n.OnLeadership(func(isLeader bool) {
			if isLeader {
				called <- n.ID()
				<-release
			}
		})
		nodes = append(nodes, n)
	}
	t.Cleanup(func() { close(release) }) // runs before the nodes close
	bootstrapAll(t, nodes)
	var leaderID string
	select {
	case leaderID = <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("no leader told its watchers")
	}
	var leader *Node
	for _, n := range nodes {
		if n.ID() == leaderID {
			leader = n
		}
	}
	// The leader's watcher is still blocked: writes and reads go through,
	// on the leader and through a follower.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		for i, n := range []*Node{leader, followers(nodes, leader)[0]} {
			key := "during-" + strconv.Itoa(i)
			if _, err := n.Propose(ctx, &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: key,
				Owner: "o", TxnID: "t-" + key, LeaseID: "l-" + key, RequestID: "r-" + key, TTL: 60_000}}); err != nil {
				result <- fmt.Errorf("write on %s: %w", n.ID(), err)
				return
			}
			var ok bool
			if err := n.Read(ctx, func(v *fsm.View) error { _, ok = v.Key("default", key); return nil }); err != nil || !ok {
				result <- fmt.Errorf("read on %s: %v (found %v)", n.ID(), err, ok)
				return
			}
		}
		result <- nil
	}()
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("while a watcher blocks: %v", err)
		}
	case <-ctx.Done():
		// The requests are stuck behind the watcher (not on ctx): they end
		// once the cleanup releases it.
		t.Fatal("requests did not complete while a leadership watcher blocked")
	}
}

// A new leader starts its sweeper and serves reads at once, while
// autopilot's first pass is still waiting for a server that gossip sees
// alive but that does not answer (a paused or cut-off old leader).
func TestNewLeaderServesWhileAStalePeerLooksAlive(t *testing.T) {
	ghost := newBlackhole(t)
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	sweepers := map[*Node]*sweeper.Sweeper{}
	for _, cfg := range cfgs {
		// Autopilot's first pass waits for the fetch of every alive
		// server's progress for up to a second.
		cfg.Gossip.PilotInterval = 4 * time.Second
		n := openNode(t, cfg)
		sw := sweeper.New(n, n.FSM(), n, sweeper.Config{TxnRetention: time.Minute})
		n.OnLeadership(sw.SetLeader) // after gossip's watcher, as the server does
		t.Cleanup(sw.Stop)
		nodes = append(nodes, n)
		sweepers[n] = sw
	}
	old := leaderWithin(t, nodes)
	// Autopilot's start gives up on the silent server after a second; the
	// gate holds it until the new leader has served, however slow the
	// machine, so the test does not race that second.
	gate := make(chan struct{})
	var closeGate sync.Once
	release := func() { closeGate.Do(func() { close(gate) }) }
	t.Cleanup(release) // before the nodes close
	for _, n := range nodes {
		n.gossip.pilot.fetchGate.Store(&gate)
		n.gossip.mu.Lock()
		n.gossip.members["ghost"] = &Member{ID: "ghost", RaftAddr: ghost.addr(), Status: "alive", Since: time.Now(),
			meta: memberMeta{ID: "ghost", Raft: ghost.addr(), Backend: "another-island"}}
		n.gossip.mu.Unlock()
	}
	next := followers(nodes, old)[0]
	startsBefore := next.gossip.pilot.starts.Load()
	waitFor(t, 15*time.Second, "leadership to move to "+next.ID(), func() bool {
		if next.IsLeader() {
			return true
		}
		if old.IsLeader() {
			_ = old.raft.LeadershipTransferToServer(raft.ServerID(next.ID()), raft.ServerAddress(next.RaftAddr())).Error()
		}
		return false
	})
	sw := sweepers[next]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := next.Read(ctx, func(*fsm.View) error { return nil }); err != nil {
		t.Fatalf("read on the new leader: %v", err)
	}
	waitFor(t, 5*time.Second, "the new leader's first sweep", func() bool { return sw.Sweeps() > 0 })
	if got := next.gossip.pilot.starts.Load(); got != startsBefore {
		t.Fatalf("autopilot finished starting (%d starts) before the new leader served: the sweeper and reads waited for it", got-startsBefore)
	}
	// Autopilot does start, once its wait for the silent server is over.
	release()
	waitFor(t, 5*time.Second, "autopilot to start on the new leader", func() bool { return next.gossip.pilot.starts.Load() > startsBefore })
	select {
	case <-ghost.rpcs:
	case <-time.After(10 * time.Second):
		t.Fatal("autopilot never asked the silent server for its progress")
	}
}

// hangNet is TCP, except that connections to addr fail at once when
// Raft makes them and hang until given up on when a short-lived request
// (a liveness check) makes them: a host that vanished from the network.
type hangNet struct {
	TCP
	addr    string
	dialing chan struct{} // a liveness check is dialing addr
}

func (h *hangNet) Dial(ctx context.Context, addr string) (net.Conn, error) {
	if addr != h.addr {
		return h.TCP.Dial(ctx, addr)
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) <= peerCheckTimeout && time.Until(d) > peerCheckTimeout/2 {
		select {
		case h.dialing <- struct{}{}:
		default:
		}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return nil, errors.New("connection refused")
}

// A failed-server removal that autopilot started is finished (cut short)
// before Close returns.
func TestCloseWaitsForFailedServerRemoval(t *testing.T) {
	hn := &hangNet{addr: "127.0.0.1:1", dialing: make(chan struct{}, 1)}
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	for _, cfg := range cfgs {
		cfg.Network = hn
		// Autopilot itself removes nothing during the test.
		cfg.Gossip.DeadServerTimeout = time.Minute
		nodes = append(nodes, openNode(t, cfg))
	}
	var leader *Node
	waitFor(t, 20*time.Second, "the ghost to be added as a voter", func() bool {
		leader = currentLeader(nodes)
		return leader != nil && leader.raft.AddVoter("ghost", raft.ServerAddress(hn.addr), 0, 5*time.Second).Error() == nil
	})
	// Removing a failed follower asks the remaining voters whether they
	// are live; the ghost cannot be reached.
	failed := followers(nodes, leader)[0]
	if err := failed.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "gossip to see the follower dead", func() bool {
		for _, m := range leader.Members() {
			if m.ID == failed.ID() {
				return m.Status == "dead"
			}
		}
		return false
	})
	p := leader.gossip.pilot
	p.RemoveFailedServer(&autopilot.Server{ID: raft.ServerID(failed.ID())})
	select {
	case <-hn.dialing:
	case <-time.After(10 * time.Second):
		t.Fatal("the removal never tried the ghost")
	}
	if p.removes.Load() != 1 {
		t.Fatalf("%d removals in progress, want 1", p.removes.Load())
	}
	start := time.Now()
	if err := leader.Close(); err != nil {
		t.Fatal(err)
	}
	if n := p.removes.Load(); n != 0 {
		t.Fatalf("%d removals still running after Close returned", n)
	}
	if took := time.Since(start); took > peerCheckTimeout {
		t.Fatalf("Close took %s: the removal was not cut short", took)
	}
}

// remove-peer refuses a removal that would leave fewer live voters than a
// majority of the remaining configuration.
func TestRemovePeerKeepsALiveMajority(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderWithin(t, nodes)
	fs := followers(nodes, leader)
	live, dead := fs[0], fs[1]
	if err := dead.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Leader and dead would remain: one live voter of two.
	for _, via := range []*Node{leader, live} {
		err := via.RemovePeer(ctx, live.ID())
		if !errors.Is(err, errcode.LastVoter) {
			t.Fatalf("removing the live follower through %s: %v, want last_voter", via.ID(), err)
		}
	}
	if v := voters(t, leader); len(v) != 3 {
		t.Fatalf("voters after the refused removal: %v", v)
	}
	// Removing the dead one leaves two live voters of two.
	if err := live.RemovePeer(ctx, dead.ID()); err != nil {
		t.Fatalf("removing the dead follower: %v", err)
	}
	if v := voters(t, leader); len(v) != 2 || !v[leader.ID()] || !v[live.ID()] {
		t.Fatalf("voters after removing the dead follower: %v", v)
	}
}

// The voter high-water mark only rises, and the floor is a majority of it.
func TestQuorumFloorIsReplicatedAndOnlyRises(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderWithin(t, nodes)
	ctx := context.Background()
	propose := func(c *fsm.SetBackendCmd) error {
		_, err := leader.Propose(ctx, &fsm.Command{Op: fsm.OpSetBackend, SetBackend: c})
		return err
	}
	if err := propose(&fsm.SetBackendCmd{Voters: 5}); err != nil {
		t.Fatal(err)
	}
	if err := propose(&fsm.SetBackendCmd{Voters: 3}); err != nil {
		t.Fatal(err)
	}
	if err := propose(&fsm.SetBackendCmd{}); !errors.Is(err, errcode.MalformedCmd) {
		t.Fatalf("empty set_backend: %v, want malformed_command", err)
	}
	for _, n := range nodes {
		waitFor(t, 5*time.Second, n.ID()+" to apply the voter count", func() bool { return n.MaxVoters() == 5 })
		if f := n.QuorumFloor(); f != 3 {
			t.Fatalf("%s: floor %d, want 3", n.ID(), f)
		}
	}
	if h := leader.FSM().BackendHash(); h == "" {
		t.Fatal("recording voters cleared the backend hash")
	}
}

// Five voters, two of which joined later with --bootstrap-expect 0: voters
// die one by one, and dead-server cleanup never leaves fewer voters than a
// majority of the five, whichever server leads.
func TestDeadServerCleanupKeepsTheIslandsFloor(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join),
		gossipConfig(t, "n4", 0, join), gossipConfig(t, "n5", 0, join)}
	running := map[string]*Node{}
	var mu sync.Mutex
	for _, cfg := range cfgs {
		// Five nodes on a busy machine: failure detection that tolerates
		// slow answers.
		cfg.Gossip.Tune = steadyGossip
		n := openNode(t, cfg)
		running[n.ID()] = n
	}
	current := func() []*Node {
		mu.Lock()
		defer mu.Unlock()
		var out []*Node
		for _, n := range running {
			out = append(out, n)
		}
		return out
	}
	waitFor(t, 30*time.Second, "five voters and a recorded floor of three", func() bool {
		l := currentLeader(current())
		if l == nil {
			return false
		}
		v := voters(t, l)
		count := 0
		for _, isVoter := range v {
			if isVoter {
				count++
			}
		}
		if count != 5 {
			return false
		}
		for _, n := range current() {
			if n.QuorumFloor() != 3 {
				return false
			}
		}
		return true
	})

	// Watch the voter count for the rest of the test.
	stop := make(chan struct{})
	lowest := make(chan int, 1)
	go func() {
		low := 5
		defer func() { lowest <- low }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			for _, n := range current() {
				if !n.IsLeader() {
					continue
				}
				if servers, err := n.Servers(); err == nil {
					count := 0
					for _, s := range servers {
						if s.Suffrage == raft.Voter {
							count++
						}
					}
					low = min(low, count)
				}
			}
		}
	}()
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
			<-lowest
		}
	}()

	kill := func() *Node {
		l := leaderWithin(t, current())
		victim := followers(current(), l)[0]
		mu.Lock()
		delete(running, victim.ID())
		mu.Unlock()
		if err := victim.Close(); err != nil {
			t.Fatal(err)
		}
		return victim
	}
	inConfig := func(id string) bool {
		l := currentLeader(current())
		if l == nil {
			return true
		}
		_, ok := voters(t, l)[id]
		return ok
	}
	for range 2 {
		v := kill()
		waitFor(t, 30*time.Second, "dead "+v.ID()+" to be removed", func() bool { return !inConfig(v.ID()) })
	}
	// Three voters remain; the third death leaves two live ones, and the
	// dead voter stays in the configuration.
	v := kill()
	failedReports := func() int64 {
		var sum int64
		for _, n := range current() {
			sum += n.gossip.pilot.failedSeen.Load()
		}
		return sum
	}
	base := failedReports()
	waitFor(t, 30*time.Second, "autopilot to report "+v.ID()+" failed for a while", func() bool {
		return failedReports() >= base+20 || !inConfig(v.ID())
	})
	if !inConfig(v.ID()) {
		t.Fatalf("dead %s was removed below the floor", v.ID())
	}
	close(stop)
	if low := <-lowest; low < 3 {
		t.Fatalf("the voters dropped to %d, below the floor of 3", low)
	}
}

// steadyGossip detects failures within a couple of seconds without taking
// a slow answer for a failure.
func steadyGossip(c *memberlist.Config) {
	fastGossip(c)
	c.ProbeInterval = 250 * time.Millisecond
	c.ProbeTimeout = 200 * time.Millisecond
	c.SuspicionMult = 3
}

// currentLeader is the node that leads with its term established, or nil.
func currentLeader(nodes []*Node) *Node {
	for _, n := range nodes {
		if n.IsLeader() && n.readyTerm.Load() == n.raft.CurrentTerm() {
			return n
		}
	}
	return nil
}

// leaderWithin waits for a leader with its term established among nodes:
// elections take longer on a busy machine than leaderOf allows.
func leaderWithin(t *testing.T, nodes []*Node) *Node {
	t.Helper()
	var l *Node
	waitFor(t, 30*time.Second, "a leader", func() bool { l = currentLeader(nodes); return l != nil })
	return l
}

// WhileLeads bounds a request handed to the leader over its API: its
// context ends at once when the named server does not lead, and soon after
// leadership moves away from it.
func TestWhileLeadsEndsWhenTheLeaderChanges(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	var nodes []*Node
	for _, cfg := range []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)} {
		nodes = append(nodes, openNode(t, cfg))
	}
	old := leaderWithin(t, nodes)
	f := followers(nodes, old)[0]
	if ctx, done := f.WhileLeads(context.Background(), "nobody"); ctx.Err() == nil {
		done()
		t.Fatal("bound to a server that does not lead, the context goes on")
	}
	ctx, done := f.WhileLeads(context.Background(), old.ID())
	defer done()
	if ctx.Err() != nil {
		t.Fatalf("bound to the leader, the context ended: %v", context.Cause(ctx))
	}
	waitFor(t, 15*time.Second, "the context to end once "+old.ID()+" no longer leads", func() bool {
		if old.IsLeader() {
			_ = old.raft.LeadershipTransferToServer(raft.ServerID(f.ID()), raft.ServerAddress(f.RaftAddr())).Error()
		}
		return ctx.Err() != nil
	})
}

func TestAFailedLeadershipTransferIsUnavailableNotAFault(t *testing.T) {
	n := open(t, testConfig(t.TempDir(), "boot"))
	defer n.Close()
	// A lone voter has no one to hand leadership to: raft fails the
	// transfer with an error of its own, which must not become a 500.
	err := n.transferLeadership()
	if !errors.Is(err, errcode.Unavailable) {
		t.Fatalf("transfer with no other voter: %v, want %v", err, errcode.Unavailable)
	}
	var e *errcode.Error
	if !errors.As(err, &e) || e.RetryAfter == 0 {
		t.Fatalf("transfer failure %v carries no retry_after_seconds", err)
	}
}

// Autopilot decides from the state it last gathered that a server has
// been dead long enough; the server may have come back since. The removal
// that follows does not keep the restarted server out of the cluster: it
// stays a voter, or is added back.
func TestACleanupOfAServerThatCameBackDoesNotKeepItOut(t *testing.T) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	var nodes []*Node
	for i := range cfgs {
		// Autopilot itself removes nothing during the test.
		cfgs[i].Gossip.DeadServerTimeout = time.Minute
		nodes = append(nodes, openNode(t, cfgs[i]))
	}
	leader := leaderOf(t, nodes)
	victim := index(t, nodes, followers(nodes, leader)[0])
	id := nodes[victim].ID()
	if err := nodes[victim].Close(); err != nil {
		t.Fatal(err)
	}
	gossipSees := func(status string) func() bool {
		return func() bool {
			for _, m := range leader.Members() {
				if m.ID == id {
					return m.Status == status
				}
			}
			return false
		}
	}
	waitFor(t, 10*time.Second, "gossip to see "+id+" dead", gossipSees("dead"))
	back := openNode(t, cfgs[victim])
	waitFor(t, 10*time.Second, "gossip to see "+id+" alive again", gossipSees("alive"))

	p := leader.gossip.pilot
	p.RemoveFailedServer(&autopilot.Server{ID: raft.ServerID(id)})
	waitFor(t, 15*time.Second, "the removal to end", func() bool { return p.removes.Load() == 0 })
	waitFor(t, 20*time.Second, id+" to be a voter again", func() bool { return voters(t, leader)[id] })
	acquire(t, leader, "after")
	waitFor(t, 10*time.Second, id+" to apply what follows", func() bool { return back.fsm.Applied() >= leader.fsm.Applied() })
}

// A voter catching up after joining (its data directory was emptied)
// answers, but takes no part in elections: remove-peer does not count it
// among the live voters. Removing the other follower would leave the
// leader as the one voter able to elect anyone, and a restart of the
// leader would then leave a cluster that elects no one: the joining voter
// catches up only from a leader.
func TestRemovePeerDoesNotCountAJoiningVoterAsLive(t *testing.T) {
	nodes := startStatic(t, 3)
	leader := leaderWithin(t, nodes)
	fs := followers(nodes, leader)
	other, joining := fs[0], fs[1]
	// What a voter whose data directory was emptied reports until it
	// has caught up.
	joining.transport.joining.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := leader.RemovePeer(ctx, other.ID()); !errors.Is(err, errcode.LastVoter) {
		t.Fatalf("removing the follower beside a joining voter: %v, want last_voter", err)
	}
	if v := voters(t, leader); len(v) != 3 {
		t.Fatalf("voters after the refused removal: %v", v)
	}
	// Once it takes part in elections again, the removal goes ahead.
	joining.transport.joining.Store(false)
	if err := leader.RemovePeer(ctx, other.ID()); err != nil {
		t.Fatalf("removing the follower beside a voter that caught up: %v", err)
	}
}

// Commands proposed through every server while the leader hands its
// leadership over (as a leader stopped with SIGTERM does) are taken by the
// new leader: raft refuses them on the old one during the transfer and
// after it, before proposing anything, so none is answered as refused or
// as of an unknown outcome. An election of another cause (a leader too
// slow to reach its followers in time, on a busy machine) may rightly
// leave commands in flight of an unknown outcome: then the test says so
// and checks no more.
func TestCommandsDuringAHandOffReachTheNewLeader(t *testing.T) {
	nodes := startStatic(t, 3)
	first := leaderOf(t, nodes).raft.CurrentTerm()
	p := proposeThrough(nodes, 9)
	waitFor(t, 10*time.Second, "commands through every server", p.appliedAtLeast(100))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	handed := leaderWithin(t, nodes).HandOff(ctx)
	if handed {
		waitFor(t, 10*time.Second, "commands under the new leader", p.appliedAtLeast(p.count()+100))
	}
	applied, failed := p.end()
	if elections := leaderWithin(t, nodes).raft.CurrentTerm() - first; elections > 1 {
		t.Logf("%d elections besides the hand-off; %d commands applied, these failed: %v", elections-1, applied, failed)
		return
	}
	if !handed {
		t.Fatal("leadership was not handed over")
	}
	if len(failed) > 0 {
		t.Fatalf("%d commands applied, and these failed: %v", applied, failed)
	}
	t.Logf("%d commands applied, none failed", applied)
}

// calls are workers making calls of their own (op: worker w's call i)
// through nodes (in turn) until ended, and what they were answered.
type calls struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	applied int
	failed  map[string]int // by error
}

// proposeThrough has workers propose commands through nodes.
func proposeThrough(nodes []*Node, workers int) *calls {
	return callThrough(nodes, workers, func(ctx context.Context, n *Node, w, i int) error {
		_, err := n.Propose(ctx, acquireCmd(fmt.Sprintf("w%d-%d", w, i)))
		return err
	})
}

func callThrough(nodes []*Node, workers int, op func(ctx context.Context, n *Node, w, i int) error) *calls {
	p := &calls{stop: make(chan struct{}), failed: map[string]int{}}
	for w := 0; w < workers; w++ {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-p.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := op(ctx, nodes[w%len(nodes)], w, i)
				cancel()
				p.mu.Lock()
				if err != nil {
					p.failed[err.Error()]++
				} else {
					p.applied++
				}
				p.mu.Unlock()
			}
		}()
	}
	return p
}

func (p *calls) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied
}

func (p *calls) appliedAtLeast(n int) func() bool {
	return func() bool { return p.count() >= n }
}

// end stops the workers and returns how many calls succeeded and how the
// others failed.
func (p *calls) end() (applied int, failed map[string]int) {
	close(p.stop)
	p.wg.Wait()
	return p.applied, p.failed
}
