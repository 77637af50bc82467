package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// RemovePeer takes server id out of the voter set, through the leader. A
// leader asked to remove itself hands its leadership over first; the
// request then goes to the new leader.
func (n *Node) RemovePeer(ctx context.Context, id string) error {
	start := time.Now()
	for {
		err := n.removePeerOnce(ctx, id)
		if !errors.Is(err, errcode.NotLeader) || time.Since(start) >= n.cfg.LeaderWait || !sleepCtx(ctx, n.done, 50*time.Millisecond) {
			return err
		}
	}
}

func (n *Node) removePeerOnce(ctx context.Context, id string) error {
	addr, leader, err := n.awaitLeader(ctx)
	if errors.Is(err, errcode.NoLeader) {
		// A server removed from the configuration while it runs never
		// hears of a leader again: the members gossip knows still do.
		if a := n.leaderOfMembers(ctx); a != "" {
			addr, err = a, nil
		}
	}
	if err != nil {
		return err
	}
	if leader == raft.ServerID(n.cfg.NodeID) {
		return n.removeLocal(ctx, id)
	}
	var reply RemoveReply
	if err := n.peers.call(ctx, string(addr), "Remove", RemoveArgs{ID: id, Deadline: deadlineOf(ctx), Timeout: timeoutOf(ctx)}, &reply); err != nil {
		return err
	}
	if reply.Err != nil {
		return reply.Err
	}
	return nil
}

// leaderOfMembers asks the other servers gossip holds alive for the
// leader's Raft address; "" when none knows one.
func (n *Node) leaderOfMembers(ctx context.Context) raft.ServerAddress {
	for _, m := range n.Members() {
		if m.ID == n.cfg.NodeID || m.Status != "alive" || m.RaftAddr == "" {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := n.PeerStatus(cctx, m.RaftAddr)
		cancel()
		if err == nil && st.NodeID == m.ID && st.LeaderAddr != "" && st.LeaderAddr != n.RaftAddr() {
			return raft.ServerAddress(st.LeaderAddr)
		}
	}
	return ""
}

func (n *Node) removeLocal(ctx context.Context, id string) error { return n.remove(ctx, id, nil) }

// removeFailed removes server id, which gossip held dead with run
// deadRun long enough for the cleanup of dead servers, unless it has come
// back since: autopilot decides from the state it last gathered. The
// leader keeps out only the run that failed, so a restart that comes
// after the removal is added back.
func (n *Node) removeFailed(ctx context.Context, id, deadRun string) error {
	return n.remove(ctx, id, &deadRun)
}

// remove takes server id out of the configuration on the leader; deadRun
// is the run of a failed server (removeFailed), nil for an operator's
// removal.
func (n *Node) remove(ctx context.Context, id string, deadRun *string) error {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return n.raftErr(err)
	}
	servers := cf.Configuration().Servers
	found := false
	for _, s := range servers {
		found = found || s.ID == raft.ServerID(id)
	}
	if !found {
		return errcode.NotFound.With("server %s is not a member", id)
	}
	if onlyVoter(servers, id) {
		return errcode.LastVoter.With("server %s is the cluster's only voter", id)
	}
	if err := n.checkLiveMajority(ctx, servers, id); err != nil {
		return err
	}
	if id == n.cfg.NodeID {
		// The leader that removes a server remembers not to add it back
		// while it runs (gossip.forget); a leader that removed itself would
		// take that memory with it, and the next leader would add it
		// straight back. So the next leader removes it.
		if err := n.transferLeadership(); err != nil {
			return err
		}
		return n.notLeader()
	}
	timeout := 10 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	// Gossip may still see the server alive; the leader must not add it
	// straight back.
	if n.gossip != nil {
		if deadRun == nil {
			n.gossip.forget(id)
		} else if !n.gossip.forgetFailed(id, *deadRun) {
			return fmt.Errorf("cluster: server %s is alive again: it is not removed", id)
		}
	}
	if _, err := n.await(func() raft.Future { return n.raft.RemoveServer(raft.ServerID(id), 0, timeout) }); err != nil {
		if n.gossip != nil {
			n.gossip.unforget(id)
		}
		return err
	}
	return nil
}

// peerCheckTimeout bounds how long the leader waits for a voter to answer
// before it counts the voter as not live.
const peerCheckTimeout = 2 * time.Second

// checkLiveMajority refuses (last_voter, 409) to remove voter id when fewer
// of the remaining voters than a majority of them answer this node and
// take part in elections: the smaller configuration could commit nothing,
// not even a change back, or elect no one once its leader goes.
func (n *Node) checkLiveMajority(ctx context.Context, servers []raft.Server, id string) error {
	if !isVoter(servers, id) {
		return nil
	}
	var rest []raft.Server
	for _, s := range servers {
		if s.Suffrage == raft.Voter && s.ID != raft.ServerID(id) {
			rest = append(rest, s)
		}
	}
	need := len(rest)/2 + 1
	live := n.liveVoters(ctx, rest)
	if live < need {
		return errcode.LastVoter.With("removing %s would leave %d live voter(s) of %d, fewer than the %d a quorum needs",
			id, live, len(rest), need)
	}
	return nil
}

// liveVoters counts the servers that answer a status request and take
// part in elections (this node counts without asking). A voter catching
// up after joining answers but grants no vote; it catches up only from a
// leader, so a configuration that needs it to elect one never does.
func (n *Node) liveVoters(ctx context.Context, servers []raft.Server) int {
	ctx, cancel := context.WithTimeout(ctx, peerCheckTimeout)
	defer cancel()
	var live atomic.Int64
	var wg sync.WaitGroup
	for _, s := range servers {
		if s.ID == raft.ServerID(n.cfg.NodeID) {
			live.Add(1)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if st, err := n.PeerStatus(ctx, string(s.Address)); err == nil && !st.Joining {
				live.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(live.Load())
}

// MaxVoters is the island's voter high-water mark: the most voters its
// leaders have seen alive at once (replicated; 0 until recorded).
func (n *Node) MaxVoters() int {
	var v int
	_ = n.fsm.View(func(view *fsm.View) error { v = view.MaxVoters(); return nil })
	return v
}

// QuorumFloor is the fewest voters dead-server cleanup may leave: a
// majority of MaxVoters, or this node's configured minimum if that is more.
func (n *Node) QuorumFloor() int {
	floor := n.MaxVoters()/2 + 1
	if n.gossip != nil {
		floor = max(floor, n.gossip.cfg.MinQuorum)
	}
	return floor
}

// onlyVoter reports whether id is the one voter among servers.
func onlyVoter(servers []raft.Server, id string) bool {
	voters, self := 0, false
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters++
			self = self || s.ID == raft.ServerID(id)
		}
	}
	return self && voters == 1
}

// HandOff transfers leadership to another voter when this node leads a
// cluster of several, so that stopping it costs the others no election
// timeout. It reports whether leadership was handed over; a failure is
// logged and the caller shuts down regardless.
func (n *Node) HandOff(ctx context.Context) bool {
	if !n.IsLeader() {
		return false
	}
	servers, err := n.Servers()
	if err != nil || onlyVoter(servers, n.cfg.NodeID) || !isVoter(servers, n.cfg.NodeID) {
		return false
	}
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- n.transferLeadership() }() // raft bounds it by its election timeout
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		n.cfg.Logger.Warn("could not hand leadership over before stopping", "error", err)
		return false
	}
	n.cfg.Logger.Info("handed leadership over before stopping", "took", time.Since(start).Round(time.Millisecond))
	return true
}

func isVoter(servers []raft.Server, id string) bool {
	for _, s := range servers {
		if s.ID == raft.ServerID(id) {
			return s.Suffrage == raft.Voter
		}
	}
	return false
}

// Servers returns the Raft configuration: every member and its suffrage.
func (n *Node) Servers() ([]raft.Server, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	return cf.Configuration().Servers, nil
}

// PeerStatus asks the server at Raft address addr for its status.
func (n *Node) PeerStatus(ctx context.Context, addr string) (Status, error) {
	if addr == n.RaftAddr() {
		return n.Status(), nil
	}
	// A call given up on may still have its reply written later: st is not
	// read unless the call completed.
	var st Status
	if err := n.peers.call(ctx, addr, "Stats", StatsArgs{}, &st); err != nil {
		return Status{}, err
	}
	return st, nil
}

// Bootstrap starts a new cluster with servers as its voters. It may only be
// called on a node without Raft state; calling it on every listed server
// with the same list is as safe as calling it on one.
func (n *Node) Bootstrap(servers []raft.Server) error {
	if err := n.founded(); err != nil {
		return err
	}
	return n.raft.BootstrapCluster(raft.Configuration{Servers: servers}).Error()
}

// HasState reports whether this node has ever been part of a cluster.
func (n *Node) HasState() bool {
	return n.raft.LastIndex() > 0
}

// Members lists the servers gossip knows, or only this node without gossip.
func (n *Node) Members() []Member {
	if n.gossip == nil {
		return []Member{{ID: n.cfg.NodeID, RaftAddr: n.RaftAddr(), Status: "alive", Backend: n.fsm.BackendHash()}}
	}
	return n.gossip.Members()
}

// Running reports whether server id is up: it answers, as id, a status
// request at the Raft address gossip knows for it within a second (this
// node always is).
func (n *Node) Running(ctx context.Context, id string) bool {
	if id == n.cfg.NodeID {
		return true
	}
	for _, m := range n.Members() {
		if m.ID == id && m.RaftAddr != "" {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			st, err := n.PeerStatus(ctx, m.RaftAddr)
			return err == nil && st.NodeID == id
		}
	}
	return false
}

// Leave takes this node out of the cluster: a leader hands its leadership
// over first (RemovePeer), then the leader removes this node from the Raft
// configuration and gossip announces the departure. The cluster's only
// voter cannot leave (last_voter). Afterwards the OnLeft functions run;
// they shut the node down.
func (n *Node) Leave(ctx context.Context) error {
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	if onlyVoter(servers, n.cfg.NodeID) {
		return errcode.LastVoter.With("node %s is the cluster's only voter; it cannot leave", n.cfg.NodeID)
	}
	// A server that holds no configuration has not joined a cluster (or
	// was emptied and has heard from no leader since): no leader it can
	// find would remove it, and looking for one would only last until the
	// caller gives up.
	if len(servers) == 0 {
		return errcode.NotFound.With("node %s has not joined a cluster yet (it holds no Raft configuration): "+
			"there is nothing to leave; stop it instead", n.cfg.NodeID)
	}
	for {
		err := n.RemovePeer(ctx, n.cfg.NodeID)
		if err == nil || errors.Is(err, errcode.NotFound) {
			break
		}
		// Without a leader after the leader wait (RemovePeer waited for
		// one, and asked the other members), the cluster has lost its
		// quorum or this server cannot reach it: say so, as every
		// request does, rather than wait for as long as the caller does.
		if errors.Is(err, errcode.LastVoter) || errors.Is(err, errcode.NoLeader) || !sleepCtx(ctx, n.done, 100*time.Millisecond) {
			return err
		}
	}
	n.cfg.Logger.Info("left the cluster")
	if n.gossip != nil {
		if err := n.gossip.leave(5 * time.Second); err != nil {
			n.cfg.Logger.Warn("announcing the departure over gossip", "error", err)
		}
	}
	n.watchMu.Lock()
	hooks := slices.Clone(n.onLeft)
	n.watchMu.Unlock()
	for _, fn := range hooks {
		fn()
	}
	return nil
}

// OnLeft registers fn to run after this node has left the cluster (through
// Leave, whoever asked for it). fn must not block.
func (n *Node) OnLeft(fn func()) {
	n.watchMu.Lock()
	defer n.watchMu.Unlock()
	n.onLeft = append(n.onLeft, fn)
}

// GossipAddr is the address other nodes join this one at ("" without gossip).
func (n *Node) GossipAddr() string {
	if n.gossip == nil {
		return ""
	}
	return n.gossip.addr()
}

// LastSnapshotIndex is the log index of the latest snapshot this node took
// or installed.
func (n *Node) LastSnapshotIndex() uint64 { return parseUint(n.raft.Stats()["last_snapshot_index"]) }

// transferLeadership hands leadership to another voter. A transfer that
// fails for want of a voter ready to take over (none caught up, none
// answered in time) is unavailable for now, not a fault of the server.
func (n *Node) transferLeadership() error {
	_, err := n.await(func() raft.Future { return n.raft.LeadershipTransfer() })
	var coded *errcode.Error
	if err == nil || errors.As(err, &coded) {
		return err
	}
	e := errcode.Unavailable.With("leadership could not be handed over; retry once the other voters have caught up: %v", err)
	e.RetryAfter = 1
	return e
}
