package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/lockedbuf"
)

// acquireAll acquires one key per goroutine, all at once, and fails unless
// every caller got the lease of its own key. It returns how many log
// entries the leader appended meanwhile.
func acquireAll(t *testing.T, via, leader *Node, round string, keys int) uint64 {
	t.Helper()
	before := leader.raft.LastIndex()
	var wg sync.WaitGroup
	errs := make(chan error, keys)
	for i := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("%s-%d", round, i)
			cmd := &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
				Namespace: "default", Key: key, Owner: "o", TxnID: "txn-" + key, LeaseID: "lease-" + key,
				RequestID: "req-" + key, TTL: 60_000}}
			res, err := via.Propose(context.Background(), cmd)
			// A leader change on a loaded machine: the retried acquire
			// (same request id) gets the same lease.
			for try := 0; try < 50 && (errors.Is(err, errcode.NotLeader) || errors.Is(err, errcode.Unavailable)); try++ {
				time.Sleep(50 * time.Millisecond)
				res, err = via.Propose(context.Background(), cmd)
			}
			switch {
			case err != nil:
				errs <- fmt.Errorf("%s: %w", key, err)
			case res.Lease == nil || res.Lease.Key != key || res.Lease.LeaseID != "lease-"+key:
				errs <- fmt.Errorf("%s: answered %+v", key, res.Lease)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return leader.raft.LastIndex() - before
}

// Commands proposed together on the leader share log entries, and each
// caller gets the answer to its own command; followers apply the packed
// entries to the same state.
func TestConcurrentCommandsShareEntriesAndKeepTheirAnswers(t *testing.T) {
	first := gossipConfig(t, "n1", 2, nil)
	nodes := []*Node{openNode(t, first), openNode(t, gossipConfig(t, "n2", 2, []string{first.Gossip.Bind}))}
	leader := leaderOf(t, nodes)
	waitFor(t, 10*time.Second, "the leader to pack", leader.packOK.Load)
	const keys = 64
	entries := uint64(0)
	for round := range 5 {
		leader = leaderOf(t, nodes)
		entries += acquireAll(t, leader, leader, fmt.Sprint("r", round), keys)
	}
	if entries >= 5*keys {
		t.Fatalf("%d commands took %d entries: nothing was packed", 5*keys, entries)
	}
	t.Logf("%d commands in %d entries", 5*keys, entries)
	// Forwarded commands are packed on the leader too.
	leader = leaderOf(t, nodes)
	acquireAll(t, followers(nodes, leader)[0], leader, "forwarded", keys)
	waitFor(t, 10*time.Second, "the follower to apply everything", func() bool {
		return nodes[0].fsm.Applied() == nodes[1].fsm.Applied()
	})
	var hashes [2][]byte
	for i, n := range nodes {
		if err := n.fsm.View(func(v *fsm.View) error { hashes[i] = keysOnly(v); return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if string(hashes[0]) != string(hashes[1]) {
		t.Fatal("leader and follower hold different keys")
	}
	for _, n := range nodes {
		for _, key := range []string{"r0-0", "r4-63", "forwarded-0", "forwarded-63"} {
			var ok bool
			if err := n.fsm.View(func(v *fsm.View) error { _, ok = v.Key("default", key); return nil }); err != nil || !ok {
				t.Fatalf("%s lacks %s (%v)", n.ID(), key, err)
			}
		}
	}
}

// While a server of the configuration does not announce that it applies
// packed entries (a build from before them, during a rolling upgrade), the
// leader proposes every command in an entry of its own.
func TestAServerThatCannotApplyPackedEntriesKeepsTheLeaderFromPacking(t *testing.T) {
	first := gossipConfig(t, "n1", 2, nil)
	nodes := []*Node{openNode(t, first), openNode(t, gossipConfig(t, "n2", 2, []string{first.Gossip.Bind}))}
	// Both announce the format before packed entries, so that whichever
	// leads sees the other unable to apply them.
	announce := func(format int) {
		for _, n := range nodes {
			meta := *n.gossip.self.Load()
			meta.Format = format
			n.gossip.self.Store(&meta)
			if err := n.gossip.ml.UpdateNode(time.Second); err != nil {
				t.Fatal(err)
			}
		}
	}
	packing := func(want bool) func() bool {
		return func() bool { return nodes[0].packOK.Load() == want && nodes[1].packOK.Load() == want }
	}
	waitFor(t, 10*time.Second, "both nodes to be ready to pack", packing(true))
	announce(1)
	waitFor(t, 10*time.Second, "both nodes to stop packing", packing(false))
	const keys = 32
	leader := leaderOf(t, nodes)
	if entries := acquireAll(t, leader, leader, "old", keys); entries < keys {
		t.Fatalf("%d commands took %d entries while a server cannot apply packed ones", keys, entries)
	}
	announce(fsm.EntryFormat)
	waitFor(t, 10*time.Second, "both nodes to pack again", packing(true))
	leader = leaderOf(t, nodes)
	if entries := acquireAll(t, leader, leader, "new", keys); entries >= keys {
		t.Fatalf("%d commands took %d entries once every server applies packed ones", keys, entries)
	}
}

// heldPacker is a packer whose entries are sent on sent and answered once
// release is closed: a single command with Queued, a packed pair with
// Queued and Cancelled.
func heldPacker(packs func() bool, maxSize int) (p *packer, sent chan []byte, release chan struct{}) {
	release, sent = make(chan struct{}), make(chan []byte, 8)
	p = &packer{maxSize: maxSize, packs: packs, sent: func(int) {},
		send: func(data []byte, timeout time.Duration) (raft.Future, error) {
			sent <- data
			<-release
			if data[0] == 2 {
				return heldFuture{resp: fsm.Results{{Queued: true}, {Cancelled: true}}}, nil
			}
			return heldFuture{resp: &fsm.Result{Queued: true}}, nil
		}}
	return p, sent, release
}

func cmd(s string) []byte { return []byte("\x01" + s) }

// queueBehind proposes each command in the background, once the one
// before is queued behind the entry in flight.
func queueBehind(t *testing.T, p *packer, cmds ...[]byte) {
	t.Helper()
	for _, c := range cmds {
		go func() { _, _ = p.propose(context.Background(), c) }()
		waitFor(t, 5*time.Second, "the command to queue", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.queue) > 0 && bytes.Equal(p.queue[len(p.queue)-1].data, c)
		})
	}
}

// Commands queued behind an entry when packing is switched off (a server
// that cannot apply packed entries joined) go one per entry; a packed
// entry, framing included, stays within the packer's size.
func TestPackedEntriesStayWithinWhatTheServersTake(t *testing.T) {
	var packs atomic.Bool
	packs.Store(true)
	p, sent, release := heldPacker(packs.Load, 1<<20)
	go func() { _, _ = p.propose(context.Background(), cmd("first")) }()
	<-sent
	queueBehind(t, p, cmd("second"), cmd("third"))
	packs.Store(false)
	close(release)
	for _, want := range []string{"second", "third"} {
		if got := <-sent; !bytes.Equal(got, cmd(want)) {
			t.Fatalf("after packing was switched off: entry %q, want %q alone", got, cmd(want))
		}
	}

	p, sent, release = heldPacker(func() bool { return true }, 1<<20)
	go func() { _, _ = p.propose(context.Background(), cmd("first")) }()
	<-sent
	queueBehind(t, p, cmd(strings.Repeat("x", 1<<19-1)), cmd(strings.Repeat("y", 1<<19-1)))
	close(release)
	for range 2 {
		if got := <-sent; len(got) > p.maxSize {
			t.Fatalf("an entry of %d bytes, over the packer's %d", len(got), p.maxSize)
		}
	}
}

// heldFuture is the answer of a send that the test releases.
type heldFuture struct {
	raft.ApplyFuture
	resp interface{}
}

func (f heldFuture) Error() error          { return nil }
func (f heldFuture) Response() interface{} { return f.resp }

// A command whose caller gives up while it waits for the entry before it
// is never proposed; the ones behind it go together in the next entry.
func TestACommandWithdrawnWhileWaitingIsNeverProposed(t *testing.T) {
	p, sent, release := heldPacker(func() bool { return true }, 1<<20)
	first := make(chan interface{}, 1)
	go func() { r, _ := p.propose(context.Background(), cmd("first")); first <- r }()
	if got := <-sent; string(got) != string(cmd("first")) {
		t.Fatalf("sent %q first", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	withdrawn := make(chan error, 1)
	go func() { _, err := p.propose(ctx, cmd("withdrawn")); withdrawn <- err }()
	later := make(chan interface{}, 2)
	waitFor(t, 5*time.Second, "the command to queue", func() bool { p.mu.Lock(); defer p.mu.Unlock(); return len(p.queue) == 1 })
	cancel()
	select {
	case err := <-withdrawn:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("withdrawn command answered %v", err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a command whose caller gave up still waits")
	}
	for _, s := range []string{"second", "third"} {
		go func() { r, _ := p.propose(context.Background(), cmd(s)); later <- r }()
		waitFor(t, 5*time.Second, "the command to queue", func() bool {
			p.mu.Lock()
			defer p.mu.Unlock()
			return len(p.queue) > 0 && string(p.queue[len(p.queue)-1].data) == string(cmd(s))
		})
	}
	close(release)
	if r := (<-first).(*fsm.Result); !r.Queued {
		t.Fatalf("first answered %+v", r)
	}
	if got, want := string(<-sent), string(fsm.EncodePacked([][]byte{cmd("second"), cmd("third")})); got != want {
		t.Fatalf("second entry %q, want %q", got, want)
	}
	answers := map[bool]int{}
	for range 2 {
		r := (<-later).(*fsm.Result)
		answers[r.Queued]++
	}
	if answers[true] != 1 || answers[false] != 1 {
		t.Fatalf("the packed commands got %v, want one answer each", answers)
	}
	select {
	case data := <-sent:
		t.Fatalf("%q sent after the last entry", data)
	default:
	}
}

// A server announcing an older entry format (a build from before packed
// entries) is not added to the configuration, since the log it would be
// sent may hold entries it cannot apply; announcing the current format, it
// is.
func TestAServerOfAnOlderBuildIsNotAdded(t *testing.T) {
	var logs lockedbuf.Buffer
	first := gossipConfig(t, "n1", 1, nil)
	first.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	leader := openNode(t, first)
	waitFor(t, 10*time.Second, "n1 to lead", leader.IsLeader)
	old := openNode(t, gossipConfig(t, "n2", 0, nil))
	meta := *old.gossip.self.Load()
	meta.Format = 1
	old.gossip.self.Store(&meta)
	if err := old.gossip.ml.UpdateNode(time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := old.gossip.ml.Join([]string{first.Gossip.Bind}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the leader to refuse n2", func() bool {
		return logs.Contains("not adding a server of an older build") && logs.Contains("id=n2")
	})
	if voters(t, leader)["n2"] {
		t.Fatal("a server of an older build was added")
	}
	meta.Format = fsm.EntryFormat
	old.gossip.self.Store(&meta)
	if err := old.gossip.ml.UpdateNode(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "n2 to be added once it announces the current format", func() bool { return voters(t, leader)["n2"] })
}
