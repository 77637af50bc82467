package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"sync"
	"time"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// The internal RPC service: a follower forwards proposals and asks for read
// indexes; the leader asks every server for its Raft progress.

// ProposeArgs carries an encoded command and the caller's deadline: the
// time it had left when sent (Timeout, ns), which does not depend on the
// two servers' clocks agreeing; a build that sends none gives its
// deadline's wall-clock time (Deadline, Unix ns). Both 0: none.
type ProposeArgs struct {
	Command  []byte
	Deadline int64
	Timeout  int64
}

// ProposeReply carries the leader's result. ErrJSON is Err in JSON: gob
// drops a pointer to a zero value, such as a failed UTXO item's vin or
// input 0, which JSON keeps. A build that sends no ErrJSON is read by its
// Err alone.
type ProposeReply struct {
	Result  *fsm.Result
	Err     *errcode.Error
	ErrJSON []byte
}

// setErr sets the reply's error in both its forms.
func (r *ProposeReply) setErr(e *errcode.Error) {
	r.Err, r.ErrJSON = e, nil
	if e == nil {
		return
	}
	if raw, err := json.Marshal(e); err == nil {
		r.ErrJSON = raw
	}
}

// err is the leader's error as it was sent, from ErrJSON when there is
// one; the result's own copy of a rejection is replaced by it too.
func (r *ProposeReply) err() *errcode.Error {
	if r.Err == nil || len(r.ErrJSON) == 0 {
		return r.Err
	}
	var e errcode.Error
	if json.Unmarshal(r.ErrJSON, &e) != nil || e.Code != r.Err.Code {
		return r.Err
	}
	if r.Result != nil && r.Result.Err != nil {
		r.Result.Err = &e
	}
	return &e
}

// ReadIndexArgs asks the leader for a read index.
type ReadIndexArgs struct{ Deadline, Timeout int64 } // as ProposeArgs

// ReadIndexReply is an index the reader's state machine must reach.
type ReadIndexReply struct {
	Index uint64
	Err   *errcode.Error
}

// RemoveArgs names a server to remove from the voter set.
type RemoveArgs struct {
	ID                string
	Deadline, Timeout int64 // as ProposeArgs
}

// RemoveReply reports the removal.
type RemoveReply struct{ Err *errcode.Error }

// StatsArgs asks a server for its Raft progress.
type StatsArgs struct{}

// LeaveArgs asks a server to leave the cluster.
type LeaveArgs struct{ Deadline, Timeout int64 } // as ProposeArgs

// LeaveReply reports the departure.
type LeaveReply struct{ Err *errcode.Error }

// PromiseArgs asks a server without Raft state to promise a bootstrap
// configuration (or, with Release, to withdraw that promise).
type PromiseArgs struct {
	Servers []raft.Server
	Release bool
}

// PromiseReply says why the promise was refused; empty when granted.
type PromiseReply struct{ Refused string }

type rpcService struct{ n *Node }

func deadlineCtx(ns, timeout int64) (context.Context, context.CancelFunc) {
	switch {
	case timeout > 0:
		return context.WithTimeout(context.Background(), time.Duration(timeout))
	case ns == 0:
		return context.WithTimeout(context.Background(), 10*time.Second)
	}
	return context.WithDeadline(context.Background(), time.Unix(0, ns))
}

func asErr(err error) *errcode.Error {
	if err == nil {
		return nil
	}
	var e *errcode.Error
	if errors.As(err, &e) {
		return e
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		e := errcode.Unavailable.With("deadline exceeded on the leader")
		e.RetryAfter = 1
		return e
	}
	return errcode.Internal.With("%v", err)
}

// Propose applies a forwarded command; only the leader accepts it, so a
// command is never forwarded twice.
func (s *rpcService) Propose(args ProposeArgs, reply *ProposeReply) error {
	ctx, cancel := deadlineCtx(args.Deadline, args.Timeout)
	defer cancel()
	cmd, err := fsm.Decode(args.Command)
	if err != nil {
		reply.setErr(asErr(err))
		return nil
	}
	if !s.n.IsLeader() {
		reply.setErr(s.n.notLeader())
		return nil
	}
	res, err := s.n.proposeLeading(ctx, cmd)
	var closing closingRefusal
	if errors.As(err, &closing) {
		// Refused before raft took it: the follower takes the command to
		// the next leader, as from a leader that stepped down.
		e := errcode.NotLeader.With("node %s is shutting down: nothing was proposed", s.n.cfg.NodeID)
		e.RetryAfter = 1
		reply.setErr(e)
		return nil
	}
	reply.Result = res
	reply.setErr(asErr(err))
	return nil
}

// ReadIndex returns an index covering every write acknowledged so far.
func (s *rpcService) ReadIndex(args ReadIndexArgs, reply *ReadIndexReply) error {
	ctx, cancel := deadlineCtx(args.Deadline, args.Timeout)
	defer cancel()
	if !s.n.IsLeader() {
		reply.Err = s.n.notLeader()
		return nil
	}
	idx, err := s.n.readIndexLocal(ctx)
	reply.Index, reply.Err = idx, asErr(err)
	return nil
}

// Remove takes a server out of the voter set (leader only).
func (s *rpcService) Remove(args RemoveArgs, reply *RemoveReply) error {
	ctx, cancel := deadlineCtx(args.Deadline, args.Timeout)
	defer cancel()
	if !s.n.IsLeader() {
		reply.Err = s.n.notLeader()
		return nil
	}
	reply.Err = asErr(s.n.removeLocal(ctx, args.ID))
	return nil
}

// Leave makes this server leave the cluster (and then shut down).
func (s *rpcService) Leave(args LeaveArgs, reply *LeaveReply) error {
	ctx, cancel := deadlineCtx(args.Deadline, args.Timeout)
	defer cancel()
	reply.Err = asErr(s.n.Leave(ctx))
	return nil
}

// Promise agrees to be bootstrapped into args.Servers only (see
// gossip.grantPromise), or withdraws that agreement.
func (s *rpcService) Promise(args PromiseArgs, reply *PromiseReply) error {
	g := s.n.gossip
	switch {
	case g == nil:
		reply.Refused = fmt.Sprintf("%s runs without gossip and takes part in no bootstrap", s.n.cfg.NodeID)
	case args.Release:
		g.releasePromise(configKey(args.Servers))
	default:
		if err := g.grantPromise(args.Servers); err != nil {
			reply.Refused = err.Error()
		}
	}
	return nil
}

// Stats reports this server's Raft progress.
func (s *rpcService) Stats(_ StatsArgs, reply *Status) error {
	*reply = s.n.Status()
	return nil
}

// peers holds one multiplexed RPC client per peer address.
type peers struct {
	network Network
	mu      sync.Mutex
	clients map[string]*rpc.Client
	closed  bool
}

// client returns the connection to addr, dialing one when there is none;
// pooled says it was there already (and may have died since it was last
// used).
func (p *peers) client(ctx context.Context, addr string) (c *rpc.Client, pooled bool, err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, false, net.ErrClosed
	}
	if c := p.clients[addr]; c != nil {
		p.mu.Unlock()
		return c, true, nil
	}
	p.mu.Unlock()
	timeout := 5 * time.Second
	if d, ok := ctx.Deadline(); ok {
		timeout = max(time.Until(d), time.Millisecond)
	}
	conn, err := dialProto(ctx, p.network, addr, timeout, protoRPC)
	if err != nil {
		return nil, false, err
	}
	c = rpc.NewClient(conn)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return nil, false, net.ErrClosed
	}
	if old := p.clients[addr]; old != nil {
		c.Close()
		return old, true, nil
	}
	p.clients[addr] = c
	return c, false, nil
}

func (p *peers) drop(addr string, c *rpc.Client) {
	p.mu.Lock()
	if p.clients[addr] == c {
		delete(p.clients, addr)
	}
	p.mu.Unlock()
	c.Close()
}

// notDelivered wraps a failure that happened before the request left this
// node: retrying it cannot apply anything twice.
type notDelivered struct{ err *errcode.Error }

func (n notDelivered) Error() string { return n.err.Error() }
func (n notDelivered) Unwrap() error { return n.err }

// call invokes method on the server at addr. A failure after the request
// was sent is reported as unavailable: it may or may not have been applied.
// A pooled connection found dead before the request left (the peer
// restarted since it was last used) is replaced by a new one at once.
func (p *peers) call(ctx context.Context, addr, method string, args, reply any) error {
	return p.callOnce(ctx, addr, method, args, reply, true)
}

func (p *peers) callOnce(ctx context.Context, addr, method string, args, reply any, redial bool) error {
	c, pooled, err := p.client(ctx, addr)
	if err != nil {
		e := errcode.Unavailable.With("cannot reach %s: %v", addr, err)
		e.RetryAfter = 1
		return notDelivered{e}
	}
	call := c.Go("Cluster."+method, args, reply, make(chan *rpc.Call, 1))
	// net/rpc refuses a call on a connection it knows is gone at once,
	// before sending anything, with ErrShutdown. It also gives calls
	// already sent ErrShutdown when the peer hangs up while the client is
	// being closed; so only a refusal that came back within Go counts as
	// never sent. So does a request whose write failed within Go: it did
	// not reach the peer whole, and the peer acts on none it did not read
	// whole.
	select {
	case <-call.Done:
		unsent := errors.Is(call.Error, rpc.ErrShutdown) || writeFailed(call.Error)
		if unsent && pooled && redial {
			p.drop(addr, c)
			return p.callOnce(ctx, addr, method, args, reply, false)
		}
		return p.answered(addr, c, method, call, unsent)
	default:
	}
	select {
	case <-call.Done:
		return p.answered(addr, c, method, call, false)
	case <-ctx.Done():
		if errors.Is(context.Cause(ctx), errLeaderMoved) {
			// The peer stopped leading and did not answer: its connection
			// may lead nowhere (a host gone, a cut network).
			p.drop(addr, c)
			return movedError(method, addr)
		}
		return unanswered{err: fmt.Errorf("cluster: %s to %s: %w", method, addr, ctx.Err()), done: call.Done}
	}
}

// writeFailed reports whether err is a failed write on a connection.
func writeFailed(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "write"
}

// unanswered is the failure of a call its caller stopped waiting for
// (its context ended) after it was sent: the peer may still carry it out.
// The peer serves each call of a connection on a goroutine of its own, so
// a call sent after this one, such as the withdrawal of a waiting acquire,
// could be carried out before it; AwaitAnswer lets the caller wait for
// this call's answer first. A proposal's names the node that forwarded it
// and the leader it went to (n, addr).
type unanswered struct {
	err  error
	done <-chan *rpc.Call
	n    *Node
	addr raft.ServerAddress
}

func (u unanswered) Error() string { return u.err.Error() }
func (u unanswered) Unwrap() error { return u.err }

// AwaitAnswer waits until the peer has answered the call (or its
// connection has failed), or until ctx ends; for a proposal, no longer
// than a leader that vanished is waited for (leaderBound): a later
// proposal goes to its successor, whose log holds whatever it took up.
func (u unanswered) AwaitAnswer(ctx context.Context) {
	if u.n != nil {
		var cancel context.CancelFunc
		ctx, cancel = u.n.leaderBound(ctx, u.addr)
		defer cancel()
	}
	select {
	case <-u.done:
	case <-ctx.Done():
	}
}

// answered reports how call, made on c, ended: a failure drops the
// connection, and is notDelivered when the request never left (unsent).
func (p *peers) answered(addr string, c *rpc.Client, method string, call *rpc.Call, unsent bool) error {
	if call.Error == nil {
		return nil
	}
	p.drop(addr, c)
	e := errcode.Unavailable.With("%s to %s failed: %v", method, addr, call.Error)
	e.RetryAfter = 1
	if unsent {
		return notDelivered{e}
	}
	return e
}

func (p *peers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for addr, c := range p.clients {
		c.Close()
		delete(p.clients, addr)
	}
}

func deadlineOf(ctx context.Context) int64 {
	if d, ok := ctx.Deadline(); ok {
		return d.UnixNano()
	}
	return 0
}

// timeoutOf is the time ctx has left (ns, at least 1), 0 without a
// deadline.
func timeoutOf(ctx context.Context) int64 {
	if d, ok := ctx.Deadline(); ok {
		return max(int64(time.Until(d)), 1)
	}
	return 0
}

// leaderAddr is the Raft address and id of the current leader, if any.
func (n *Node) leaderAddr() (raft.ServerAddress, raft.ServerID) { return n.raft.LeaderWithID() }
