// Package faultnet is the network of in-process test clusters, with faults
// a test can inject: it partitions any set of nodes from any other (closing
// the connections between them), delays links, freezes a node (as a paused
// process looks to everyone else), kills a node's connections at once (as a
// crashed process), and heals. Every node gets its own view (a
// cluster.Network for Raft and forwarding, a memberlist transport for
// gossip) and clients can dial through it too, so that the fabric knows who
// talks to whom.
package faultnet

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/raftlockd/raftlockd/cluster"
)

type pair struct{ a, b string }

func pairOf(x, y string) pair {
	if x > y {
		x, y = y, x
	}
	return pair{x, y}
}

// Fabric connects the nodes of one test cluster.
type Fabric struct {
	mu      sync.Mutex
	owner   map[string]string // listening address -> node
	dialed  map[string]string // "local|remote" of a connection dialed through the fabric -> dialing node
	blocked map[pair]bool
	delay   map[pair]time.Duration
	frozen  map[string]bool
	dead    map[string]bool
	conns   map[pair]map[*conn]struct{}
	changed chan struct{} // closed and replaced whenever a freeze, a delay or a block changes
}

// New returns a fabric with every link up.
func New() *Fabric {
	return &Fabric{owner: map[string]string{}, dialed: map[string]string{}, blocked: map[pair]bool{},
		delay: map[pair]time.Duration{}, frozen: map[string]bool{}, dead: map[string]bool{},
		conns: map[pair]map[*conn]struct{}{}, changed: make(chan struct{})}
}

// notify wakes every connection waiting on the fabric's state; f.mu is held.
func (f *Fabric) notify() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Register tells the fabric that node listens on addr (for example its
// HTTP API), so that clients dialing addr through the fabric are subject to
// node's faults.
func (f *Fabric) Register(addr, node string) { f.register(addr, node) }

func (f *Fabric) register(addr, node string) {
	f.mu.Lock()
	f.owner[addr] = node
	f.mu.Unlock()
}

// link reports the owner of addr and whether node may reach it.
func (f *Fabric) link(node, addr string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	dst := f.owner[addr]
	return dst, dst == "" || !f.blocked[pairOf(node, dst)] && !f.dead[node] && !f.dead[dst] && !f.frozen[node] && !f.frozen[dst]
}

// cut closes every connection of the pairs that match; f.mu is not held.
func (f *Fabric) cut(match func(p pair) bool) {
	f.mu.Lock()
	var cut []*conn
	for p, cs := range f.conns {
		if match(p) {
			for c := range cs {
				cut = append(cut, c)
			}
		}
	}
	f.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
}

// Partition splits the nodes into groups that cannot reach each other;
// nodes named in no group keep their links.
func (f *Fabric) Partition(groups ...[]string) {
	group := map[string]int{}
	for i, g := range groups {
		for _, n := range g {
			group[n] = i
		}
	}
	f.mu.Lock()
	for a, ga := range group {
		for b, gb := range group {
			if ga != gb {
				f.blocked[pairOf(a, b)] = true
			}
		}
	}
	f.notify()
	f.mu.Unlock()
	f.cut(func(p pair) bool {
		ga, oka := group[p.a]
		gb, okb := group[p.b]
		return oka && okb && ga != gb
	})
}

// Isolate cuts node off from every other node the fabric knows.
func (f *Fabric) Isolate(node string) {
	f.mu.Lock()
	others := map[string]bool{}
	for _, n := range f.owner {
		if n != node {
			others[n] = true
		}
	}
	f.mu.Unlock()
	rest := make([]string, 0, len(others))
	for n := range others {
		rest = append(rest, n)
	}
	f.Partition([]string{node}, rest)
}

// Heal restores every link and removes every delay. Frozen nodes stay
// frozen until thawed.
func (f *Fabric) Heal() {
	f.mu.Lock()
	f.blocked = map[pair]bool{}
	f.delay = map[pair]time.Duration{}
	f.notify()
	f.mu.Unlock()
}

// Delay adds d of latency to the link between a and b, in both directions:
// bytes and gossip packets reach the other side d after they were sent.
func (f *Fabric) Delay(a, b string, d time.Duration) {
	f.mu.Lock()
	f.delay[pairOf(a, b)] = d
	f.notify()
	f.mu.Unlock()
}

// Freeze makes node look like a paused (SIGSTOPped) process to everyone
// else: no byte it sends reaches anyone and no byte sent to it is read, on
// every connection it has or opens (Raft, forwarding, gossip streams, the
// API connections of clients that dial through the fabric), and gossip
// packets to and from it are lost. Connections stay open: writes to it are
// taken (as a kernel's socket buffer takes them) or, where the other end
// does not go through the fabric, block; its own writes and reads block;
// dials to it connect but get no answer; its own dials wait. Everything
// held is delivered once it is thawed, to whoever is still waiting. Its
// goroutines and timers keep running: that part of a pause cannot be
// modelled in one process.
func (f *Fabric) Freeze(node string) {
	f.mu.Lock()
	f.frozen[node] = true
	f.notify()
	f.mu.Unlock()
}

// Thaw ends a freeze.
func (f *Fabric) Thaw(node string) {
	f.mu.Lock()
	delete(f.frozen, node)
	f.notify()
	f.mu.Unlock()
}

// Kill makes node vanish at once, as a crashed process does: its ends of
// its connections are closed and the other ends are reset (the peers and
// clients reading or writing them get ECONNRESET, whatever the node was
// about to send), dials to and from it are refused and its gossip packets
// are lost. Revive undoes it once the node has been torn down.
func (f *Fabric) Kill(node string) {
	f.mu.Lock()
	f.dead[node] = true
	delete(f.frozen, node)
	var own, others []*conn
	for p, cs := range f.conns {
		if p.a != node && p.b != node {
			continue
		}
		for c := range cs {
			if c.self == node {
				own = append(own, c)
			} else {
				c.reset = true
				others = append(others, c)
			}
		}
	}
	f.notify()
	f.mu.Unlock()
	for _, c := range own {
		c.Close()
	}
	for _, c := range others {
		_ = c.Conn.SetDeadline(time.Unix(1, 0)) // wakes a read or write in progress
	}
}

// Revive lets node's links work again (after a restart).
func (f *Fabric) Revive(node string) {
	f.mu.Lock()
	delete(f.dead, node)
	f.notify()
	f.mu.Unlock()
}

// Network returns node's view of the fabric for Raft and forwarding.
func (f *Fabric) Network(node string) cluster.Network { return &network{f: f, node: node} }

type network struct {
	f    *Fabric
	node string
}

func (n *network) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	n.f.register(ln.Addr().String(), n.node)
	return &listener{Listener: ln, f: n.f, node: n.node}, nil
}

func (n *network) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var d net.Dialer
	return n.f.dial(ctx, n.node, addr, true, func(ctx context.Context) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", addr)
	})
}

// Dialer returns a DialContext for HTTP clients, named client, that reach
// the nodes through the fabric: a frozen node's API does not answer them
// and a killed node's API refuses them.
func (f *Fabric) Dialer(client string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		d := net.Dialer{Timeout: time.Second}
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return f.dial(ctx, client, addr, false, func(ctx context.Context) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		})
	}
}

// dial connects from to addr with dial, subject to the fabric's faults.
// wrapped says whether the other end's connections go through the fabric.
func (f *Fabric) dial(ctx context.Context, from, addr string, wrapped bool, dial func(context.Context) (net.Conn, error)) (net.Conn, error) {
	for {
		f.mu.Lock()
		dst := f.owner[addr]
		dead := f.dead[from] || f.dead[dst]
		blocked := dst != "" && f.blocked[pairOf(from, dst)]
		frozen := f.frozen[from]
		ch := f.changed
		f.mu.Unlock()
		switch {
		case dead:
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
		case blocked:
			return nil, fmt.Errorf("faultnet: %s cannot reach %s (partitioned): %w", from, dst, syscall.EHOSTUNREACH)
		case frozen:
			// A paused process dials nothing until it runs again.
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: ctx.Err()}
			}
		}
		break
	}
	c, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	fc := &conn{Conn: c, f: f, self: from, wrapped: wrapped, closed: make(chan struct{}), kick: make(chan struct{})}
	f.mu.Lock()
	dst := f.owner[addr]
	fc.peer, fc.p = dst, pairOf(from, dst)
	if wrapped {
		fc.key = c.LocalAddr().String() + "|" + c.RemoteAddr().String()
		f.dialed[fc.key] = from
	}
	f.trackLocked(fc)
	gone := f.dead[from] || f.dead[dst] || dst != "" && f.blocked[fc.p]
	f.mu.Unlock()
	if gone {
		fc.Close()
		return nil, fmt.Errorf("faultnet: %s lost its link to %s while dialing: %w", from, dst, syscall.ECONNRESET)
	}
	return fc, nil
}

func (f *Fabric) trackLocked(c *conn) {
	if f.conns[c.p] == nil {
		f.conns[c.p] = map[*conn]struct{}{}
	}
	f.conns[c.p][c] = struct{}{}
}

// accepted wraps a connection node accepted; its peer is learnt from the
// first bytes it reads (see conn.resolve).
func (f *Fabric) accepted(c net.Conn, node string) *conn {
	return &conn{Conn: c, f: f, self: node, wrapped: true, accepted: true, closed: make(chan struct{}), kick: make(chan struct{})}
}

type listener struct {
	net.Listener
	f    *Fabric
	node string
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return l.f.accepted(c, l.node), nil
}

// conn is one end of a connection through the fabric. Latency and freezes
// are applied where bytes arrive: a read returns data only once it is a
// delay old and neither end is frozen. A frozen end also writes nothing.
type conn struct {
	net.Conn
	f        *Fabric
	self     string
	wrapped  bool // the other end is a conn too
	accepted bool
	key      string // in f.dialed, on the dialing end
	closed   chan struct{}
	once     sync.Once

	// Guarded by f.mu.
	peer     string // "" while unknown
	p        pair
	resolved bool
	reset    bool // the other end crashed

	rmu       sync.Mutex // one read at a time
	pending   []byte     // read from the socket, not yet delivered
	pendingAt time.Time
	pendingEr error

	dmu      sync.Mutex
	rdl, wdl time.Time
	kick     chan struct{} // closed and replaced when a deadline changes
}

// resolve learns the peer of an accepted connection: the dialing end
// registered itself before it wrote the bytes just read.
func (c *conn) resolve() {
	if !c.accepted {
		return
	}
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.resolved {
		return
	}
	c.resolved = true
	peer := f.dialed[c.Conn.RemoteAddr().String()+"|"+c.Conn.LocalAddr().String()]
	if peer == "" {
		return // not dialed through the fabric: no faults apply
	}
	c.peer, c.p = peer, pairOf(c.self, peer)
	select {
	case <-c.closed:
	default:
		f.trackLocked(c)
	}
}

// linkState is what the fabric does to one connection at the moment.
type linkState struct {
	readFrozen  bool // hold what arrives
	writeFrozen bool // send nothing
	delay       time.Duration
	reset       bool
	changed     <-chan struct{}
}

func (c *conn) state() linkState {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	self, peer := f.frozen[c.self], c.peer != "" && f.frozen[c.peer]
	st := linkState{readFrozen: self || peer, writeFrozen: self || peer && !c.wrapped, reset: c.reset, changed: f.changed}
	if c.peer != "" {
		st.delay = f.delay[c.p]
	}
	return st
}

func (c *conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

func (c *conn) resetError(op string) error {
	return c.opError(op, os.NewSyscallError(op, syscall.ECONNRESET))
}

func (c *conn) deadline(read bool) (time.Time, <-chan struct{}) {
	c.dmu.Lock()
	defer c.dmu.Unlock()
	if read {
		return c.rdl, c.kick
	}
	return c.wdl, c.kick
}

// hold waits until ready reports true (given the fabric's state), the
// deadline passes or the connection is closed or reset. ready also says
// how long to wait at most before asking again.
func (c *conn) hold(op string, read bool, ready func(st linkState) (bool, time.Duration)) error {
	for {
		st := c.state()
		if st.reset {
			return c.resetError(op)
		}
		ok, wait := ready(st)
		if ok {
			return nil
		}
		ch := st.changed
		dl, kick := c.deadline(read)
		if !dl.IsZero() {
			left := time.Until(dl)
			if left <= 0 {
				return c.opError(op, os.ErrDeadlineExceeded)
			}
			if wait <= 0 || left < wait {
				wait = left
			}
		}
		var timer *time.Timer
		var fired <-chan time.Time
		if wait > 0 {
			timer = time.NewTimer(wait)
			fired = timer.C
		}
		closed := false
		select {
		case <-ch:
		case <-kick:
		case <-fired:
		case <-c.closed:
			closed = true
		}
		if timer != nil {
			timer.Stop()
		}
		if closed {
			return c.opError(op, net.ErrClosed)
		}
	}
}

func (c *conn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if len(c.pending) == 0 && c.pendingEr == nil {
		n, err := c.Conn.Read(b)
		if n > 0 {
			c.resolve()
		}
		st := c.state()
		switch {
		case st.reset:
			return 0, c.resetError("read")
		case n == 0 || !st.readFrozen && st.delay == 0:
			return n, err
		}
		c.pending, c.pendingAt, c.pendingEr = append([]byte(nil), b[:n]...), time.Now(), err
	}
	at := c.pendingAt
	err := c.hold("read", true, func(st linkState) (bool, time.Duration) {
		if st.readFrozen {
			return false, 0
		}
		left := time.Until(at.Add(st.delay))
		return left <= 0, left
	})
	if err != nil {
		return 0, err
	}
	n := copy(b, c.pending)
	c.pending = c.pending[n:]
	if len(c.pending) > 0 {
		return n, nil
	}
	err, c.pending, c.pendingEr = c.pendingEr, nil, nil
	return n, err
}

func (c *conn) Write(b []byte) (int, error) {
	err := c.hold("write", false, func(st linkState) (bool, time.Duration) { return !st.writeFrozen, 0 })
	if err != nil {
		return 0, err
	}
	n, err := c.Conn.Write(b)
	if err != nil && c.state().reset {
		return n, c.resetError("write")
	}
	return n, err
}

func (c *conn) setDeadlines(r, w *time.Time) {
	c.dmu.Lock()
	if r != nil {
		c.rdl = *r
	}
	if w != nil {
		c.wdl = *w
	}
	close(c.kick)
	c.kick = make(chan struct{})
	c.dmu.Unlock()
}

func (c *conn) SetDeadline(t time.Time) error {
	c.setDeadlines(&t, &t)
	return c.Conn.SetDeadline(t)
}

func (c *conn) SetReadDeadline(t time.Time) error {
	c.setDeadlines(&t, nil)
	return c.Conn.SetReadDeadline(t)
}

func (c *conn) SetWriteDeadline(t time.Time) error {
	c.setDeadlines(nil, &t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns[c.p], c)
		if len(c.f.conns[c.p]) == 0 {
			delete(c.f.conns, c.p)
		}
		if c.key != "" {
			delete(c.f.dialed, c.key)
		}
		close(c.closed)
		c.f.mu.Unlock()
	})
	return c.Conn.Close()
}

// Gossip returns a memberlist configuration hook that routes node's gossip
// through the fabric (after applying tune, if any).
func (f *Fabric) Gossip(node string, tune func(*memberlist.Config)) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		if tune != nil {
			tune(c)
		}
		nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{c.BindAddr},
			BindPort: c.BindPort, Logger: c.Logger})
		if err != nil {
			return // memberlist builds its own transport and reports the error
		}
		c.BindPort = nt.GetAutoBindPort()
		f.register(net.JoinHostPort(c.BindAddr, fmt.Sprint(c.BindPort)), node)
		t := &transport{NetTransport: nt, f: f, node: node, packets: make(chan *memberlist.Packet),
			streams: make(chan net.Conn), done: make(chan struct{})}
		t.wg.Add(2)
		go t.filterPackets()
		go t.filterStreams()
		c.Transport = t
	}
}

// transport carries gossip through the fabric: packets across a partition,
// to or from a frozen or killed node are lost, packets on a delayed link
// arrive late, and stream connections are fabric connections.
type transport struct {
	*memberlist.NetTransport
	f       *Fabric
	node    string
	packets chan *memberlist.Packet
	streams chan net.Conn
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup // the filters and late packets
}

var _ memberlist.NodeAwareTransport = (*transport)(nil)

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if _, ok := t.f.link(t.node, a.Addr); !ok {
		return time.Now(), nil // lost on the way
	}
	return t.NetTransport.WriteToAddress(b, a)
}

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return t.f.dial(ctx, t.node, a.Addr, true, func(ctx context.Context) (net.Conn, error) {
		d := net.Dialer{}
		return d.DialContext(ctx, "tcp", a.Addr)
	})
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) StreamCh() <-chan net.Conn { return t.streams }

func (t *transport) filterPackets() {
	defer t.wg.Done()
	for {
		select {
		case p, ok := <-t.NetTransport.PacketCh():
			if !ok {
				return
			}
			from := p.From.String()
			if _, ok := t.f.link(t.node, from); !ok {
				continue
			}
			t.f.mu.Lock()
			d := t.f.delay[pairOf(t.node, t.f.owner[from])]
			t.f.mu.Unlock()
			if d > 0 {
				t.wg.Add(1)
				go t.late(p, time.Now().Add(d))
				continue
			}
			select {
			case t.packets <- p:
			case <-t.done:
				return
			}
		case <-t.done:
			return
		}
	}
}

// late hands p over at when, unless its link went down meanwhile.
func (t *transport) late(p *memberlist.Packet, when time.Time) {
	defer t.wg.Done()
	timer := time.NewTimer(time.Until(when))
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-t.done:
		return
	}
	if _, ok := t.f.link(t.node, p.From.String()); !ok {
		return
	}
	p.Timestamp = time.Now()
	select {
	case t.packets <- p:
	case <-t.done:
	}
}

func (t *transport) filterStreams() {
	defer t.wg.Done()
	for {
		select {
		case c, ok := <-t.NetTransport.StreamCh():
			if !ok {
				return
			}
			fc := t.f.accepted(c, t.node)
			select {
			case t.streams <- fc:
			case <-t.done:
				fc.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *transport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	t.wg.Wait()
	// The inner transport's listeners may be handing over a packet or a
	// connection that the filters no longer take; its Shutdown waits for
	// them, so both are drained until it has stopped.
	stopped := make(chan struct{})
	go func() {
		for {
			select {
			case <-t.NetTransport.PacketCh():
			case c := <-t.NetTransport.StreamCh():
				c.Close()
			case <-stopped:
				return
			}
		}
	}()
	err := t.NetTransport.Shutdown()
	close(stopped)
	return err
}
