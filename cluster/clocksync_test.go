package cluster

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// skewedClock is a wall clock set off by an offset a test can change.
type skewedClock struct{ off atomic.Int64 }

func (c *skewedClock) Now() time.Time { return time.Now().Add(time.Duration(c.off.Load())) }

func TestClockCorrectionIsTheMedianOfPeerOffsets(t *testing.T) {
	c := newClockSync(&skewedClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	now := time.Now()
	sample := func(off, rtt time.Duration, age time.Duration) clockSample {
		return clockSample{offset: off, rtt: rtt, at: now.Add(-age)}
	}
	c.add("a", sample(-10*time.Second, time.Millisecond, 0))
	if got := c.Offset(); got != 0 {
		t.Fatalf("one peer is no majority to follow; correction %v", got)
	}
	c.add("b", sample(-10*time.Second+4*time.Millisecond, time.Millisecond, 0))
	if got := c.Offset(); got != -10*time.Second+4*time.Millisecond {
		t.Fatalf("both peers are 10s behind: correction %v", got)
	}
	// A probe delayed on the way (right to within half its round trip) is
	// ignored while a faster one is recent.
	c.add("b", sample(-10*time.Second-15*time.Millisecond, 40*time.Millisecond, 0))
	if got := c.Offset(); got != -10*time.Second+4*time.Millisecond {
		t.Fatalf("a slow probe moved the correction to %v", got)
	}
	// One peer far off moves nothing: the median is the node itself.
	c.add("a", sample(15*time.Second, 0, 0))
	if got := c.Offset(); got != 0 {
		t.Fatalf("with peers at +15s and -10s the median is this node: correction %v", got)
	}
	// Four members: the mean of the middle two.
	c.add("c", sample(2*time.Second, time.Millisecond, 0))
	if got := c.Offset(); got != time.Second {
		t.Fatalf("offsets 0, -10s, +2s, +15s: correction %v, want 1s", got)
	}
	// Peers not heard from lately no longer count.
	c2 := newClockSync(&skewedClock{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	c2.add("a", sample(5*time.Second, time.Millisecond, clockSampleAge+time.Second))
	c2.add("b", sample(5*time.Second, time.Millisecond, 0))
	c2.add("c", sample(5*time.Second, time.Millisecond, 0))
	if got := c2.Offset(); got != 5*time.Second {
		t.Fatalf("correction %v, want 5s", got)
	}
	if len(c2.peers) != 2 {
		t.Fatalf("a peer silent for longer than %v is still kept: %d peers", clockSampleAge, len(c2.peers))
	}
	// Left with one peer, the node keeps the correction it had.
	now = now.Add(clockSampleAge + time.Second)
	c2.add("b", sample(0, time.Millisecond, 0))
	if len(c2.peers) != 1 {
		t.Fatalf("%d peers heard from lately, want 1", len(c2.peers))
	}
	if got := c2.Offset(); got != 5*time.Second {
		t.Fatalf("with one peer left the correction became %v, want the last one, 5s", got)
	}
}

func TestClockOffsetFromAProbe(t *testing.T) {
	discard := slog.New(slog.NewTextHandler(io.Discard, nil))
	var ahead skewedClock
	ahead.off.Store(int64(3 * time.Second))
	peer := newClockSync(&ahead, discard)
	c := newClockSync(&skewedClock{}, discard)
	c.NotifyPingComplete(&memberlist.Node{Name: "p"}, 2*time.Millisecond, peer.AckPayload())
	c.NotifyPingComplete(&memberlist.Node{Name: "q"}, time.Millisecond, []byte("short"))
	best, ok := c.peers["p"].best(time.Now())
	if !ok || (best-3*time.Second).Abs() > 50*time.Millisecond {
		t.Fatalf("offset of a peer 3s ahead measured as %v", best)
	}
	if _, ok := c.peers["q"]; ok {
		t.Fatal("a probe without a clock reading was counted")
	}
}

// Two of three nodes have clocks 10 s off, one ahead and one behind. Each
// corrects its clock to the members' median, so reads and commands on any
// node, leader or not, see the same time, and a lease keeps its remaining
// time whichever of them leads next.
func TestLeasesKeepTheirTimeWhenANodesClockIsOff(t *testing.T) {
	nodes, clocks, byID, leadOn := skewedCluster(t)
	leadOn("n1")
	clocks["n2"].off.Store(int64(-10 * time.Second))
	clocks["n3"].off.Store(int64(10 * time.Second))
	off := func(n *Node) time.Duration { return n.Now().Sub(time.Now()) }
	// A node's time never falls behind the replicated clock, so n2 (behind)
	// seems right before it has measured its peers: wait for every node's
	// correction, then check every node's time.
	corrections := map[string]time.Duration{"n1": 0, "n2": 10 * time.Second, "n3": -10 * time.Second}
	waitFor(t, 10*time.Second, "every node to correct its clock to the median", func() bool {
		for id, want := range corrections {
			if (byID(id).clocks.Offset() - want).Abs() > 250*time.Millisecond {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		if d := off(n); d.Abs() > 250*time.Millisecond {
			t.Fatalf("%s's time is %v off real time after the correction", n.ID(), d)
		}
	}

	lease := acquire(t, byID("n1"), "k")
	granted := time.Now()
	for _, id := range []string{"n3", "n2"} {
		n := leadOn(id)
		remaining := time.Duration(lease.ExpiresAt-n.Now().UnixMilli()) * time.Millisecond
		want := 60*time.Second - time.Since(granted)
		if (remaining - want).Abs() > 500*time.Millisecond {
			t.Fatalf("with %s (clock %v off) leading, the lease has %v left, want about %v",
				id, time.Duration(clocks[id].off.Load()), remaining, want)
		}
		acquire(t, n, "stamped-by-"+id)
		if d := off(n); d.Abs() > 250*time.Millisecond {
			t.Fatalf("%s stamps %v off real time", id, d)
		}
	}
}

// A step of this node's clock (an NTP step, a resumed VM) is followed as
// soon as the peers' probes show it: a fast probe from before the step
// does not outweigh them.
func TestTheCorrectionFollowsAStepOfThisNodesClock(t *testing.T) {
	clock := &skewedClock{}
	c := newClockSync(clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, peer := range []string{"a", "b"} {
		c.add(peer, clockSample{offset: 0, rtt: 300 * time.Microsecond, at: time.Now()})
	}
	clock.off.Store(int64(10 * time.Second))
	for _, peer := range []string{"a", "b"} {
		c.add(peer, clockSample{offset: -10 * time.Second, rtt: 500 * time.Microsecond, at: time.Now()})
	}
	if off := time.Until(c.Now()); off.Abs() > time.Second {
		t.Fatalf("after a probe of each peer since the step, this node's corrected clock is %v off", off)
	}
}

// A leader whose clock stepped ahead, and which stamped with it (a node
// elected before it measured its peers, or a step no probe showed for as
// long as it is held back), stamps with it only until it has measured its
// peers: from then on it stamps the members' median time again (the
// replicated clock holding still until that time reaches what it
// stamped), in this term and when it leads again. Were it to go on from
// its own stamps, every lease it judged would end early by the step, and
// every expiry it handed out would be that much ahead of real time.
func TestALeaderFollowsItsCorrectionOnceItHasMeasured(t *testing.T) {
	_, clocks, byID, leadOn := skewedCluster(t)
	n1 := leadOn("n1")
	off := func(n *Node) time.Duration { return n.Now().Sub(time.Now()) }
	corrected := func(id string, want time.Duration) bool {
		return (byID(id).clocks.Offset() - want).Abs() < 250*time.Millisecond
	}
	waitFor(t, 10*time.Second, "n1 to measure its peers", func() bool {
		n1.clocks.mu.Lock()
		measured := len(n1.clocks.peers)
		n1.clocks.mu.Unlock()
		return measured >= 2 && corrected("n1", 0)
	})

	// n1's clock steps 3 s ahead; it stamps a command with it (holding
	// the step back not at all) before its next probes show the step.
	const step = 3 * time.Second
	n1.stamps.mu.Lock()
	n1.stamps.stepGrace = 0
	n1.stamps.mu.Unlock()
	clocks["n1"].off.Store(int64(step))
	acquire(t, n1, "stamped-ahead")
	if ahead := time.Duration(n1.fsm.Now()-time.Now().UnixMilli()) * time.Millisecond; ahead < step/2 {
		t.Fatalf("n1 measured the step before stamping (replicated clock %v ahead)", ahead)
	}
	waitFor(t, 10*time.Second, "n1 to correct its clock", func() bool { return corrected("n1", -step) })
	waitFor(t, 10*time.Second, "real time to reach the replicated clock", func() bool {
		return time.Now().UnixMilli() > n1.fsm.Now()+100
	})
	if d := off(n1); d.Abs() > 250*time.Millisecond {
		t.Fatalf("n1 still leading, corrected: its time is %v off real time", d)
	}
	lease := acquire(t, n1, "k")
	if left := time.Until(time.UnixMilli(lease.ExpiresAt)); (left - time.Minute).Abs() > 500*time.Millisecond {
		t.Fatalf("a one-minute lease n1 granted expires in %v of real time", left)
	}
	leadOn("n2")
	n1 = leadOn("n1")
	if d := off(n1); d.Abs() > 250*time.Millisecond {
		t.Fatalf("n1 leading again: its time is %v off real time", d)
	}
}

// A measured leader's clock steps ahead (an NTP step, a resumed VM): the
// leader does not stamp the step before its probes show it, which the
// correction then takes out. Stamped, it would cut the step off every
// lease's remaining time, for good (the replicated clock never goes
// back), and the sweeper would end leases their holders keep alive in
// time.
func TestALeaderHoldsBackAStepOfItsClockUntilItsProbesShowIt(t *testing.T) {
	_, clocks, byID, leadOn := skewedCluster(t)
	n1 := leadOn("n1")
	waitFor(t, 10*time.Second, "n1 to measure its peers", func() bool {
		n1.clocks.mu.Lock()
		measured := len(n1.clocks.peers)
		n1.clocks.mu.Unlock()
		return measured >= 2 && byID("n1").clocks.Offset().Abs() < 250*time.Millisecond
	})
	lease := acquire(t, n1, "k")
	granted := time.Now()

	const step = 30 * time.Second
	clocks["n1"].off.Store(int64(step))
	ahead := func(what string) {
		t.Helper()
		if d := time.Duration(n1.fsm.Now()-time.Now().UnixMilli()) * time.Millisecond; d > 250*time.Millisecond {
			t.Fatalf("%s: the replicated clock is %v ahead of real time", what, d)
		}
		if d := n1.Now().Sub(time.Now()); d > 250*time.Millisecond {
			t.Fatalf("%s: n1's time is %v ahead of real time", what, d)
		}
	}
	acquire(t, n1, "stamped-after-the-step")
	ahead("right after the step")
	for i := 0; time.Since(granted) < 2*time.Second; i++ {
		acquire(t, n1, fmt.Sprintf("stamped-%d", i))
		time.Sleep(20 * time.Millisecond)
	}
	ahead("two seconds after the step")
	waitFor(t, 10*time.Second, "n1 to correct its clock", func() bool {
		return (n1.clocks.Offset() + step).Abs() < 250*time.Millisecond
	})
	acquire(t, n1, "stamped-after-the-correction")
	ahead("after the correction")
	left := time.Duration(lease.ExpiresAt-n1.Now().UnixMilli()) * time.Millisecond
	if want := time.Minute - time.Since(granted); (left - want).Abs() > 500*time.Millisecond {
		t.Fatalf("the one-minute lease has %v left, want about %v", left, want)
	}
}

// skewedCluster starts three gossiping nodes n1..n3, each on a clock the
// test can set off (clocks, by node id), and returns them with a lookup by
// id and a function that makes the node of an id lead.
func skewedCluster(t *testing.T) (nodes []*Node, clocks map[string]*skewedClock, byID, leadOn func(id string) *Node) {
	first := gossipConfig(t, "n1", 3, nil)
	join := []string{first.Gossip.Bind}
	cfgs := []Config{first, gossipConfig(t, "n2", 3, join), gossipConfig(t, "n3", 3, join)}
	clocks = map[string]*skewedClock{}
	for _, cfg := range cfgs {
		c := &skewedClock{}
		cfg.Clock, clocks[cfg.NodeID] = c, c
		nodes = append(nodes, openNode(t, cfg))
	}
	byID = func(id string) *Node {
		for _, n := range nodes {
			if n.ID() == id {
				return n
			}
		}
		t.Fatalf("no node %s", id)
		return nil
	}
	leadOn = func(id string) *Node {
		t.Helper()
		target := byID(id)
		waitFor(t, 10*time.Second, id+" to lead", func() bool {
			l := leaderOf(t, nodes)
			if l == target {
				return true
			}
			_ = l.raft.LeadershipTransferToServer(raft.ServerID(id), raft.ServerAddress(target.RaftAddr())).Error()
			return leaderOf(t, nodes) == target
		})
		return target
	}
	return nodes, clocks, byID, leadOn
}
