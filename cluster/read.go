package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// Read runs fn on a view that reflects every write acknowledged before Read
// was called (the read-index protocol). The leader notes its commit index
// once its term is established, confirms that it still leads and waits until
// its state machine has applied that index. A follower asks the leader for
// that index and waits until its own state machine has applied it.
func (n *Node) Read(ctx context.Context, fn func(v *fsm.View) error) error {
	index, err := n.readIndex(ctx)
	if err != nil {
		return err
	}
	if err := n.fsm.WaitApplied(ctx, index); err != nil {
		return err
	}
	return n.fsm.View(fn)
}

// ReadStale runs fn on this node's state as it is, without asking the
// leader: fast, available during partitions, possibly behind.
func (n *Node) ReadStale(_ context.Context, fn func(v *fsm.View) error) error {
	return n.fsm.View(fn)
}

func (n *Node) readIndex(ctx context.Context) (uint64, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		addr, id, err := n.awaitLeader(ctx)
		if err != nil {
			return 0, err
		}
		if id == raft.ServerID(n.cfg.NodeID) {
			return n.readIndexLocal(ctx)
		}
		var reply ReadIndexReply
		rctx, done := n.leaderBound(ctx, addr)
		err = n.peers.call(rctx, string(addr), "ReadIndex", ReadIndexArgs{Deadline: deadlineOf(ctx), Timeout: timeoutOf(ctx)}, &reply)
		done()
		if err != nil {
			// Asking the new leader again is safe: nothing was written.
			if n.retryUndelivered(ctx, err, start) || errors.As(err, new(leaderMoved)) && ctx.Err() == nil {
				continue
			}
			return 0, err
		}
		if reply.Err == nil {
			return reply.Index, nil
		}
		// A server that does not lead (yet, or any more), or shuts down,
		// cannot answer: the leader is asked again, as a forwarded
		// command is (Propose), once the leader changes.
		gone := reply.Err.Code == errcode.NotLeader.Code || reply.Err.Code == errcode.ShuttingDown.Code
		if !(attempt < 3 || gone && time.Since(start) < n.cfg.LeaderWait) || !n.pauseForLeader(ctx, askAgainPause(attempt)) {
			return 0, reply.Err
		}
	}
}

// readIndexLocal is the leader's side: an index covering every write
// acknowledged before the call, already applied here.
func (n *Node) readIndexLocal(ctx context.Context) (uint64, error) {
	if err := n.awaitReadable(ctx); err != nil {
		return 0, err
	}
	index := n.raft.CommitIndex()
	if err := n.verifyLeader(ctx); err != nil {
		return 0, err
	}
	if err := n.waitApplied(ctx, index); err != nil {
		return 0, err
	}
	return n.fsm.Applied(), nil
}

// verifyLeader confirms with a quorum that this node still leads, giving up
// when ctx ends or the node shuts down rather than trusting raft to answer.
func (n *Node) verifyLeader(ctx context.Context) error {
	done := make(chan error, 1)
	// Close lets raft answer the verification before it shuts raft down
	// (drainCalls), and only then waits for this goroutine.
	if !n.spawn(func() {
		_, err := n.await(func() raft.Future { return n.raft.VerifyLeader() })
		done <- err
	}) {
		return shuttingDown()
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("cluster: confirming leadership: %w", ctx.Err())
	case <-n.done:
		return shuttingDown()
	}
}

// awaitReadable waits until this node has established its term.
func (n *Node) awaitReadable(ctx context.Context) error {
	for {
		n.watchMu.Lock()
		ch := n.leaderCh
		n.watchMu.Unlock()
		if !n.leader.Load() {
			return n.notLeader()
		}
		if n.readyTerm.Load() == n.raft.CurrentTerm() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("cluster: waiting for the leader's term to be established: %w", ctx.Err())
		case <-n.done:
			return shuttingDown()
		}
	}
}

// waitApplied waits for the state machine to reach index. Raft hands the
// state machine commands and configuration changes but not its own no-op
// entries; should index be such an entry, a no-op command settles the wait,
// since the state machine applies it after everything before it.
func (n *Node) waitApplied(ctx context.Context, index uint64) error {
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	err := n.fsm.WaitApplied(short, index)
	cancel()
	if err == nil || ctx.Err() != nil {
		return err
	}
	_, err = n.proposeLocal(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}})
	return err
}
