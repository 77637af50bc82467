package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
)

// errLeaderMoved ends a forwarded call whose target no longer leads.
var errLeaderMoved = errors.New("cluster: the leader changed")

// leaderMoved is the answer to a request that was forwarded to a leader
// which was replaced (or lost) before it answered: the request may or may
// not have been applied, so it is reported as unavailable, to be retried
// by the client if it is safe to.
type leaderMoved struct{ err *errcode.Error }

func (l leaderMoved) Error() string { return l.err.Error() }
func (l leaderMoved) Unwrap() error { return l.err }

// leaderBound returns a context that ends with ctx, or a heartbeat timeout
// after this node learns of a leader other than addr, or once it has known
// no leader at all for LeaderWait. A request forwarded to a leader that vanished without closing
// its connections (a host that went away, a cut network, a paused process)
// would otherwise wait for an answer until the client gave up, long after
// a new leader was elected.
func (n *Node) leaderBound(ctx context.Context, addr raft.ServerAddress) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancelCause(ctx)
	go func() {
		var leaderless *time.Timer
		defer func() {
			if leaderless != nil {
				leaderless.Stop()
			}
		}()
		for {
			n.watchMu.Lock()
			ch := n.leaderCh
			n.watchMu.Unlock()
			var expired <-chan time.Time
			switch cur, _ := n.raft.LeaderWithID(); {
			case cur != "" && cur != addr:
				// An old leader that is still there answers within moments
				// (with the result, or that it lost leadership); one that
				// is gone never will.
				grace := time.NewTimer(n.cfg.HeartbeatTimeout)
				defer grace.Stop()
				select {
				case <-grace.C:
					cancel(errLeaderMoved)
				case <-bctx.Done():
				case <-n.done:
				}
				return
			case cur == "":
				if leaderless == nil {
					leaderless = time.NewTimer(n.cfg.LeaderWait)
				}
				expired = leaderless.C
			default:
				if leaderless != nil {
					leaderless.Stop()
					leaderless = nil
				}
			}
			select {
			case <-ch:
			case <-expired:
				cancel(errLeaderMoved)
				return
			case <-bctx.Done():
				return
			case <-n.done:
				return
			}
		}
	}()
	return bctx, func() { cancel(nil) }
}

// WhileLeads returns a context that ends with ctx, or a heartbeat timeout
// after this node learns that id no longer leads (at once when id does not
// lead now), as leaderBound's: for a request handed to that leader over
// another channel (its API) than Raft's.
func (n *Node) WhileLeads(ctx context.Context, id string) (context.Context, context.CancelFunc) {
	addr, lid := n.raft.LeaderWithID()
	if lid == "" || string(lid) != id {
		gone, cancel := context.WithCancelCause(ctx)
		cancel(errLeaderMoved)
		return gone, func() {}
	}
	return n.leaderBound(ctx, addr)
}

// movedError is what a call abandoned by leaderBound returns.
func movedError(method, addr string) error {
	e := errcode.Unavailable.With("%s to %s: the leader changed while the request was in flight; retry it", method, addr)
	e.RetryAfter = 1
	return leaderMoved{e}
}
