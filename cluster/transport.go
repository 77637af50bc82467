package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/raft"
)

// Network carries the cluster's internal traffic (Raft and forwarded
// requests). Production uses plain TCP; tests substitute one that can cut
// and delay links between nodes.
type Network interface {
	Listen(addr string) (net.Listener, error)
	Dial(ctx context.Context, addr string) (net.Conn, error)
}

// TCP is the default Network.
type TCP struct{}

// Listen implements Network.
func (TCP) Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

// Dial implements Network.
func (TCP) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// Every internal connection starts with one byte saying what it carries.
const (
	// protoRaft is Raft from a node that does not name its island (a
	// build from before the island check, during a rolling upgrade).
	protoRaft byte = 'R'
	// protoRaftIsland is Raft after both ends named their island (see
	// writeIsland).
	protoRaftIsland byte = 'I'
	protoRPC        byte = 'C'
)

// ErrOtherIsland is the refusal of a Raft connection between servers of
// two islands: one end's state, Raft log included, belongs to another
// cluster (a data directory copied or restored from elsewhere onto a
// server of this one). Raft between them would let the one overwrite the
// other's committed entries.
var ErrOtherIsland = errors.New("cluster: the server belongs to another island")

// writeIsland says what each end of a Raft connection says after its
// protocol byte: the dialler first, then the listener, each its island's
// backend hash ("" before the island's first leader named it) and its
// node id, each as one length byte and the bytes. Either end closes the
// connection when both named an island and the islands differ, before
// raft reads a byte.
func writeIsland(c net.Conn, hash, id string) error {
	if len(hash) > 255 || len(id) > 255 {
		return fmt.Errorf("cluster: backend hash or node id longer than 255 bytes")
	}
	b := append([]byte{byte(len(hash))}, hash...)
	b = append(append(b, byte(len(id))), id...)
	_, err := c.Write(b)
	return err
}

// readIsland reads what writeIsland wrote: the island and the node id.
func readIsland(c net.Conn) (hash, id string, err error) {
	var parts [2]string
	for i := range parts {
		var n [1]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return "", "", err
		}
		b := make([]byte, n[0])
		if _, err := io.ReadFull(c, b); err != nil {
			return "", "", err
		}
		parts[i] = string(b)
	}
	return parts[0], parts[1], nil
}

// sameIsland tells whether two servers' islands may share Raft: a server
// whose island has no name yet belongs to none.
func sameIsland(a, b string) bool { return a == "" || b == "" || a == b }

// mux splits the cluster port between Raft and the RPC server.
type mux struct {
	ln     net.Listener
	raftCh chan net.Conn
	rpc    func(net.Conn)
	log    *slog.Logger
	done   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu    sync.Mutex
	conns map[*trackedConn]struct{} // accepted connections and raft's dialled ones, closed on shutdown

	island   func() string // this node's backend hash
	self     string        // this node's id
	certs    PeerTLS       // nil without TLS
	refused  warnEvery     // Raft connections from other islands
	refusals atomic.Int64  // how many were refused
}

func newMux(ln net.Listener, rpc func(net.Conn), self string, island func() string, certs PeerTLS, log *slog.Logger) *mux {
	m := &mux{ln: ln, raftCh: make(chan net.Conn), rpc: rpc, log: log, done: make(chan struct{}),
		self: self, island: island, certs: certs, refused: warnEvery{every: 10 * time.Second}}
	m.wg.Add(1)
	go m.accept()
	return m
}

func (m *mux) accept() {
	defer m.wg.Done()
	for {
		c, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.done:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.log.Warn("cluster listener failed", "error", err)
			return
		}
		m.wg.Add(1)
		go m.route(c)
	}
}

func (m *mux) route(c net.Conn) {
	defer m.wg.Done()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := c.Read(b[:]); err != nil {
		c.Close()
		return
	}
	if b[0] == protoRaftIsland && !m.admitIsland(c) || b[0] == protoRaft && !m.admitOlder(c) {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	switch b[0] {
	case protoRaft, protoRaftIsland:
		tc, ok := m.track(c, true)
		if !ok {
			return
		}
		select {
		case m.raftCh <- tc:
		case <-m.done:
			tc.Close()
		}
	case protoRPC:
		tc, ok := m.track(c, false)
		if !ok {
			return
		}
		m.rpc(tc)
		tc.Close()
	default:
		m.log.Warn("unknown protocol on the cluster port", "remote", c.RemoteAddr().String(), "byte", b[0])
		c.Close()
	}
}

// admitIsland hears the dialler's island and answers with this node's;
// it admits the connection when both may share Raft, and otherwise tells
// the operator (every 10 seconds at most) which server was refused.
func (m *mux) admitIsland(c net.Conn) bool {
	theirs, id, err := readIsland(c)
	if err != nil {
		return false
	}
	ours := m.island()
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := writeIsland(c, ours, m.self); err != nil {
		return false
	}
	_ = c.SetWriteDeadline(time.Time{})
	if id != "" && id == m.self {
		return false // see ErrDialledSelf; the dialler says it
	}
	if err := m.checkNode(c, id); err != nil {
		m.refusals.Add(1)
		if m.refused.due() {
			m.log.Error("refused Raft with a server whose certificate is another node's", "error", err, "remote", c.RemoteAddr().String())
		}
		return false
	}
	if sameIsland(ours, theirs) {
		return true
	}
	m.refusals.Add(1)
	if m.refused.due() {
		m.log.Error(otherIsland, "server", id, "its_backend", theirs, "backend", ours, "remote", c.RemoteAddr().String())
	}
	return false
}

// admitOlder admits Raft from a build that names neither its island nor
// its node. Certificates bound to a node came after both, so a server
// presenting one speaks the newer protocol: taking the older one from it
// would skip the check of the id it names in its Raft messages.
func (m *mux) admitOlder(c net.Conn) bool {
	err := m.checkUnbound(c)
	if err != nil {
		m.refusals.Add(1)
		if m.refused.due() {
			m.log.Error("refused Raft with a server whose certificate is another node's", "error", err, "remote", c.RemoteAddr().String())
		}
	}
	return err == nil
}

// checkUnbound fails when c's peer presents a certificate bound to a node,
// which a build that speaks the older protocol cannot hold.
func (m *mux) checkUnbound(c net.Conn) error {
	tc, ok := c.(*tls.Conn)
	if m.certs == nil || !ok {
		return nil
	}
	if bound := m.certs.PeerNode(tc.ConnectionState()); bound != "" {
		return fmt.Errorf("%w: node %s's certificate without the node check", ErrOtherNode, bound)
	}
	return nil
}

// ErrDialledSelf says that a Raft address answered as this very server:
// the address another server had, before this one took it over (containers
// restarted with each other's addresses). Raft never dials its own server;
// a connection to itself would let a candidate grant itself that other
// server's vote too (raft grants a repeated vote request of the candidate
// it voted for) and lead alone.
var ErrDialledSelf = errors.New("cluster: the address answers as this server (another server's stale address)")

// ErrOtherServer says that a Raft address answered as another server than
// the one raft dialled there: the address that server had, before another
// took it over (containers recreated, one given another's former IP).
// Raft counts what it hears at a server's address as that server's; a
// server answering for another too would give a candidate two votes
// (raft grants a repeated vote request of the candidate it voted for), and
// a leader two acknowledgements, so that two servers of five could elect
// a leader and commit.
var ErrOtherServer = errors.New("cluster: the address answers as another server (a stale address)")

// ErrOtherNode says that a server names itself with another node id than
// the one its certificate is bound to.
var ErrOtherNode = errors.New("cluster: the server's certificate is bound to another node")

// checkNode refuses a peer on c that names itself id while its certificate
// is bound to another node (auth: a server certificate issued for one node
// id): a server started with another node's id, or with another node's
// bundle, does not take that node's place in Raft.
func (m *mux) checkNode(c net.Conn, id string) error {
	tc, ok := c.(*tls.Conn)
	if m.certs == nil || !ok {
		return nil
	}
	if bound := m.certs.PeerNode(tc.ConnectionState()); bound != "" && bound != id {
		return fmt.Errorf("%w: it names itself %s, its certificate is node %s's", ErrOtherNode, id, bound)
	}
	return nil
}

// otherIsland tells the operator about a server of another island. Both
// ends say it: which of the two holds another cluster's data directory
// (the one whose backend differs from its peers') is for the operator to
// see.
const otherIsland = "refused Raft with a server of another island: the data directory of one of the two " +
	"was copied or restored from another cluster. Stop that server; to join this island it needs an empty data directory"

// warnEvery lets a repeated complaint through once per period.
type warnEvery struct {
	every time.Duration
	mu    sync.Mutex
	last  time.Time
}

func (w *warnEvery) due() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if now := time.Now(); now.Sub(w.last) >= w.every {
		w.last = now
		return true
	}
	return false
}

// track remembers a connection (accepted, or dialled for raft) until it is
// closed, so that shutting the node down ends every such connection (and
// the goroutines using them), whoever holds the other end.
func (m *mux) track(c net.Conn, raft bool) (net.Conn, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	select {
	case <-m.done:
		c.Close()
		return nil, false
	default:
	}
	tc := &trackedConn{Conn: c, m: m, raft: raft}
	if m.conns == nil {
		m.conns = map[*trackedConn]struct{}{}
	}
	m.conns[tc] = struct{}{}
	return tc, true
}

type trackedConn struct {
	net.Conn
	m    *mux
	raft bool // carries Raft (else RPCs)
	once sync.Once
}

func (t *trackedConn) Close() error {
	t.once.Do(func() {
		t.m.mu.Lock()
		delete(t.m.conns, t)
		t.m.mu.Unlock()
	})
	return t.Conn.Close()
}

// life is a context that ends when the mux shuts down (or when cancelled).
func (m *mux) life() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// shut stops accepting and ends the Raft connections, accepted and dialled
// (raft may be blocked reading one). RPC connections stay until close: the answer to a
// request raft has already taken is still delivered.
func (m *mux) shut() {
	m.once.Do(func() {
		close(m.done)
		m.ln.Close()
	})
	m.closeConns(func(c *trackedConn) bool { return c.raft })
}

// close shuts the mux, ends every accepted connection and waits for the
// goroutines serving them.
func (m *mux) close() {
	m.shut()
	m.closeConns(func(*trackedConn) bool { return true })
	m.wg.Wait()
}

func (m *mux) closeConns(match func(c *trackedConn) bool) {
	m.mu.Lock()
	var conns []*trackedConn
	for c := range m.conns {
		if match(c) {
			conns = append(conns, c)
		}
	}
	m.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// streamLayer is raft's view of the mux.
type streamLayer struct {
	m         *mux
	network   Network
	advertise net.Addr

	// older tells whether the server at a Raft address runs a build from
	// before the island check (gossip says so); nil: none does.
	older func(addr string) bool
}

var _ raft.StreamLayer = (*streamLayer)(nil)

func (s *streamLayer) Accept() (net.Conn, error) {
	select {
	case c := <-s.m.raftCh:
		return c, nil
	case <-s.m.done:
		return nil, net.ErrClosed
	}
}

// Close is a no-op: the node closes the mux after raft has shut down.
func (s *streamLayer) Close() error { return nil }

func (s *streamLayer) Addr() net.Addr { return s.advertise }

// Dial connects raft to addr after both ends named their island (see
// writeIsland); it fails with ErrOtherIsland when they differ. A server
// that gossip says runs a build from before the check is dialled as it
// expects. The dial, and the connection raft then keeps, end when the node
// shuts down: a peer that does not answer (a paused process, a network
// that drops its packets) would otherwise hold raft's shutdown for the
// whole timeout of every request waiting on it.
func (s *streamLayer) Dial(target raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := s.m.life()
	defer cancel()
	addr, want := splitDialAddr(target)
	c, err := s.dial(ctx, addr, want, timeout)
	if err != nil {
		return nil, err
	}
	tc, ok := s.m.track(c, true)
	if !ok {
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, net.ErrClosed)
	}
	return tc, nil
}

// dial connects to addr; want is the server raft means to reach there ("":
// any).
func (s *streamLayer) dial(ctx context.Context, addr raft.ServerAddress, want raft.ServerID, timeout time.Duration) (net.Conn, error) {
	if s.older != nil && s.older(string(addr)) {
		c, err := dialProto(ctx, s.network, string(addr), timeout, protoRaft)
		if err != nil {
			return nil, err
		}
		if err := s.m.checkUnbound(c); err != nil {
			c.Close()
			return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
		}
		return c, nil
	}
	c, err := dialProto(ctx, s.network, string(addr), timeout, protoRaftIsland)
	if err != nil {
		return nil, err
	}
	// The node shutting down ends the wait for the peer's island.
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	ours := s.m.island()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if err := writeIsland(c, ours, s.m.self); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	theirs, id, err := readIsland(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	_ = c.SetDeadline(time.Time{})
	if id != "" && id == s.m.self {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, ErrDialledSelf)
	}
	if id != "" && want != "" && id != string(want) {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s for %s: %s answers: %w", addr, want, id, ErrOtherServer)
	}
	if err := s.m.checkNode(c, id); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	if !sameIsland(ours, theirs) {
		c.Close()
		return nil, fmt.Errorf("cluster: %s at %s (backend %s, this island %s): %w", id, addr, theirs, ours, ErrOtherIsland)
	}
	return c, nil
}

// dialProto connects to addr within timeout (or until ctx ends) and says
// what the connection carries.
func dialProto(ctx context.Context, n Network, addr string, timeout time.Duration, proto byte) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := n.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{proto}); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: dial %s: %w", addr, err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// olderBuild tells whether gossip announces the server at Raft address addr
// as a build from before the island check (see writeIsland).
func (a *raftAddresses) olderBuild(addr string) bool {
	g := a.gossip.Load()
	return g != nil && g.olderBuildAt(addr)
}

// raftAddresses tells raft where to dial a server: at the Raft address the
// server announces through gossip, else at the one the Raft configuration
// holds. Advertised host names are resolved when a node starts, so a
// server that comes back with another address (a container recreated on
// a new network) is reached before a leader has updated the configuration,
// and when every server restarted at once, which leaves no leader to
// update it.
type raftAddresses struct {
	raft   atomic.Pointer[raft.Raft]
	gossip atomic.Pointer[gossip]
}

var _ raft.ServerAddressProvider = (*raftAddresses)(nil)

// ServerAddr implements raft.ServerAddressProvider. What it returns names
// the server as well as its address (dialAddr), so that the dial checks
// that the server answering there is the one raft means (ErrOtherServer),
// and raft keeps the connections to each server apart.
func (a *raftAddresses) ServerAddr(id raft.ServerID) (raft.ServerAddress, error) {
	if g := a.gossip.Load(); g != nil {
		if addr := g.raftAddr(string(id)); addr != "" {
			return dialAddr(raft.ServerAddress(addr), id), nil
		}
	}
	if r := a.raft.Load(); r != nil {
		for _, s := range r.GetConfiguration().Configuration().Servers {
			if s.ID == id {
				return dialAddr(s.Address, id), nil
			}
		}
	}
	return "", fmt.Errorf("cluster: no address known for server %s", id)
}

// dialAddr is what raft dials to reach server id at addr: the address, a
// '#' (which no host name or port holds) and the id.
func dialAddr(addr raft.ServerAddress, id raft.ServerID) raft.ServerAddress {
	return addr + "#" + raft.ServerAddress(id)
}

// splitDialAddr takes dialAddr's result apart; a bare address names no
// server.
func splitDialAddr(target raft.ServerAddress) (raft.ServerAddress, raft.ServerID) {
	addr, id, _ := strings.Cut(string(target), "#")
	return raft.ServerAddress(addr), raft.ServerID(id)
}

// advertiseAddr resolves the address peers should dial.
func advertiseAddr(advertise string, bound net.Addr) (net.Addr, error) {
	if advertise == "" {
		return bound, nil
	}
	a, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("cluster: advertise address %q: %w", advertise, err)
	}
	if a.Port == 0 {
		return bound, nil
	}
	if a.IP == nil || a.IP.IsUnspecified() {
		return nil, fmt.Errorf("cluster: advertise address %q is not reachable by peers", advertise)
	}
	return a, nil
}

// PeerTLS is the TLS configuration of the cluster's internal connections:
// both ends present a certificate and check the other's.
type PeerTLS interface {
	PeerServerConfig() *tls.Config
	PeerClientConfig() *tls.Config
	// PeerNode is the node id the certificate the peer presented is
	// bound to ("": none).
	PeerNode(cs tls.ConnectionState) string
}

// tlsNetwork runs a Network's connections over mutually authenticated
// TLS: Raft (through the stream layer) and the RPCs that forward requests
// and manage membership. A peer whose certificate the other end refuses
// gets no further than the handshake.
type tlsNetwork struct {
	inner Network
	tls   PeerTLS
}

func (t tlsNetwork) Listen(addr string) (net.Listener, error) {
	ln, err := t.inner.Listen(addr)
	if err != nil {
		return nil, err
	}
	// The handshake runs on the connection's first read, which the mux
	// does under a deadline.
	return tls.NewListener(ln, t.tls.PeerServerConfig()), nil
}

func (t tlsNetwork) Dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := t.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(c, t.tls.PeerClientConfig())
	if err := tc.HandshakeContext(ctx); err != nil {
		c.Close()
		return nil, fmt.Errorf("cluster: TLS handshake with %s: %w", addr, err)
	}
	return tc, nil
}

// raftTransport is raft's TCP transport with two changes.
//
// Heartbeats pass a gate. Raft answers heartbeats on the transport's
// connection goroutines, which its Shutdown does not wait for: a heartbeat
// that passed raft's own shutdown check can still save a newer term after
// the node closed its log store, and raft panics when that save fails. Once
// the gate is shut (after raft has shut down, before the store closes), it
// waits for heartbeats in flight and hands raft no more; their connections
// end with the transport, which raft closed, unanswered, as a stopped
// server's would.
//
// Replication is not pipelined. Raft's pipelined replication can deadlock:
// when a follower refuses an entry (or a response times out), raft stops
// reading the pipeline's answers while its sender may still pick one more
// trigger over the stop signal, and the two block on each other's full
// channels for good. The follower then gets heartbeats but no entry ever
// again, and the leader cannot shut down. Without a pipeline raft sends
// each follower one AppendEntries at a time, every one carrying all the
// entries waiting (up to MaxAppendEntries).
//
// Votes pass another gate while the server catches up after joining (see
// joining.go): it grants none and asks for none.
//
// A leader's commit index is trusted only as far as the request matched
// this server's log (clampCommit): raft sets a follower's commit index to
// the least of the leader's and the follower's own last index, so a request
// whose entries end before an older, conflicting suffix of the follower's
// log (a deposed leader's entries no one else holds) would have the
// follower apply entries the cluster never committed.
type raftTransport struct {
	*raft.NetworkTransport
	mu   sync.RWMutex
	shut bool

	joining      atomic.Bool
	commit       atomic.Pointer[leaderCommit] // the latest a leader sent (noteCommit)
	votesRefused atomic.Int64                 // vote requests refused while joining
	consumer     chan raft.RPC
	wanted       atomic.Pointer[func(id raft.ServerID, term uint64) bool] // see AppendEntries
	stop         chan struct{}
	stopOnce     sync.Once
	wg           sync.WaitGroup
}

// leaderCommit is the commit index a leader sent, and the leader's term.
type leaderCommit struct{ term, index uint64 }

// newRaftTransport wraps inner. A server joining when it starts gets the
// vote gate (a server only begins joining as it starts: see joining.go);
// the others hand raft the RPCs inner reads, as they come.
func newRaftTransport(inner *raft.NetworkTransport, joining bool) *raftTransport {
	t := &raftTransport{NetworkTransport: inner, stop: make(chan struct{}), consumer: make(chan raft.RPC)}
	t.joining.Store(joining)
	t.wg.Add(1)
	go t.filter()
	return t
}

// Consumer implements raft.Transport: the RPCs the gates let through.
func (t *raftTransport) Consumer() <-chan raft.RPC { return t.consumer }

func (t *raftTransport) filter() {
	defer t.wg.Done()
	in := t.NetworkTransport.Consumer()
	for {
		select {
		case rpc := <-in:
			t.noteCommit(rpc) // the leader's own, before clampCommit lowers it
			clampCommit(rpc)
			if t.refuse(rpc) {
				continue
			}
			select {
			case t.consumer <- rpc:
			case <-t.stop:
				rpc.Respond(nil, raft.ErrTransportShutdown)
				return
			}
		case <-t.stop:
			return
		}
	}
}

// clampCommit lowers the commit index of an AppendEntries request to the
// last entry the request proves this server holds as the leader does: the
// last one it carries, or the previous entry it names when it carries none
// (what the Raft paper prescribes: commitIndex = min(leaderCommit, index of
// last new entry)). Entries beyond that may belong to a deposed leader and
// conflict with the cluster's; the next request that reaches them replaces
// them before they are committed here.
func clampCommit(rpc raft.RPC) {
	req, ok := rpc.Command.(*raft.AppendEntriesRequest)
	if !ok {
		return
	}
	proven := req.PrevLogEntry
	if n := len(req.Entries); n > 0 {
		proven = req.Entries[n-1].Index
	}
	req.LeaderCommitIndex = min(req.LeaderCommitIndex, proven)
}

// noteCommit keeps the latest commit index a leader sent, or the index of
// a snapshot it installs: how far a server that joins, or comes back, has
// to catch up. It is the leader's, not what clampCommit lowers it to for
// raft: a server far behind gets its entries a batch at a time, and each
// batch proves no more than its last entry. Raft's heartbeats carry no
// commit index and leave it as it is.
func (t *raftTransport) noteCommit(rpc raft.RPC) {
	var term, index uint64
	switch req := rpc.Command.(type) {
	case *raft.AppendEntriesRequest:
		if req.LeaderCommitIndex == 0 {
			return // a heartbeat, which carries no commit index, or a cluster that committed nothing yet
		}
		term, index = req.Term, req.LeaderCommitIndex
	case *raft.InstallSnapshotRequest:
		term, index = req.Term, req.LastLogIndex
	default:
		return
	}
	if cur := t.commit.Load(); cur == nil || term > cur.term || term == cur.term && index > cur.index {
		t.commit.Store(&leaderCommit{term: term, index: index})
	}
}

// refuse answers a vote request itself while the server is joining.
func (t *raftTransport) refuse(rpc raft.RPC) bool {
	if !t.joining.Load() {
		return false
	}
	switch rpc.Command.(type) {
	case *raft.RequestVoteRequest, *raft.RequestPreVoteRequest:
		t.votesRefused.Add(1)
		rpc.Respond(nil, errJoining)
		return true
	}
	return false
}

// RequestVote implements raft.Transport: a joining server asks for no vote.
func (t *raftTransport) RequestVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestVoteRequest, resp *raft.RequestVoteResponse) error {
	if t.joining.Load() {
		return errJoining
	}
	return t.NetworkTransport.RequestVote(id, target, args, resp)
}

// RequestPreVote implements raft.WithPreVote, as RequestVote.
func (t *raftTransport) RequestPreVote(id raft.ServerID, target raft.ServerAddress, args *raft.RequestPreVoteRequest, resp *raft.RequestPreVoteResponse) error {
	if t.joining.Load() {
		return errJoining
	}
	return t.NetworkTransport.RequestPreVote(id, target, args, resp)
}

// EncodePeer implements raft.Transport: a server's address as RPC headers
// carry it (where followers learn the leader's), without the id ServerAddr
// adds for the dial.
func (t *raftTransport) EncodePeer(id raft.ServerID, addr raft.ServerAddress) []byte {
	plain, _ := splitDialAddr(raft.ServerAddress(t.NetworkTransport.EncodePeer(id, addr)))
	return []byte(plain)
}

// Close implements raft.WithClose; it also ends the gate's goroutine.
func (t *raftTransport) Close() error {
	t.stopOnce.Do(func() { close(t.stop) })
	err := t.NetworkTransport.Close()
	t.wg.Wait()
	return err
}

// SetHeartbeatHandler implements raft.Transport.
func (t *raftTransport) SetHeartbeatHandler(fn func(rpc raft.RPC)) {
	if fn == nil {
		t.NetworkTransport.SetHeartbeatHandler(nil)
		return
	}
	t.NetworkTransport.SetHeartbeatHandler(func(rpc raft.RPC) {
		t.mu.RLock()
		defer t.mu.RUnlock()
		if !t.shut {
			fn(rpc)
		}
	})
}

// shutHeartbeats waits for the heartbeats raft is handling and drops later
// ones.
func (t *raftTransport) shutHeartbeats() {
	t.mu.Lock()
	t.shut = true
	t.mu.Unlock()
}

// retryEvery is how often a leader tries again to reach a server its
// replication requests did not reach.
const retryEvery = 50 * time.Millisecond

// AppendEntries implements raft.Transport. A request that did not reach its
// server is sent again every retryEvery for as long as raft would go on
// sending it: while this server leads in the request's term and the server
// is in the configuration (wanted). Raft itself waits longer after each
// request that failed, up to 10 s, before it sends the next; a server back
// from an absence of a few seconds would get no entry for seconds more, and
// a cluster that meanwhile lost another server (a rolling restart) no
// quorum. A request is idempotent, so sending it again is safe; one that
// reached its server and failed there is answered as it is.
func (t *raftTransport) AppendEntries(id raft.ServerID, target raft.ServerAddress, args *raft.AppendEntriesRequest, resp *raft.AppendEntriesResponse) error {
	for {
		err := t.NetworkTransport.AppendEntries(id, target, args, resp)
		if err == nil || !unreached(err) || !t.retry(id, args.Term) {
			return err
		}
	}
}

// setWanted tells AppendEntries whether raft still replicates to a server
// in a term.
func (t *raftTransport) setWanted(fn func(id raft.ServerID, term uint64) bool) { t.wanted.Store(&fn) }

// retry waits retryEvery and says whether to send a request to id of term
// again.
func (t *raftTransport) retry(id raft.ServerID, term uint64) bool {
	wanted := t.wanted.Load()
	if wanted == nil {
		return false
	}
	timer := time.NewTimer(retryEvery)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-t.stop:
		return false
	}
	return (*wanted)(id, term)
}

// unreached tells whether err means that a request did not reach its
// server, or that the server went away while answering: nothing refused
// it. A stale address (it answers as another server, or as this one) did
// not reach the server either: its new address may be known by the next
// try.
func unreached(err error) bool {
	if errors.Is(err, ErrOtherIsland) || errors.Is(err, ErrOtherNode) {
		return false
	}
	for _, e := range []error{ErrOtherServer, ErrDialledSelf, syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EHOSTUNREACH,
		syscall.ENETUNREACH, syscall.EPIPE, syscall.ETIMEDOUT, io.EOF, io.ErrUnexpectedEOF, os.ErrDeadlineExceeded,
		context.DeadlineExceeded, net.ErrClosed} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// AppendEntriesPipeline implements raft.Transport: raft then replicates
// without a pipeline.
func (t *raftTransport) AppendEntriesPipeline(raft.ServerID, raft.ServerAddress) (raft.AppendPipeline, error) {
	return nil, raft.ErrPipelineReplicationNotSupported
}
