package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"
)

// GossipConfig turns on discovery with memberlist.
type GossipConfig struct {
	Bind      string   // host:port for gossip (UDP and TCP)
	Advertise string   // host:port peers reach this node's gossip at; default Bind
	Join      []string // gossip addresses of existing members
	// BootstrapExpect is how many servers must see each other before a new
	// cluster bootstraps; 0 never bootstraps (the node only joins).
	BootstrapExpect int
	// ClusterName labels gossip traffic; members of other clusters are ignored.
	ClusterName string
	// APIEndpoint is this node's HTTP API endpoint, published to its peers.
	APIEndpoint string
	// DeadServerTimeout is how long a server must stay unreachable before
	// the leader removes it from the voters.
	DeadServerTimeout time.Duration
	// ServerStabilization is how long a new server must stay healthy before
	// it is promoted to voter.
	ServerStabilization time.Duration
	// MinQuorum is the fewest voters dead-server cleanup may leave.
	MinQuorum int
	// PilotInterval paces the leader's membership reconciliation.
	PilotInterval time.Duration
	// Tune adjusts memberlist's configuration (timing, transport) in tests.
	Tune func(*memberlist.Config)
}

func (c *GossipConfig) defaults() {
	if c.ClusterName == "" {
		c.ClusterName = "raftlockd"
	}
	if c.DeadServerTimeout == 0 {
		c.DeadServerTimeout = time.Minute
	}
	if c.ServerStabilization == 0 {
		c.ServerStabilization = 3 * time.Second
	}
	if c.MinQuorum == 0 {
		c.MinQuorum = 1
		if c.BootstrapExpect > 1 {
			c.MinQuorum = c.BootstrapExpect/2 + 1
		}
	}
	if c.PilotInterval == 0 {
		c.PilotInterval = time.Second
	}
}

// memberMeta is what every node publishes about itself.
type memberMeta struct {
	ID      string `json:"id"`
	API     string `json:"api,omitempty"`
	Raft    string `json:"raft"`
	Backend string `json:"backend,omitempty"`
	Expect  int    `json:"expect"`
	State   bool   `json:"state"`         // has Raft state: belongs to a cluster
	Run     string `json:"run,omitempty"` // random per process start: tells a restart from an update
}

// Member is a server as gossip knows it.
type Member struct {
	ID         string    `json:"id"`
	GossipAddr string    `json:"gossip_addr"`
	RaftAddr   string    `json:"raft_addr"`
	API        string    `json:"api,omitempty"`
	Backend    string    `json:"backend_hash,omitempty"`
	Status     string    `json:"status"` // alive or dead
	Since      time.Time `json:"since"`
	meta       memberMeta
}

type gossip struct {
	n   *Node
	cfg GossipConfig
	ml  *memberlist.Memberlist

	mu      sync.Mutex
	members map[string]*Member
	missing map[string]time.Time // servers in the Raft configuration never seen alive, since when
	removed map[string]bool      // servers taken out of the configuration: not added back until they rejoin

	self         atomic.Pointer[memberMeta]
	joined       atomic.Bool
	bootstrapped atomic.Bool // this node started the cluster
	done         chan struct{}
	wg           sync.WaitGroup
	pilot        *pilot
}

func startGossip(n *Node, cfg GossipConfig) (*gossip, error) {
	cfg.defaults()
	g := &gossip{n: n, cfg: cfg, members: map[string]*Member{}, missing: map[string]time.Time{}, removed: map[string]bool{},
		done: make(chan struct{})}
	g.self.Store(&memberMeta{ID: n.cfg.NodeID, API: cfg.APIEndpoint, Raft: n.RaftAddr(), Expect: cfg.BootstrapExpect,
		State: n.HasState(), Backend: n.fsm.BackendHash(), Run: newBackendHash()})

	mc := memberlist.DefaultLANConfig()
	mc.Name = n.cfg.NodeID
	mc.Label = cfg.ClusterName
	host, port, err := splitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("cluster: gossip bind address: %w", err)
	}
	mc.BindAddr, mc.BindPort = host, port
	if cfg.Advertise != "" {
		if mc.AdvertiseAddr, mc.AdvertisePort, err = splitHostPort(cfg.Advertise); err != nil {
			return nil, fmt.Errorf("cluster: gossip advertise address: %w", err)
		}
		// memberlist wants an IP; a host name (a container's service
		// name, say) is resolved once here, as the Raft address is.
		if mc.AdvertiseAddr, err = resolveHost(mc.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("cluster: gossip advertise address %q: %w", cfg.Advertise, err)
		}
	}
	mc.Delegate = g
	mc.Events = g
	mc.Logger = log.New(memberlistLog{log: n.cfg.Logger.With("component", "gossip")}, "", 0)
	if cfg.Tune != nil {
		cfg.Tune(mc)
	}
	g.pilot = newPilot(g)
	g.ml, err = memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.Bind, err)
	}
	g.wg.Add(3)
	go g.joinLoop()
	go g.bootstrapLoop()
	go g.refreshLoop()
	return g, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return host, port, err
}

// resolveHost returns host if it is an IP address, else the address it
// resolves to (IPv4 preferred).
func resolveHost(host string) (string, error) {
	if net.ParseIP(host) != nil {
		return host, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return "", err
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	if len(ips) == 0 {
		return "", fmt.Errorf("%s resolves to no address", host)
	}
	return ips[0].String(), nil
}

// NodeMeta implements memberlist.Delegate.
func (g *gossip) NodeMeta(limit int) []byte {
	raw, _ := json.Marshal(g.self.Load())
	if len(raw) > limit {
		return nil
	}
	return raw
}

func (g *gossip) NotifyMsg([]byte)                           {}
func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *gossip) LocalState(join bool) []byte                { return nil }
func (g *gossip) MergeRemoteState(buf []byte, join bool)     {}

// NotifyJoin implements memberlist.EventDelegate.
func (g *gossip) NotifyJoin(node *memberlist.Node) { g.observe(node, "alive") }

// NotifyLeave implements memberlist.EventDelegate. memberlist reports both
// failures and graceful departures here; a server that leaves gracefully
// has already been taken out of the Raft configuration, so both count as
// dead.
func (g *gossip) NotifyLeave(node *memberlist.Node) { g.observe(node, "dead") }

// NotifyUpdate implements memberlist.EventDelegate.
func (g *gossip) NotifyUpdate(node *memberlist.Node) { g.observe(node, "alive") }

func (g *gossip) observe(node *memberlist.Node, status string) {
	var meta memberMeta
	if json.Unmarshal(node.Meta, &meta) != nil || meta.ID == "" {
		return
	}
	g.mu.Lock()
	m := g.members[meta.ID]
	if status == "alive" && (m == nil || m.Status != status || m.meta.Run != meta.Run) {
		delete(g.removed, meta.ID) // (re)joined or restarted since it was removed
	}
	if m == nil || m.Status != status {
		m = &Member{Since: time.Now()}
		g.members[meta.ID] = m
	}
	m.ID, m.GossipAddr, m.RaftAddr, m.API, m.Backend, m.Status, m.meta = meta.ID, node.Address(), meta.Raft, meta.API,
		meta.Backend, status, meta
	if status == "alive" {
		delete(g.missing, meta.ID)
	}
	g.mu.Unlock()
	g.pilot.kick()
}

// joinLoop contacts the join addresses until one answers.
func (g *gossip) joinLoop() {
	defer g.wg.Done()
	if len(g.cfg.Join) == 0 {
		g.joined.Store(true)
		return
	}
	backoff := 100 * time.Millisecond
	for {
		if _, err := g.ml.Join(g.cfg.Join); err == nil {
			g.joined.Store(true)
			g.n.cfg.Logger.Info("joined the cluster's gossip", "via", g.cfg.Join)
			return
		} else {
			g.n.cfg.Logger.Debug("gossip join failed; retrying", "error", err)
		}
		select {
		case <-g.done:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// bootstrapLoop starts a new cluster, once: when BootstrapExpect servers
// without Raft state see each other, the one with the lowest id bootstraps
// them all as voters; the others are contacted by the new leader. A node
// that already has state, or that sees a member with state, never
// bootstraps, so restarting with the same flags cannot split the cluster.
func (g *gossip) bootstrapLoop() {
	defer g.wg.Done()
	expect := g.cfg.BootstrapExpect
	if expect <= 0 {
		return
	}
	for {
		if g.n.HasState() {
			return
		}
		if g.joined.Load() {
			servers, ok := g.bootstrapSet(expect)
			if !ok {
				return // a cluster exists; its leader will add this node
			}
			if len(servers) >= expect && servers[0].ID == raft.ServerID(g.n.cfg.NodeID) {
				if err := g.n.Bootstrap(servers); err != nil {
					g.n.cfg.Logger.Warn("bootstrap failed", "error", err)
				} else {
					g.n.cfg.Logger.Info("bootstrapped a new cluster", "voters", len(servers))
					g.bootstrapped.Store(true)
					g.refresh()
					return
				}
			}
		}
		select {
		case <-g.done:
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// bootstrapSet lists the alive servers waiting for the same bootstrap,
// sorted by id; ok is false when some member already belongs to a cluster.
func (g *gossip) bootstrapSet(expect int) ([]raft.Server, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var servers []raft.Server
	for _, m := range g.members {
		if m.Status != "alive" {
			continue
		}
		if m.meta.State {
			return nil, false
		}
		if m.meta.Expect == expect {
			servers = append(servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(m.ID), Address: raft.ServerAddress(m.RaftAddr)})
		}
	}
	slices.SortFunc(servers, func(a, b raft.Server) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return servers, true
}

// refreshLoop republishes this node's metadata when it changes.
func (g *gossip) refreshLoop() {
	defer g.wg.Done()
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
			g.refresh()
		}
	}
}

func (g *gossip) refresh() {
	cur := *g.self.Load()
	next := cur
	next.State, next.Backend = g.n.HasState(), g.n.fsm.BackendHash()
	if next == cur {
		return
	}
	g.self.Store(&next)
	if err := g.ml.UpdateNode(time.Second); err != nil {
		g.n.cfg.Logger.Debug("gossip metadata update", "error", err)
	}
}

// APIEndpoint implements Directory.
func (g *gossip) APIEndpoint(id string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.members[id]; m != nil {
		return m.API
	}
	return ""
}

// Members lists every server gossip has seen.
func (g *gossip) Members() []Member {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]Member, 0, len(g.members))
	for _, m := range g.members {
		out = append(out, *m)
	}
	slices.SortFunc(out, func(a, b Member) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return out
}

// forget keeps the leader from adding server id back while gossip still
// sees it alive: it was removed from the configuration on purpose. A server
// that goes away and joins again is added as usual.
func (g *gossip) forget(id string) {
	g.mu.Lock()
	g.removed[id] = true
	g.mu.Unlock()
}

// unforget undoes forget after a removal that did not happen.
func (g *gossip) unforget(id string) {
	g.mu.Lock()
	delete(g.removed, id)
	g.mu.Unlock()
}

// wasRemoved reports whether id was removed and has not rejoined since.
func (g *gossip) wasRemoved(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.removed[id]
}

// addr is this node's gossip address.
func (g *gossip) addr() string { return g.ml.LocalNode().Address() }

// leave announces a graceful departure.
func (g *gossip) leave(timeout time.Duration) error { return g.ml.Leave(timeout) }

func (g *gossip) close() {
	close(g.done)
	g.pilot.stop()
	g.wg.Wait()
	_ = g.ml.Shutdown()
}

// leaderChanged starts or stops the leader's membership management.
func (g *gossip) leaderChanged(isLeader bool) {
	if isLeader {
		g.pilot.start()
	} else {
		g.pilot.stop()
	}
}

// memberlistLog turns memberlist's "[LEVEL] memberlist: message" lines
// into slog records.
type memberlistLog struct{ log *slog.Logger }

func (m memberlistLog) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := slog.LevelDebug
	for prefix, lv := range map[string]slog.Level{"[ERR]": slog.LevelError, "[WARN]": slog.LevelWarn, "[INFO]": slog.LevelInfo} {
		if bytes.HasPrefix(line, []byte(prefix)) {
			level = lv
			line = bytes.TrimSpace(line[len(prefix):])
		}
	}
	m.log.Log(context.Background(), level, string(bytes.TrimPrefix(line, []byte("memberlist: "))))
	return len(p), nil
}
