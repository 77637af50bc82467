package cluster

import (
	"bytes"
	"context"
	"errors"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// holdRestore holds the state machine of node (once set) in its restore
// until released, telling restored when it gets there.
type holdRestore struct {
	mu       sync.Mutex
	node     string
	restored chan struct{}
	release  chan struct{}
}

func (h *holdRestore) on(id string) fsm.Observer { return restoreObserver{h, id} }

type restoreObserver struct {
	h  *holdRestore
	id string
}

func (o restoreObserver) Observe(events []fsm.Event) {
	o.h.mu.Lock()
	held := o.h.node == o.id
	o.h.mu.Unlock()
	if held && len(events) == 1 && events[0].Kind == fsm.EventRestored {
		close(o.h.restored)
		<-o.h.release
	}
}

// A leader that restored the snapshot but lost the cluster before the
// restore was replicated does not answer not_leader, which tells a client
// that nothing happened and has it send the snapshot to the next leader:
// the restore is of an unknown outcome.
func TestARestoreTheLeaderInstalledButLostTheClusterOverIsOfAnUnknownOutcome(t *testing.T) {
	hold := &holdRestore{restored: make(chan struct{}), release: make(chan struct{})}
	nodes := startStatic(t, 3, func(c *Config) {
		c.FSM.Observers = append(c.FSM.Observers, hold.on(c.NodeID))
	})
	leader := leaderOf(t, nodes)
	acquire(t, leader, "k")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, rc, err := leader.SaveSnapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	snap, err := io.ReadAll(rc)
	rc.Close()
	if err != nil {
		t.Fatal(err)
	}
	before := leader.raft.LastIndex()

	hold.mu.Lock()
	hold.node = leader.ID()
	hold.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := leader.Restore(ctx, bytes.NewReader(snap))
		done <- err
	}()
	select {
	case <-hold.restored:
	case err := <-done:
		t.Fatalf("the restore ended before the state machine restored: %v", err)
	case <-ctx.Done():
		t.Fatal("the leader's state machine never restored")
	}
	for _, f := range followers(nodes, leader) {
		f.Close()
	}
	// The leader learns it lost the cluster once its lease has run out
	// with no follower heard from.
	time.Sleep(4 * leader.cfg.LeaderLeaseTimeout)
	close(hold.release)
	err = <-done
	if snaps, lerr := leader.snaps.List(); lerr != nil || len(snaps) == 0 || snaps[0].Index <= before {
		t.Fatalf("the leader did not keep the restored snapshot (last index before %d): %v %v", before, snaps, lerr)
	}
	var e *errcode.Error
	if !errors.As(err, &e) || e.Code != errcode.Unavailable.Code {
		t.Fatalf("a restore installed on the leader alone answers %v, want %s", err, errcode.Unavailable.Code)
	}
}
