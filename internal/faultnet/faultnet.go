// Package faultnet is the network of in-process test clusters, with faults
// a test can inject: it partitions any set of nodes from any other (closing
// the connections between them), delays links, and heals. Every node gets
// its own view (a cluster.Network for Raft and forwarding, a memberlist
// transport for gossip) so that the fabric knows who talks to whom.
package faultnet

import (
	"context"
	"fmt"
	"net"
	"sync"
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
	blocked map[pair]bool
	delay   map[pair]time.Duration
	conns   map[pair]map[*conn]struct{}
}

// New returns a fabric with every link up.
func New() *Fabric {
	return &Fabric{owner: map[string]string{}, blocked: map[pair]bool{}, delay: map[pair]time.Duration{},
		conns: map[pair]map[*conn]struct{}{}}
}

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
	return dst, dst == "" || !f.blocked[pairOf(node, dst)]
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
	var cut []*conn
	for a, ga := range group {
		for b, gb := range group {
			if ga != gb {
				p := pairOf(a, b)
				f.blocked[p] = true
				for c := range f.conns[p] {
					cut = append(cut, c)
				}
			}
		}
	}
	f.mu.Unlock()
	for _, c := range cut {
		c.Close()
	}
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

// Heal restores every link and removes every delay.
func (f *Fabric) Heal() {
	f.mu.Lock()
	f.blocked = map[pair]bool{}
	f.delay = map[pair]time.Duration{}
	f.mu.Unlock()
}

// Delay slows every write between a and b by d.
func (f *Fabric) Delay(a, b string, d time.Duration) {
	f.mu.Lock()
	f.delay[pairOf(a, b)] = d
	f.mu.Unlock()
}

func (f *Fabric) delayOf(p pair) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delay[p]
}

// conn is a connection the fabric can cut.
type conn struct {
	net.Conn
	f    *Fabric
	p    pair
	once sync.Once
}

func (f *Fabric) track(c net.Conn, p pair) *conn {
	fc := &conn{Conn: c, f: f, p: p}
	f.mu.Lock()
	if f.conns[p] == nil {
		f.conns[p] = map[*conn]struct{}{}
	}
	f.conns[p][fc] = struct{}{}
	f.mu.Unlock()
	return fc
}

func (c *conn) Write(b []byte) (int, error) {
	if d := c.f.delayOf(c.p); d > 0 {
		time.Sleep(d)
	}
	return c.Conn.Write(b)
}

func (c *conn) Close() error {
	c.once.Do(func() {
		c.f.mu.Lock()
		delete(c.f.conns[c.p], c)
		c.f.mu.Unlock()
	})
	return c.Conn.Close()
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
	return ln, nil
}

func (n *network) Dial(ctx context.Context, addr string) (net.Conn, error) {
	dst, ok := n.f.link(n.node, addr)
	if !ok {
		return nil, fmt.Errorf("faultnet: %s cannot reach %s (partitioned)", n.node, dst)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return n.f.track(c, pairOf(n.node, dst)), nil
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
		t := &transport{NetTransport: nt, f: f, node: node, packets: make(chan *memberlist.Packet), done: make(chan struct{})}
		go t.filter()
		c.Transport = t
	}
}

// transport drops gossip across partitions.
type transport struct {
	*memberlist.NetTransport
	f       *Fabric
	node    string
	packets chan *memberlist.Packet
	done    chan struct{}
	once    sync.Once
}

func (t *transport) WriteTo(b []byte, addr string) (time.Time, error) {
	if _, ok := t.f.link(t.node, addr); !ok {
		return time.Now(), nil // lost on the way
	}
	return t.NetTransport.WriteTo(b, addr)
}

func (t *transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	dst, ok := t.f.link(t.node, addr)
	if !ok {
		return nil, fmt.Errorf("faultnet: %s cannot reach %s (partitioned)", t.node, dst)
	}
	c, err := t.NetTransport.DialTimeout(addr, timeout)
	if err != nil {
		return nil, err
	}
	return t.f.track(c, pairOf(t.node, dst)), nil
}

func (t *transport) PacketCh() <-chan *memberlist.Packet { return t.packets }

func (t *transport) filter() {
	for {
		select {
		case p, ok := <-t.NetTransport.PacketCh():
			if !ok {
				return
			}
			if _, ok := t.f.link(t.node, p.From.String()); !ok {
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

func (t *transport) Shutdown() error {
	t.once.Do(func() { close(t.done) })
	// The inner transport's listener may be handing over a packet that
	// filter no longer takes; its Shutdown waits for that listener, so
	// packets are drained until it has stopped.
	stopped := make(chan struct{})
	go func() {
		for {
			select {
			case <-t.NetTransport.PacketCh():
			case <-stopped:
				return
			}
		}
	}()
	err := t.NetTransport.Shutdown()
	close(stopped)
	return err
}
