package sweeper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

// countingPass counts passes; each answers *res (when set).
type countingPass struct {
	n   atomic.Int64
	res atomic.Pointer[wire.UTXOPruneResponse]
}

func (c *countingPass) Prune(context.Context) (*wire.UTXOPruneResponse, error) {
	c.n.Add(1)
	if r := c.res.Load(); r != nil {
		out := *r
		return &out, nil
	}
	return &wire.UTXOPruneResponse{}, nil
}

type dueFlag struct {
	due  atomic.Bool
	mark atomic.Value // string
}

func (d *dueFlag) PruneDue() (bool, string) {
	m, _ := d.mark.Load().(string)
	return d.due.Load(), m
}

// waitPasses waits until pass has run at least n passes.
func waitPasses(t *testing.T, pass *countingPass, n int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); pass.n.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d prune passes after 5s, want %d", pass.n.Load(), n)
		}
	}
}

// A cycle of passes that only kept transactions (children not yet
// stable) is not repeated every interval while the chain stands still:
// an idle island would commit a prune entry per interval forever. The next
// block, or the bound on idle intervals, brings the next pass.
func TestAPrunerThatOnlyKeptTransactionsWaitsForTheChain(t *testing.T) {
	pass, due := &countingPass{}, &dueFlag{}
	due.due.Store(true)
	due.mark.Store("10/a")
	pass.res.Store(&wire.UTXOPruneResponse{Examined: 3, Retained: wire.UTXORetained{UnminedChild: 3}, Wrapped: true})
	const interval = 10 * time.Millisecond
	p := NewPruner(pass, due, interval, nil)
	defer p.Stop()
	began := time.Now()
	p.SetLeader(true)
	// A leader's first cycle counts as work (it may have begun under an
	// earlier leader): the second is the one that only kept transactions.
	waitPasses(t, pass, 2)
	if took := time.Since(began); took >= idleIntervals*interval/2 {
		t.Fatalf("a new leader's second pass came after %v: its first cycle was taken for idle", took)
	}
	time.Sleep(8 * interval) // no pass may run
	if n := pass.n.Load(); n != 2 {
		t.Fatalf("%d passes over an unchanged chain after a cycle that only kept transactions, want 2", n)
	}
	due.mark.Store("11/b") // a block
	waitPasses(t, pass, 3)
	// A pass that pruned something keeps the pruner going.
	pass.res.Store(&wire.UTXOPruneResponse{Examined: 1, Pruned: []string{"00"}, Wrapped: true})
	due.mark.Store("12/c")
	waitPasses(t, pass, 5)
	// Idle again: the bound on idle intervals still brings a pass.
	pass.res.Store(&wire.UTXOPruneResponse{Examined: 3, Retained: wire.UTXORetained{UnminedChild: 3}, Wrapped: true})
	n := pass.n.Load()
	waitPasses(t, pass, n+2)
	start := time.Now()
	waitPasses(t, pass, n+3)
	if took := time.Since(start); took < idleIntervals*interval/2 {
		t.Fatalf("an idle pruner ran again after %v, want about %v", took, idleIntervals*interval)
	}
}

// The pruner proposes passes only while it leads and something is due,
// and its goroutine is gone once leadership is lost.
func TestPrunerRunsOnlyOnTheLeaderWhileWorkIsDue(t *testing.T) {
	pass, due := &countingPass{}, &dueFlag{}
	p := NewPruner(pass, due, 5*time.Millisecond, nil)
	defer p.Stop()
	due.due.Store(true)
	time.Sleep(30 * time.Millisecond) // not leading: nothing may happen
	if pass.n.Load() != 0 || p.Running() {
		t.Fatal("a pruner that does not lead ran a pass")
	}
	p.SetLeader(true)
	for deadline := time.Now().Add(5 * time.Second); pass.n.Load() < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no passes on the leader")
		}
	}
	due.due.Store(false)
	time.Sleep(20 * time.Millisecond) // a pass in flight finishes
	n := pass.n.Load()
	time.Sleep(50 * time.Millisecond)
	if pass.n.Load() != n {
		t.Fatal("passes without anything due")
	}
	p.SetLeader(false)
	select {
	case <-p.Stopped():
	case <-time.After(5 * time.Second):
		t.Fatal("the pruner goroutine outlived leadership")
	}
}

// scriptedPass answers the passes in turn from script (the last one
// over and over), calling each answer's after, when set, before it
// returns it.
type scriptedPass struct {
	n      atomic.Int64
	script []scripted
}

type scripted struct {
	res   wire.UTXOPruneResponse
	after func()
}

func (s *scriptedPass) Prune(context.Context) (*wire.UTXOPruneResponse, error) {
	i := min(int(s.n.Add(1))-1, len(s.script)-1)
	if f := s.script[i].after; f != nil {
		f()
	}
	out := s.script[i].res
	return &out, nil
}

// A cycle of passes over which the chain moved on was not judged by one
// chain: the transactions its first passes kept may be prunable on the
// chain its last pass saw. It is no reason to wait for the next block.
func TestAPrunerWhoseCycleSawTheChainMoveDoesNotWait(t *testing.T) {
	due := &dueFlag{}
	due.due.Store(true)
	due.mark.Store("10/a")
	kept := wire.UTXOPruneResponse{Examined: 3, Retained: wire.UTXORetained{UnstableChild: 3}}
	wrapped := kept
	wrapped.Wrapped = true
	pass := &scriptedPass{script: []scripted{
		{res: wrapped}, // the leader's first cycle, which counts as work anyway
		{res: kept, after: func() { due.mark.Store("11/b") }}, // a block during the next cycle's first pass
		{res: wrapped},
	}}
	const interval = 10 * time.Millisecond
	p := NewPruner(pass, due, interval, nil)
	defer p.Stop()
	p.SetLeader(true)
	for deadline := time.Now().Add(idleIntervals * interval / 2); pass.n.Load() < 4; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d passes: the cycle that began on another chain than it ended on is not judged again", pass.n.Load())
		}
	}
}
