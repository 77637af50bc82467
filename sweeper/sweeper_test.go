package sweeper

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"go.uber.org/goleak"

	"github.com/raftlockd/raftlockd/fsm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type wall struct{}

func (wall) Now() time.Time { return time.Now() }

// direct applies commands straight to a real state machine, standing in for
// a one-node Raft log.
type direct struct {
	mu    sync.Mutex
	f     *fsm.FSM
	index uint64
	ops   []fsm.Op
}

func (d *direct) Propose(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	c.Now = time.Now().UnixMilli()
	data, err := fsm.Encode(c)
	if err != nil {
		return nil, err
	}
	d.index++
	d.ops = append(d.ops, c.Op)
	res := d.f.ApplyBatch([]*raft.Log{{Index: d.index, Term: 1, Type: raft.LogCommand, Data: data}})[0].(*fsm.Result)
	return res, res.Error()
}

func (d *direct) sweeps() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, op := range d.ops {
		if op == fsm.OpSweep {
			n++
		}
	}
	return n
}

func setup(t *testing.T) (*direct, *Sweeper) {
	t.Helper()
	return setupWith(t, Config{TxnRetention: time.Minute, Idle: time.Hour})
}

func setupWith(t *testing.T, cfg Config) (*direct, *Sweeper) {
	t.Helper()
	d := &direct{}
	sw := New(d, nil, wall{}, cfg)
	f, err := fsm.Open(filepath.Join(t.TempDir(), "state.db"), fsm.Options{Observers: []fsm.Observer{sw}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sw.Stop(); f.Close() })
	d.f = f
	sw.schedule = f
	return d, sw
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSweeperExpiresLeasesAtTheirDeadlineOnlyWhileLeading(t *testing.T) {
	d, sw := setup(t)
	sw.SetLeader(true)
	waitFor(t, "the first sweep of the term", func() bool { return d.sweeps() == 1 })

	// Nothing is due: the sweeper parks until its idle limit (an hour)
	// instead of proposing.
	waitFor(t, "the sweeper to plan its idle wake-up", func() bool { return sw.planned.Load() != math.MaxInt64 })
	if wake := time.UnixMilli(sw.planned.Load()); time.Until(wake) < 30*time.Minute {
		t.Fatalf("idle sweeper plans to wake at %s", wake)
	}
	if n := d.sweeps(); n != 1 {
		t.Fatalf("idle sweeper proposed %d sweeps", n)
	}

	// A lease expiring in 300ms is swept at about that time, not before.
	granted := time.Now()
	if _, err := d.Propose(context.Background(), &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: "k", Owner: "o", TxnID: "t", LeaseID: "l", RequestID: "r", TTL: 300}}); err != nil {
		t.Fatal(err)
	}
	held := func() bool {
		var rec fsm.KeyRecord
		_ = d.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k"); return nil })
		return rec.Lease != nil
	}
	waitFor(t, "the lease to expire", func() bool { return !held() })
	if after := time.Since(granted); after < 300*time.Millisecond || after > 1500*time.Millisecond {
		t.Fatalf("lease expired after %s, want about 300ms", after)
	}

	// Once leadership is lost the sweeper stops at once and proposes nothing,
	// even when leases fall due.
	sw.SetLeader(false)
	select {
	case <-sw.Stopped():
	case <-time.After(time.Second):
		t.Fatal("the sweep loop did not exit after leadership was lost")
	}
	if sw.Running() {
		t.Fatal("the sweeper reports a running loop after it exited")
	}
	before := d.sweeps()
	if _, err := d.Propose(context.Background(), &fsm.Command{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{
		Namespace: "default", Key: "k2", Owner: "o", TxnID: "t2", LeaseID: "l2", RequestID: "r2", TTL: 50}}); err != nil {
		t.Fatal(err)
	}
	// The lease falls due: a leader's loop would sweep now, a stopped one
	// never does.
	waitFor(t, "the lease to fall due", func() bool {
		when, ok := d.f.NextDeadline(time.Minute.Milliseconds())
		return ok && when <= time.Now().UnixMilli()
	})
	if sw.Running() || d.sweeps() != before {
		t.Fatal("a follower swept")
	}

	// A new term sweeps what fell due meanwhile.
	sw.SetLeader(true)
	waitFor(t, "the new leader to sweep", func() bool {
		var rec fsm.KeyRecord
		_ = d.f.View(func(v *fsm.View) error { rec, _ = v.Key("default", "k2"); return nil })
		return rec.Lease == nil
	})
}

func TestStoppedSweeperIgnoresLeadership(t *testing.T) {
	d, sw := setup(t)
	sw.Stop()
	sw.SetLeader(true)
	// SetLeader decides synchronously; a loop it started would run until
	// leadership is lost, so it would show here.
	if sw.Running() || d.sweeps() != 0 {
		t.Fatal("stopped sweeper started")
	}
	select {
	case <-sw.Stopped():
	default:
		t.Fatal("a stopped sweeper has a loop that has not exited")
	}
}

func TestRunningFollowsTheLoopGoroutine(t *testing.T) {
	d, sw := setup(t)
	if sw.Running() {
		t.Fatal("a new sweeper reports a running loop")
	}
	// A proposal in flight when leadership is lost is waited for: the loop
	// counts as running until the proposal has been answered.
	block := make(chan struct{})
	entered := make(chan struct{}, 1)
	sw.proposer = proposerFunc(func(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
		select {
		case entered <- struct{}{}:
		default:
		}
		<-block
		return d.Propose(ctx, c)
	})
	sw.SetLeader(true)
	<-entered
	sw.SetLeader(false)
	if !sw.Running() {
		t.Fatal("the loop reports stopped while its proposal is still in flight")
	}
	select {
	case <-sw.Stopped():
		t.Fatal("Stopped closed while a proposal was in flight")
	default:
	}
	close(block)
	select {
	case <-sw.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not exit once its proposal was answered")
	}
	if sw.Running() {
		t.Fatal("the loop reports running after it exited")
	}
}

type proposerFunc func(ctx context.Context, c *fsm.Command) (*fsm.Result, error)

func (f proposerFunc) Propose(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
	return f(ctx, c)
}

// upgrade is a Formats over the real state machine whose servers all apply
// this build's format once every is set.
type upgrade struct {
	f     *fsm.FSM
	every atomic.Bool
}

func (u *upgrade) Rules() int               { return u.f.Rules() }
func (u *upgrade) EveryServerApplies() bool { return u.every.Load() }

// The island adopts this build's rules through a sweep, once every server
// applies its format, and not before: an older build would stop at it.
func TestSweepRaisesTheRulesOnceEveryServerApplies(t *testing.T) {
	d, sw := setup(t)
	u := &upgrade{f: d.f}
	sw.cfg.Formats, sw.cfg.Idle = u, 20*time.Millisecond
	sw.SetLeader(true)
	waitFor(t, "the first sweep of the term", func() bool { return d.sweeps() == 1 })
	// Idle wake-ups while a server lags propose nothing.
	waitFor(t, "a few idle wake-ups", func() bool {
		p := sw.planned.Load()
		return p != math.MaxInt64 && time.UnixMilli(p).Before(time.Now())
	})
	if n, rules := d.sweeps(), d.f.Rules(); n != 1 || rules >= fsm.EntryFormat {
		t.Fatalf("%d sweeps, rules %d, while a server lags", n, rules)
	}
	u.every.Store(true)
	waitFor(t, "the rules to be raised", func() bool { return d.f.Rules() == fsm.EntryFormat })
	// Raised once: no sweep after it is proposed for the format's sake.
	n := d.sweeps()
	for i := 0; i < 3; i++ {
		p := sw.planned.Load()
		waitFor(t, "an idle wake-up", func() bool { return sw.planned.Load() != p })
	}
	if got := d.sweeps(); got != n {
		t.Fatalf("%d more sweeps after the rules were raised", got-n)
	}
}

// Decisions whose retention ends one after another are forgotten together:
// a steady stream of transactions does not have the sweeper propose a
// sweep entry for each of them.
func TestDecisionsPastTheirRetentionAreForgottenTogether(t *testing.T) {
	d, sw := setupWith(t, Config{TxnRetention: 500 * time.Millisecond, Idle: 300 * time.Millisecond})
	sw.SetLeader(true)
	waitFor(t, "the first sweep of the term", func() bool { return d.sweeps() == 1 })
	const txns = 20
	for i := range txns {
		k, txn := fmt.Sprint("k", i), fmt.Sprint("t", i)
		for _, c := range []*fsm.Command{
			{Op: fsm.OpAcquire, Acquire: &fsm.AcquireCmd{Namespace: "default", Key: k, Owner: "o", TxnID: txn, LeaseID: "l" + k, RequestID: "r" + k, TTL: 60_000}},
			{Op: fsm.OpRelease, Release: &fsm.ReleaseCmd{Namespace: "default", Key: k, LeaseID: "l" + k, TxnID: txn}},
		} {
			if _, err := d.Propose(context.Background(), c); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond) // one decision every 10 ms
	}
	waitFor(t, "the decisions to be forgotten", func() bool {
		forgotten := true
		_ = d.f.View(func(v *fsm.View) error {
			for i := range txns {
				forgotten = forgotten && v.Txn(fmt.Sprint("t", i)) == nil
			}
			return nil
		})
		return forgotten
	})
	if n := d.sweeps() - 1; n > 3 {
		t.Fatalf("%d sweeps forgot %d decisions that fell due within %v", n, txns, txns*10*time.Millisecond)
	}
}
