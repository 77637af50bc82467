package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testCA is the CA of the nodes of these tests.
var testCA = sync.OnceValue(func() *auth.Bundle {
	ca, err := auth.NewCA(auth.IssueOptions{Name: "cluster test CA"})
	if err != nil {
		panic(err)
	}
	return ca
})

// peerTLS is a server certificate of testCA: the nodes of these tests run
// their internal connections over mutual TLS, as deployed nodes do.
func peerTLS() PeerTLS {
	b, err := testCA().Issue(auth.RoleServer, auth.IssueOptions{Name: "cluster test node"})
	if err != nil {
		panic(err)
	}
	return auth.NewStaticSource(b)
}

func testConfig(dir, boot string) Config {
	return Config{NodeID: "n1", DataDir: dir, RaftBind: "127.0.0.1:0", Bootstrap: true, TLS: peerTLS(),
		HeartbeatTimeout: 200 * time.Millisecond, ElectionTimeout: 200 * time.Millisecond,
		SnapshotThreshold: 1 << 20, FSM: fsm.Options{BootID: boot}}
}

func open(t *testing.T, cfg Config) *Node {
	t.Helper()
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !n.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("node did not become leader")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return n
}

func acquire(t *testing.T, n *Node, key string) *fsm.LeaseInfo {
	t.Helper()
	res, err := n.Propose(context.Background(), acquireCmd(key))
	if err != nil {
		t.Fatal(err)
	}
	return res.Lease
}

// acquireCmd acquires key for a minute; proposed again, it is a retry.
func acquireCmd(key string) *fsm.Command {
	return &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: key, Owner: "o", TxnID: "txn-" + key, LeaseID: "lease-" + key,
		RequestID: "req-" + key, TTL: 60_000}}
}

func TestRestartResumesFromTheAppliedIndex(t *testing.T) {
	dir := t.TempDir()
	n := open(t, testConfig(dir, "boot-a"))
	for i := 0; i < 20; i++ {
		acquire(t, n, "k"+strconv.Itoa(i))
	}
	applied := n.FSM().Applied()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}

	n = open(t, testConfig(dir, "boot-a"))
	defer n.Close()
	if !n.FSM().Trusted() {
		t.Fatal("cleanly closed state was not trusted")
	}
	if n.FSM().Applied() < applied {
		t.Fatalf("applied index went back from %d to %d", applied, n.FSM().Applied())
	}
	// The restarted node re-applies nothing: the same leases, the same tokens.
	var rec fsm.KeyRecord
	_ = n.Read(context.Background(), func(v *fsm.View) error { rec, _ = v.Key("default", "k3"); return nil })
	if rec.Lease == nil || rec.Fencing != 1 {
		t.Fatalf("after restart: %+v", rec)
	}
	if l := acquire(t, n, "fresh"); l.Token != 1 {
		t.Fatalf("new lease after restart: %+v", l)
	}
}

// TestUntrustedStateIsRebuiltFromSnapshotAndLog simulates an operating
// system crash: the state file is not trusted on restart, so it is discarded
// and Raft restores the latest snapshot and replays the log after it.
func TestUntrustedStateIsRebuiltFromSnapshotAndLog(t *testing.T) {
	dir := t.TempDir()
	n := open(t, testConfig(dir, "boot-a"))
	for i := 0; i < 10; i++ {
		acquire(t, n, "before-"+strconv.Itoa(i))
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 10; i++ {
		acquire(t, n, "after-"+strconv.Itoa(i))
	}
	var want []byte
	_ = n.FSM().View(func(v *fsm.View) error { want = keysOnly(v); return nil })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// Mark the state file as left behind by a crash in an earlier boot.
	raw, _ := json.Marshal(map[string]any{"clean": false, "boot_id": "boot-a"})
	if err := os.WriteFile(filepath.Join(dir, "state.db.marker"), raw, 0o600); err != nil {
		t.Fatal(err)
	}

	n = open(t, testConfig(dir, "boot-b"))
	defer n.Close()
	if n.FSM().Trusted() {
		t.Fatal("state from an earlier boot was trusted")
	}
	var got []byte
	deadline := time.Now().Add(5 * time.Second)
	for {
		_ = n.Read(context.Background(), func(v *fsm.View) error { got = keysOnly(v); return nil })
		if bytes.Equal(got, want) || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("rebuilt state differs:\n got %s\nwant %s", got, want)
	}
}

// keysOnly renders every key record (leases, tokens, versions).
func keysOnly(v *fsm.View) []byte {
	var buf bytes.Buffer
	for _, p := range []string{"before-", "after-"} {
		for i := 0; i < 10; i++ {
			rec, ok := v.Key("default", p+strconv.Itoa(i))
			raw, _ := json.Marshal(rec)
			buf.WriteString(strconv.FormatBool(ok))
			buf.Write(raw)
		}
	}
	return buf.Bytes()
}

func TestWithoutALeaderRequestsWaitThenFail(t *testing.T) {
	cfg := testConfig(t.TempDir(), "boot-a")
	cfg.Bootstrap = false // a node that never joins a cluster
	cfg.LeaderWait = 300 * time.Millisecond
	n, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	start := time.Now()
	_, err = n.Propose(context.Background(), &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepCmd{Limit: 1}})
	if !errors.Is(err, errcode.NoLeader) {
		t.Fatalf("propose without leader: %v", err)
	}
	if e := new(errcode.Error); !errors.As(err, &e) || e.RetryAfter <= 0 {
		t.Fatalf("no retry hint: %v", err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Fatalf("gave up after %s", waited)
	}
	if err := n.Read(context.Background(), func(*fsm.View) error { return nil }); !errors.Is(err, errcode.NoLeader) {
		t.Fatalf("read without leader: %v", err)
	}
}

func TestLeadershipIsAnnouncedAndReadsAreLinearizable(t *testing.T) {
	n := open(t, testConfig(t.TempDir(), "boot-a"))
	defer n.Close()
	got := make(chan bool, 4)
	n.OnLeadership(func(isLeader bool) { got <- isLeader })
	if !<-got {
		t.Fatal("leader not announced")
	}
	// Every acknowledged write is visible to the next read.
	for i := 0; i < 50; i++ {
		key := "lin-" + strconv.Itoa(i)
		acquire(t, n, key)
		var ok bool
		if err := n.Read(context.Background(), func(v *fsm.View) error { _, ok = v.Key("default", key); return nil }); err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Fatalf("read missed acknowledged write %s", key)
		}
	}
	st := n.Status()
	if st.State != "Leader" || st.Leader != "n1" || st.AppliedIndex == 0 || st.Term == 0 {
		t.Fatalf("status %+v", st)
	}
}

func TestStateFileAheadOfTheLogIsDiscarded(t *testing.T) {
	dir := t.TempDir()
	n := open(t, testConfig(dir, "boot-a"))
	for i := 0; i < 5; i++ {
		acquire(t, n, "k"+strconv.Itoa(i))
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// The Raft directory is lost (or replaced by another cluster's).
	if err := os.RemoveAll(filepath.Join(dir, "raft")); err != nil {
		t.Fatal(err)
	}
	n = open(t, testConfig(dir, "boot-a"))
	defer n.Close()
	if n.FSM().Trusted() {
		t.Fatal("a state file ahead of the log was trusted")
	}
	var ok bool
	_ = n.Read(context.Background(), func(v *fsm.View) error { _, ok = v.Key("default", "k1"); return nil })
	if ok {
		t.Fatal("state the log no longer holds survived")
	}
	if l := acquire(t, n, "fresh"); l == nil {
		t.Fatal("node does not accept writes")
	}
}

// TestAnotherClustersStateFileIsDiscarded puts the state file of another
// single-node cluster, at the same applied index and term, into a node's
// data directory: the island's backend hash, in the snapshot or in the log,
// tells the two apart, and the node serves its own keys.
func TestAnotherClustersStateFileIsDiscarded(t *testing.T) {
	for _, snapshot := range []bool{false, true} {
		t.Run("snapshot="+strconv.FormatBool(snapshot), func(t *testing.T) {
			own, other := t.TempDir(), t.TempDir()
			a := open(t, testConfig(own, "boot-a"))
			b := open(t, testConfig(other, "boot-a"))
			for _, n := range []*Node{a, b} {
				deadline := time.Now().Add(10 * time.Second)
				for n.FSM().BackendHash() == "" {
					if time.Now().After(deadline) {
						t.Fatal("the island was not named")
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			for i := 0; i < 5; i++ {
				acquire(t, a, "own-"+strconv.Itoa(i))
				acquire(t, b, "other-"+strconv.Itoa(i))
			}
			for i := 0; a.FSM().Applied() != b.FSM().Applied(); i++ {
				n := a
				if b.FSM().Applied() < a.FSM().Applied() {
					n = b
				}
				acquire(t, n, "more-"+strconv.Itoa(i))
			}
			if snapshot {
				for _, n := range []*Node{a, b} {
					if err := n.Snapshot(); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, n := range []*Node{a, b} {
				if err := n.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if a.FSM().Applied() != b.FSM().Applied() || a.FSM().AppliedTerm() != b.FSM().AppliedTerm() {
				t.Fatalf("the clusters applied %d (term %d) and %d (term %d); the test needs them equal",
					a.FSM().Applied(), a.FSM().AppliedTerm(), b.FSM().Applied(), b.FSM().AppliedTerm())
			}
			for _, f := range []string{"state.db", "state.db.marker"} {
				raw, err := os.ReadFile(filepath.Join(other, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(own, f), raw, 0o600); err != nil {
					t.Fatal(err)
				}
			}

			n := open(t, testConfig(own, "boot-a"))
			defer n.Close()
			if n.FSM().Trusted() {
				t.Fatal("another cluster's state file was trusted")
			}
			var ownKey, otherKey bool
			deadline := time.Now().Add(5 * time.Second)
			for {
				_ = n.Read(context.Background(), func(v *fsm.View) error {
					_, ownKey = v.Key("default", "own-4")
					_, otherKey = v.Key("default", "other-4")
					return nil
				})
				if ownKey && !otherKey || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if !ownKey || otherKey {
				t.Fatalf("the node serves its own keys: %v, the other cluster's: %v", ownKey, otherKey)
			}
		})
	}
}

func TestStateFileBehindTheSnapshotIsRebuilt(t *testing.T) {
	dir := t.TempDir()
	n := open(t, testConfig(dir, "boot-a"))
	for i := 0; i < 10; i++ {
		acquire(t, n, "before-"+strconv.Itoa(i))
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	old := map[string][]byte{}
	for _, f := range []string{"state.db", "state.db.marker"} {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		old[f] = raw
	}
	n = open(t, testConfig(dir, "boot-a"))
	for i := 0; i < 10; i++ {
		acquire(t, n, "after-"+strconv.Itoa(i))
	}
	if err := n.Snapshot(); err != nil {
		t.Fatal(err)
	}
	var want []byte
	_ = n.FSM().View(func(v *fsm.View) error { want = keysOnly(v); return nil })
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	// Put back the older, cleanly closed state file: it is behind the
	// snapshot, as after a crash while a snapshot was being installed.
	for f, raw := range old {
		if err := os.WriteFile(filepath.Join(dir, f), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n = open(t, testConfig(dir, "boot-a"))
	defer n.Close()
	if n.FSM().Trusted() {
		t.Fatal("a state file behind the snapshot was trusted")
	}
	var got []byte
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		_ = n.Read(context.Background(), func(v *fsm.View) error { got = keysOnly(v); return nil })
		if bytes.Equal(got, want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("rebuilt state differs:\n got %s\nwant %s", got, want)
}

type steppedClock struct{ t time.Time }

func (c *steppedClock) Now() time.Time { return c.t }

func TestStampsNeverRunBackwards(t *testing.T) {
	start := time.Now()
	c := &steppedClock{t: start}
	var mono time.Duration
	s := stampClock{clock: c, mono: func() time.Duration { return mono }}
	first := s.next(0)
	c.t, mono = start.Add(10*time.Millisecond), 10*time.Millisecond
	second := s.next(0)
	if second-first != 10 {
		t.Fatalf("stamps %d then %d, want 10ms apart", first, second)
	}
	// The wall clock steps back an hour: stamps keep their pace from the
	// last one instead of going back (or freezing).
	c.t, mono = c.t.Add(-time.Hour), 15*time.Millisecond
	if third := s.next(0); third != second+5 {
		t.Fatalf("after the wall clock stepped back: stamp %d, want %d", third, second+5)
	}
	// A replicated clock ahead of this node's clock is the floor.
	if got := s.next(second + 60_000); got < second+60_000 {
		t.Fatalf("stamp %d below the replicated clock %d", got, second+60_000)
	}
}

// With the wall clock behind, stamps closer than a millisecond apart still
// carry the replicated clock at the monotonic clock's pace: the part of a
// millisecond one stamp did not count is counted by the next.
func TestStampsKeepPaceUnderLoadAfterTheClockSteppedBack(t *testing.T) {
	c := &steppedClock{t: time.Now()}
	var mono time.Duration
	s := stampClock{clock: c, mono: func() time.Duration { return mono }}
	first := s.next(0)
	c.t = c.t.Add(-time.Hour)
	for range 2000 { // a command every 0.5 ms for one second
		mono += 500 * time.Microsecond
		c.t = c.t.Add(500 * time.Microsecond)
		s.next(0)
	}
	if moved := s.next(0) - first; moved != 1000 {
		t.Fatalf("one second of commands moved the stamps on by %d ms, want 1000", moved)
	}
}

// correctedClock is a wall clock with the correction its probes measured,
// as clockSync's Now is.
type correctedClock struct {
	wall *steppedClock
	off  *time.Duration
}

func (c correctedClock) Now() time.Time { return c.wall.Now().Add(*c.off) }

// The probes' noise (a correction moving by a fraction of a millisecond,
// either way, as faster round trips come in) while the wall clock is
// behind (it stepped back, and the probes have not shown the step yet)
// leaves the stamps at the monotonic clock's pace: they do not drop to the
// replicated clock, which lags them by the commands in flight, at every
// probe, nor does an idle leader's time stand still at it.
func TestStampsKeepPaceThroughProbeNoiseAfterTheClockSteppedBack(t *testing.T) {
	wall := &steppedClock{t: time.Now()}
	var mono, off time.Duration
	s := stampClock{clock: correctedClock{wall, &off}, offset: func() time.Duration { return off },
		mono: func() time.Duration { return mono }}
	first := s.next(0)
	wall.t = wall.t.Add(-time.Hour)
	// The replicated clock: the stamp of the command applied last, 20
	// commands (10 ms) behind the one being stamped.
	var issued []int64
	applied := func() int64 { return issued[max(0, len(issued)-20)] }
	issued = append(issued, first)
	for i := range 2000 { // a command every 0.5 ms for one second, a probe every 100 ms
		mono += 500 * time.Microsecond
		wall.t = wall.t.Add(500 * time.Microsecond)
		if i%200 == 100 {
			off = time.Duration(i%400-200) * time.Microsecond
		}
		issued = append(issued, s.next(applied()))
	}
	last := issued[len(issued)-1]
	if moved := last - first; moved < 999 {
		t.Fatalf("one second of commands moved the stamps on by %d ms, want 1000", moved)
	}
	// No command for a second, over which a probe moves the correction.
	mono += time.Second
	wall.t = wall.t.Add(time.Second)
	off += 300 * time.Microsecond
	if moved := s.peek(last) - last; moved < 999 {
		t.Fatalf("an idle second moved the leader's time on by %d ms, want 1000", moved)
	}
}

// Closing a node while proposals stream in lets raft answer every proposal
// it took before it shuts down; later ones are refused as shutting_down and
// none is left with an unknown outcome. Raft shutting down under a request
// answers it "leadership lost" at best, and never answers one queued for
// its state machine: its proposer (and the RPC connection serving a
// forwarded one) would wait forever.
func TestCloseAnswersEveryProposalInFlight(t *testing.T) {
	for round := 0; round < 5; round++ {
		n := open(t, testConfig(t.TempDir(), "boot-a"))
		const proposers = 32
		answered := make(chan error, proposers)
		started := make(chan struct{}, proposers)
		for i := 0; i < proposers; i++ {
			go func() {
				first := true
				for {
					_, err := n.Propose(context.Background(), &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}})
					if first {
						started <- struct{}{}
						first = false
					}
					if err != nil {
						answered <- err
						return
					}
				}
			}()
		}
		for i := 0; i < proposers; i++ {
			<-started
		}
		closed := make(chan error, 1)
		go func() { closed <- n.Close() }()
		deadline := time.After(15 * time.Second)
		for i := 0; i < proposers; i++ {
			select {
			case err := <-answered:
				if !errors.Is(err, errcode.ShuttingDown) {
					t.Fatalf("round %d: a proposal cut short by the close: %v, want shutting_down", round, err)
				}
			case <-deadline:
				t.Fatalf("round %d: %d of %d proposers still wait after the node closed", round, proposers-i, proposers)
			}
		}
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("round %d: Close did not return", round)
		}
	}
}

// A restore cut short by a crash leaves the upload it was storing, and the
// state machine's copy of the snapshot it was installing, in the data
// directory; the next start removes them.
func TestStartRemovesFilesOfARestoreCutShort(t *testing.T) {
	dir := t.TempDir()
	upload := filepath.Join(dir, "restore-123.upload")
	installing := filepath.Join(dir, "state.db.restore")
	other := filepath.Join(dir, "notes.txt")
	for _, p := range []string{upload, installing, other} {
		if err := os.WriteFile(p, []byte("left behind"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n := open(t, testConfig(dir, "boot-a"))
	defer n.Close()
	for _, p := range []string{upload, installing} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a start: %v, want it removed", filepath.Base(p), err)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file the node does not own was touched: %v", err)
	}
}

// A snapshot cut short by a crash (raft writing one, or installing the
// leader's, or an operator's restore) leaves its temporary directory in the
// snapshot store, as large as the state; the next start removes it, and
// leaves the store's other entries alone.
func TestStartRemovesSnapshotsCutShort(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(raftDirOf(dir), "snapshots")
	cut := filepath.Join(store, "2-40-1700000000000.tmp")
	if err := os.MkdirAll(cut, 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(store, "notes.txt")
	for _, p := range []string{filepath.Join(cut, "state.bin"), other} {
		if err := os.WriteFile(p, []byte("left behind"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n := open(t, testConfig(dir, "boot-a"))
	defer n.Close()
	if _, err := os.Stat(cut); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after a start: %v, want it removed", filepath.Base(cut), err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file the node does not own was touched: %v", err)
	}
}

// A node that cannot start (its Raft port taken, its data directory in
// use, its gossip port taken, settings Raft refuses) answers an error and
// releases what it had opened; it does not panic.
func TestOpenThatFailsAnswersAnError(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	held := open(t, testConfig(t.TempDir(), "boot-a"))
	defer held.Close()
	gossip := gossipConfig(t, "g1", 1, nil)
	gossipTaken, err := net.Listen("tcp", gossip.Gossip.Bind)
	if err != nil {
		t.Fatal(err)
	}
	defer gossipTaken.Close()
	for name, cfg := range map[string]Config{
		"raft port taken":   func() Config { c := testConfig(t.TempDir(), "boot-a"); c.RaftBind = taken.Addr().String(); return c }(),
		"data dir in use":   testConfig(held.cfg.DataDir, "boot-a"),
		"gossip port taken": gossip,
		"heartbeat too low": func() Config { c := testConfig(t.TempDir(), "boot-a"); c.HeartbeatTimeout = time.Millisecond; return c }(),
	} {
		t.Run(name, func(t *testing.T) {
			n, err := Open(cfg)
			if err == nil {
				n.Close()
				t.Fatal("opened")
			}
		})
	}
	// What the failed opens had taken is free again.
	again := testConfig(t.TempDir(), "boot-a")
	again.RaftBind = gossip.RaftBind
	open(t, again).Close()
}

// A wall clock that steps ahead is held back: the stamps keep the
// monotonic clock's pace until a correction takes the step out, or, when
// none comes, for the grace; a correction that sets the clock on (its
// probes found it behind) is followed at once.
func TestStampsHoldBackAStepAheadForTheGrace(t *testing.T) {
	wall := &steppedClock{t: time.Now()}
	var mono, off time.Duration
	s := stampClock{clock: correctedClock{wall, &off}, offset: func() time.Duration { return off },
		mono: func() time.Duration { return mono }, stepGrace: 10 * time.Second}
	first := s.next(0)
	tick := func(d time.Duration) { mono += d; wall.t = wall.t.Add(d) }
	tick(time.Second)
	wall.t = wall.t.Add(time.Minute)
	if got := s.next(0); got != first+1000 {
		t.Fatalf("right after a step a minute ahead: stamp %d, want %d", got, first+1000)
	}
	tick(time.Second)
	if got := s.peek(0); got != first+2000 {
		t.Fatalf("a second later: time %d, want %d", got, first+2000)
	}
	// The probes show the step.
	off = -time.Minute
	tick(time.Second)
	if got := s.next(0); got != first+3000 {
		t.Fatalf("after the correction: stamp %d, want %d", got, first+3000)
	}
	// The probes find the clock behind by 5 s: followed at once.
	off += 5 * time.Second
	tick(time.Second)
	if got := s.next(0); got != first+9000 {
		t.Fatalf("after a correction setting the clock on: stamp %d, want %d", got, first+9000)
	}
	// A step no correction follows is taken after the grace.
	wall.t = wall.t.Add(time.Minute)
	tick(time.Second)
	held := s.next(0)
	tick(10 * time.Second)
	if got := s.next(0); got != held+time.Minute.Milliseconds()+10_000 {
		t.Fatalf("after the grace: stamp %d, want %d", got, held+time.Minute.Milliseconds()+10_000)
	}
}

// A state file or Raft log shorter than its pages (a copy cut short, a
// full disk) stops the start with an error naming the file, instead of a
// memory fault when bbolt reads past its end.
func TestTruncatedFilesAreRefusedOnStart(t *testing.T) {
	for _, file := range []string{"state.db", filepath.Join("raft", "raft.db")} {
		t.Run(file, func(t *testing.T) {
			dir := t.TempDir()
			n := open(t, testConfig(dir, "boot-a"))
			for i := 0; i < 50; i++ {
				acquire(t, n, "k"+strconv.Itoa(i))
			}
			if err := n.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, file)
			if err := os.Truncate(path, 8192); err != nil {
				t.Fatal(err)
			}
			n, err := Open(testConfig(dir, "boot-a"))
			if err == nil {
				n.Close()
				t.Fatal("a truncated file was opened")
			}
			if !errors.Is(err, fsm.ErrTruncated) || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want it to say that %s is truncated", err, path)
			}
			if fi, err := os.Stat(path); err != nil || fi.Size() != 8192 {
				t.Fatalf("the truncated file was touched: %v %v", fi, err)
			}
		})
	}
}

// A damaged newest snapshot, with the log compacted past the older one,
// stops the start with an error naming it, instead of a panic in raft when
// it replays the log from the older snapshot.
func TestDamagedSnapshotBeforeACompactedLogIsRefused(t *testing.T) {
	for name, damage := range map[string]func(snap string) error{
		"garbage meta.json": func(snap string) error {
			return os.WriteFile(filepath.Join(snap, "meta.json"), []byte("garbage"), 0o600)
		},
		"state.bin missing":  func(snap string) error { return os.Remove(filepath.Join(snap, "state.bin")) },
		"state.bin is short": func(snap string) error { return os.Truncate(filepath.Join(snap, "state.bin"), 100) },
	} {
		for _, kept := range []bool{true, false} {
			t.Run(name+" kept="+strconv.FormatBool(kept), func(t *testing.T) {
				dir := t.TempDir()
				cfg := testConfig(dir, "boot-a")
				cfg.TrailingLogs = 1
				n := open(t, cfg)
				for round := range 2 {
					for i := 0; i < 5; i++ {
						acquire(t, n, "k"+strconv.Itoa(round)+"-"+strconv.Itoa(i))
					}
					if err := n.Snapshot(); err != nil {
						t.Fatal(err)
					}
				}
				acquire(t, n, "last")
				metas, err := n.snaps.List()
				if err != nil || len(metas) != 2 {
					t.Fatalf("snapshots: %v %v", metas, err)
				}
				if err := n.Close(); err != nil {
					t.Fatal(err)
				}
				if !kept { // the state file is rebuilt from a snapshot
					if err := os.Remove(filepath.Join(dir, "state.db.marker")); err != nil {
						t.Fatal(err)
					}
				}
				if err := damage(filepath.Join(raftDirOf(dir), "snapshots", metas[0].ID)); err != nil {
					t.Fatal(err)
				}
				if kept && name != "garbage meta.json" {
					// Raft does not read the data of the snapshot it
					// starts from when the state file is kept.
					n = open(t, cfg)
					defer n.Close()
					var ok bool
					_ = n.Read(context.Background(), func(v *fsm.View) error { _, ok = v.Key("default", "last"); return nil })
					if !ok {
						t.Fatal("the kept state lost its last write")
					}
					return
				}
				n, err = Open(cfg)
				if err == nil {
					n.Close()
					t.Fatal("opened")
				}
				if !strings.Contains(err.Error(), metas[0].ID) {
					t.Fatalf("err = %v, want it to name snapshot %s", err, metas[0].ID)
				}
			})
		}
	}
}
