package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// awaitLeader returns the current leader's Raft address and id. While the
// cluster has none it waits up to LeaderWait, then answers no_leader.
func (n *Node) awaitLeader(ctx context.Context) (raft.ServerAddress, raft.ServerID, error) {
	deadline := time.NewTimer(n.cfg.LeaderWait)
	defer deadline.Stop()
	for {
		n.watchMu.Lock()
		ch := n.leaderCh
		n.watchMu.Unlock()
		if n.leader.Load() {
			return n.transport.LocalAddr(), raft.ServerID(n.cfg.NodeID), nil
		}
		if addr, id := n.raft.LeaderWithID(); addr != "" {
			return addr, id, nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			e := errcode.NoLeader.With("no leader elected within %s", n.cfg.LeaderWait)
			e.RetryAfter = 1
			return "", "", e
		case <-ctx.Done():
			return "", "", fmt.Errorf("cluster: waiting for a leader: %w", ctx.Err())
		case <-n.done:
			return "", "", shuttingDown()
		}
	}
}

func newBackendHash() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func shuttingDown() *errcode.Error {
	e := errcode.ShuttingDown.With("node is shutting down")
	e.RetryAfter = 1
	return e
}

// notLeader is the answer of a node that was asked to lead but does not.
func (n *Node) notLeader() *errcode.Error {
	e := errcode.NotLeader.With("node %s is not the leader", n.cfg.NodeID)
	if _, id := n.raft.LeaderWithID(); id != "" {
		e.LeaderEndpoint = n.APIEndpoint(string(id))
	}
	e.RetryAfter = 1
	return e
}

// establish commits a no-op command at the start of a term. Once it is
// applied, every entry committed by earlier leaders is applied too, so
// reads in this term cannot miss an acknowledged write.
func (n *Node) establish(term uint64) {
	defer n.wg.Done()
	for n.leader.Load() && n.raft.CurrentTerm() == term {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := n.proposeLocal(ctx, &fsm.Command{Op: fsm.OpNoop, Noop: &fsm.NoopCmd{}})
		cancel()
		if err == nil && n.fsm.BackendHash() == "" {
			// The first leader of a new island names it, once.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = n.proposeLocal(ctx, &fsm.Command{Op: fsm.OpSetBackend, SetBackend: &fsm.SetBackendCmd{Hash: newBackendHash()}})
			cancel()
		}
		if err == nil {
			n.readyTerm.Store(term)
			n.kickLeaderWaiters()
			return
		}
		select {
		case <-n.done:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Propose replicates cmd and returns its result once applied on the leader.
// On a follower the command is forwarded to the leader over the cluster
// port with the caller's deadline. A rejected command comes back as both a
// Result and its *errcode.Error.
func (n *Node) Propose(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	start := time.Now()
	for attempt := 0; ; attempt++ {
		addr, id, err := n.awaitLeader(ctx)
		if err != nil {
			return nil, err
		}
		if id == raft.ServerID(n.cfg.NodeID) {
			res, err := n.proposeLeading(ctx, cmd)
			// It stopped leading before proposing anything (it handed
			// its leadership over): the new leader takes the command.
			if refused(res, err) && attempt < 3 && sleepCtx(ctx, n.done, 20*time.Millisecond) {
				continue
			}
			return res, err
		}
		data, err := fsm.Encode(cmd)
		if err != nil {
			return nil, err
		}
		var reply ProposeReply
		// The call is abandoned if the leader changes while it waits for
		// an answer; the caller learns that the outcome is unknown.
		fctx, done := n.leaderBound(ctx, addr)
		err = n.peers.call(fctx, string(addr), "Propose", ProposeArgs{Command: data, Deadline: deadlineOf(ctx), Timeout: timeoutOf(ctx)}, &reply)
		done()
		if err != nil {
			if n.retryUndelivered(ctx, err, start) {
				continue
			}
			// A withdrawal of the request waits for the leader's answer
			// to it only while that leader leads.
			var u unanswered
			if errors.As(err, &u) {
				u.n, u.addr = n, addr
				err = u
			}
			return nil, err
		}
		reply.Err = reply.err()
		// The node we reached stopped leading, or is shutting down, before
		// proposing anything: ask again who leads, at once when that
		// changes, until LeaderWait has passed since start (a leader that
		// shuts down leads until it has stopped, and the next one is
		// elected only then).
		if reply.Err != nil && reply.Err.Code == errcode.NotLeader.Code && (attempt < 3 || time.Since(start) < n.cfg.LeaderWait) {
			if !n.pauseForLeader(ctx, askAgainPause(attempt)) {
				return nil, reply.Err
			}
			continue
		}
		n.metrics.forwarded.Inc()
		if reply.Err != nil {
			return reply.Result, reply.Err
		}
		if reply.Result == nil {
			return nil, errcode.Internal.With("leader gave no result for %s", cmd.Op)
		}
		return reply.Result, nil
	}
}

// proposeLeading is proposeLocal on a server that may be handing its
// leadership over: raft refuses commands while the transfer runs, and one
// it refused is proposed again once the transfer has ended (bounded by the
// election timeout), here when it failed and this server still leads, and
// otherwise refused as not_leader, which the caller takes to the new
// leader.
func (n *Node) proposeLeading(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	start := time.Now()
	for {
		res, err := n.proposeLocal(ctx, cmd)
		var h handingOver
		if !errors.As(err, &h) {
			return res, err
		}
		if time.Since(start) >= n.cfg.LeaderWait || !sleepCtx(ctx, n.done, 10*time.Millisecond) {
			return res, err
		}
	}
}

// closingRefusal is a closing node's refusal of a request to raft, made
// before raft took anything: a command refused so was not proposed.
type closingRefusal struct{ err *errcode.Error }

func (c closingRefusal) Error() string { return c.err.Error() }
func (c closingRefusal) Unwrap() error { return c.err }

// handingOver is raft's refusal of a command while this server hands its
// leadership over: the command was not proposed.
type handingOver struct{ err *errcode.Error }

func (h handingOver) Error() string { return h.err.Error() }
func (h handingOver) Unwrap() error { return h.err }

// refused tells whether a proposal failed with not_leader: this server no
// longer led, so nothing was proposed.
func refused(res *fsm.Result, err error) bool {
	var e *errcode.Error
	return res == nil && errors.As(err, &e) && e.Code == errcode.NotLeader.Code
}

// retryUndelivered decides whether a request that never reached the leader
// (which may be gone) is tried again: yes while LeaderWait has not passed
// since start, after a pause in which a new leader may be elected.
func (n *Node) retryUndelivered(ctx context.Context, err error, start time.Time) bool {
	var nd notDelivered
	if !errors.As(err, &nd) || time.Since(start) >= n.cfg.LeaderWait {
		return false
	}
	return sleepCtx(ctx, n.done, 50*time.Millisecond)
}

// askAgainPause is how long a server waits, at most, before it asks the
// leader again after the answer that the server it asked does not lead:
// briefly the first times, then longer (pauseForLeader ends it as soon as
// another leads).
func askAgainPause(attempt int) time.Duration {
	if attempt < 3 {
		return 20 * time.Millisecond
	}
	return 100 * time.Millisecond
}

// pauseForLeader waits d, or less when leadership changes meanwhile; false
// when ctx ends or the node closes first.
func (n *Node) pauseForLeader(ctx context.Context, d time.Duration) bool {
	n.watchMu.Lock()
	ch := n.leaderCh
	n.watchMu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	case <-n.done:
		return false
	}
}

func sleepCtx(ctx context.Context, done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-done:
		return false
	}
}

// maxPackedBytes bounds the commands the leader packs into one entry.
const maxPackedBytes = 1 << 20

// proposeLocal replicates cmd through this node, which must lead. The
// command is stamped with the leader's clock.
func (n *Node) proposeLocal(ctx context.Context, cmd *fsm.Command) (*fsm.Result, error) {
	cmd.Now = n.stamps.next(n.fsm.Now())
	data, err := fsm.Encode(cmd)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	resp, err := n.packer.propose(ctx, data)
	if err != nil {
		return nil, err
	}
	n.metrics.proposeSeconds.Observe(time.Since(start).Seconds())
	res, ok := resp.(*fsm.Result)
	if !ok || res == nil {
		return nil, errcode.Internal.With("state machine gave no result for %s", cmd.Op)
	}
	return res, res.Error()
}

// await makes one request to raft through call, unless the node is
// closing, and waits for raft's answer; Close lets such requests finish
// before it shuts raft down (drainCalls). A restore holds the gate while it
// replaces the state (backup.go): requests made before it are answered
// before it begins.
func (n *Node) await(call func() raft.Future) (raft.Future, error) {
	n.restoreMu.RLock()
	if n.closing.Load() {
		n.restoreMu.RUnlock()
		return nil, closingRefusal{shuttingDown()}
	}
	n.calls.Add(1)
	f := call()
	n.restoreMu.RUnlock()
	defer n.calls.Done()
	if err := f.Error(); err != nil {
		return f, n.raftErr(err)
	}
	return f, nil
}

func (n *Node) raftErr(err error) error {
	switch {
	case errors.Is(err, raft.ErrNotLeader):
		return n.notLeader()
	case errors.Is(err, raft.ErrLeadershipTransferInProgress):
		e := errcode.Unavailable.With("leadership is being handed over; retry it: %v", err)
		e.RetryAfter = 1
		return handingOver{e}
	case errors.Is(err, raft.ErrLeadershipLost):
		e := errcode.Unavailable.With("leadership changed while the request was in flight; retry it: %v", err)
		e.RetryAfter = 1
		return e
	case errors.Is(err, raft.ErrRaftShutdown):
		return shuttingDown()
	case errors.Is(err, raft.ErrEnqueueTimeout):
		e := errcode.Unavailable.With("replication is overloaded: %v", err)
		e.RetryAfter = 1
		return e
	}
	return fmt.Errorf("cluster: %w", err)
}

// Now is the leader's clock as commands are stamped with it: never behind
// the replicated clock, and advancing at the pace of the monotonic clock
// even if the wall clock steps back, until the peers' probes correct it.
func (n *Node) Now() time.Time { return time.UnixMilli(n.stamps.peek(n.fsm.Now())) }

// stampClock issues command timestamps (Unix ms): the members' median clock
// (clocksync.go), but never less than the replicated clock, nor than the
// previous stamp plus the monotonic time elapsed since it, less how far a
// correction since has set this node's clock back. A wall clock that steps
// back thus leaves the stamps at the monotonic clock's pace until the
// peers' probes show the step (which sets the clock on, and the stamps
// with it); the probes' noise moves the stamps by no more than itself.
// A correction that sets this node's clock back (its probes found it
// ahead) is followed (the replicated clock holds still until the median's
// time reaches it), so that stamps this node gave with a clock its probes
// have since found wrong are not carried on, this term or the next it
// leads.
//
// A wall clock that steps ahead is held back (stepGrace): the stamps go on
// from the last one that followed the clock (the anchor) at the monotonic
// clock's pace, and by what corrections since have set the clock on, until
// the peers' probes show the step (the correction then takes it out) or,
// for as long as they do not (no majority to follow), for stepGrace.
// Stamped at once, a step would cut itself off every lease's remaining
// time, for good.
type stampClock struct {
	mu        sync.Mutex
	clock     Clock
	offset    func() time.Duration // the clock's correction; nil: none
	mono      func() time.Duration // monotonic time; nil: since the first use
	stepGrace time.Duration        // how long a step ahead is held back; 0: not at all
	start     time.Time
	lastMs    int64
	lastAt    time.Duration
	lastOff   time.Duration
	issued    bool

	anchorMs  int64 // the last stamp that followed the clock, its monotonic time and correction
	anchorAt  time.Duration
	anchorOff time.Duration
	stepping  bool // the clock has been ahead of the anchor's pace since stepAt
	stepAt    time.Duration
}

const (
	clockStepGrace = 10 * time.Second       // the peers' probes show a step within a few intervals
	clockStepSlack = 100 * time.Millisecond // a step ahead by less is followed at once
)

// compute returns the stamp for now (ms), the monotonic time and the
// correction it is taken at (at, off) and, when it carries on from the
// previous stamp (carried), the monotonic time that stamp now counts as
// given at (from): its own, moved on by as much as corrections since have
// set this node's clock back. held tells a stamp that holds back a step of
// the clock ahead.
func (c *stampClock) compute(floor int64) (ms int64, at, off, from time.Duration, carried, held bool) {
	if c.mono == nil {
		c.start = time.Now()
		c.mono = func() time.Duration { return time.Since(c.start) }
	}
	at = c.mono()
	if c.offset != nil {
		off = c.offset()
	}
	ms = c.clock.Now().UnixMilli()
	if c.issued && c.stepGrace > 0 {
		limit := c.anchorMs + (at - c.anchorAt + max(0, off-c.anchorOff)).Milliseconds()
		switch {
		case ms <= limit+clockStepSlack.Milliseconds():
			c.stepping = false
		case !c.stepping:
			c.stepping, c.stepAt = true, at
			ms, held = limit, true
		case at-c.stepAt < c.stepGrace:
			ms, held = limit, true
		}
	}
	if c.issued {
		from = c.lastAt + max(0, c.lastOff-off)
		if on := c.lastMs + (at - from).Milliseconds(); on > ms {
			ms, carried = on, true
		}
	}
	if floor > ms {
		ms, carried, held = floor, false, false
	}
	return ms, at, off, from, carried, held
}

func (c *stampClock) next(floor int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms, at, off, from, carried, held := c.compute(floor)
	if carried {
		// A stamp the monotonic clock gave (the wall clock is behind):
		// the part of a millisecond it did not count is kept for the next,
		// or stamps closer than 1 ms apart would hold the clock still.
		c.lastAt = from + time.Duration(ms-c.lastMs)*time.Millisecond
		c.lastMs, c.lastOff = ms, off
	} else {
		c.lastMs, c.lastAt, c.lastOff, c.issued = ms, at, off, true
	}
	if !held {
		c.anchorMs, c.anchorAt, c.anchorOff = c.lastMs, c.lastAt, c.lastOff
	}
	return ms
}

func (c *stampClock) peek(floor int64) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ms, _, _, _, _, _ := c.compute(floor)
	return ms
}
