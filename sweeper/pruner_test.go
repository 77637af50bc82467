package sweeper

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

type countingPass struct{ n atomic.Int64 }

func (c *countingPass) Prune(context.Context) (*wire.UTXOPruneResponse, error) {
	c.n.Add(1)
	return &wire.UTXOPruneResponse{}, nil
}

type dueFlag struct{ due atomic.Bool }

func (d *dueFlag) PruneDue() bool { return d.due.Load() }

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
