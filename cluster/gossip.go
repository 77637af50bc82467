package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/fsm"
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
	// SecretKey (16, 24 or 32 bytes) encrypts and authenticates gossip:
	// a node without it cannot take part. Empty: gossip is plain.
	SecretKey []byte
	// AcceptKeys are further keys gossip from others may be encrypted
	// with (while a cluster moves to a new key); this node sends with
	// SecretKey.
	AcceptKeys [][]byte
	// APIEndpoint is this node's HTTP API endpoint, published to its peers.
	APIEndpoint string
	// DeadServerTimeout is how long a server must stay unreachable before
	// the leader removes it from the voters.
	DeadServerTimeout time.Duration
	// ServerStabilization is how long a new server must stay healthy before
	// it is promoted to voter.
	ServerStabilization time.Duration
	// MinQuorum raises the fewest voters dead-server cleanup may leave
	// while this node leads; 0 leaves it at the island's floor, a majority
	// of the most voters the island has had alive (replicated, so every
	// leader uses the same floor).
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
	State   bool   `json:"state"`            // has Raft state: belongs to a cluster
	Run     string `json:"run,omitempty"`    // random per process start: tells a restart from an update
	Format  int    `json:"format,omitempty"` // newest Raft entry format the node applies (fsm.EntryFormat)
	Island  bool   `json:"island,omitempty"` // names its island on Raft connections (writeIsland)
}

// Member is a server as gossip knows it.
type Member struct {
	ID         string    `json:"id"`
	GossipAddr string    `json:"gossip_addr"`
	RaftAddr   string    `json:"raft_addr"`
	API        string    `json:"api,omitempty"`
	Backend    string    `json:"backend_hash,omitempty"`
	Status     string    `json:"status"` // alive, dead or left (cluster leave)
	Since      time.Time `json:"since"`
	meta       memberMeta
}

type gossip struct {
	n        *Node
	cfg      GossipConfig
	ml       *memberlist.Memberlist
	selfAddr string              // the address this node gossips at, read once at start
	keyring  *memberlist.Keyring // nil when gossip is not encrypted

	mu         sync.Mutex
	members    map[string]*Member
	missing    map[string]time.Time // servers in the Raft configuration never seen alive, since when
	removed    map[string]string    // servers taken out of the configuration, and the run taken out: not added back until they rejoin
	leaving    map[string]string    // servers that said they are leaving (cluster leave), and the run that said it
	config     map[string]string    // the servers of the Raft configuration when noteRemovals last looked, and their runs then
	configAddr map[string]string    // the Raft addresses of those servers then

	self         atomic.Pointer[memberMeta]
	joined       atomic.Bool
	bootstrapped atomic.Bool  // this node started the cluster
	bootVoters   atomic.Int64 // voters of the configuration this node bootstrapped
	tooMany      atomic.Int64 // servers seen waiting for the same bootstrap, when more than expected
	tooManyLog   warnEvery    // paces that complaint
	otherExpect  warnEvery    // paces the one about servers waiting for a bootstrap of another size
	twinLog      warnEvery    // paces the one about a later server running under this node's id

	twinCheck atomic.Bool // a check of another server announcing this node's id is under way
	started   atomic.Bool // selfAddr is set
	stale     atomic.Bool // a member holds this node at an address it no longer gossips at

	promiseMu sync.Mutex
	promise   bootstrapPromise // the bootstrap configuration this server agreed to

	ctx    context.Context // ends when gossip closes
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup
	pilot  *pilot
}

func startGossip(n *Node, cfg GossipConfig) (*gossip, error) {
	cfg.defaults()
	g := &gossip{n: n, cfg: cfg, members: map[string]*Member{}, missing: map[string]time.Time{}, removed: map[string]string{}, leaving: map[string]string{},
		tooManyLog: warnEvery{every: 10 * time.Second}, otherExpect: warnEvery{every: 10 * time.Second}, twinLog: warnEvery{every: 10 * time.Second}, done: make(chan struct{})}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	g.self.Store(&memberMeta{ID: n.cfg.NodeID, API: cfg.APIEndpoint, Raft: n.RaftAddr(), Expect: cfg.BootstrapExpect,
		State: n.HasState(), Backend: n.fsm.BackendHash(), Run: newBackendHash(), Format: fsm.EntryFormat, Island: true})

	mc := memberlist.DefaultLANConfig()
	mc.Name = n.cfg.NodeID
	mc.Label = cfg.ClusterName
	if len(cfg.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(cfg.AcceptKeys, cfg.SecretKey)
		if err != nil {
			return nil, fmt.Errorf("cluster: gossip key: %w", err)
		}
		mc.Keyring, g.keyring = kr, kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
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
	// memberlist refuses a member's name at a new address while it holds
	// the old one, and by default for as long as it remembers the member
	// once dead (GossipToTheDeadTime, 30 s): a server that comes back at a
	// new address (a container recreated) would stay out that long, and
	// then until its next push/pull. Once the old address is declared
	// dead, the name is free; the moved server announces itself again
	// meanwhile (reconnectLoop).
	mc.DeadNodeReclaimTime = time.Second
	mc.Delegate = g
	mc.Events = g
	mc.Conflict = g
	mc.Merge = g
	mc.Ping = n.clocks
	mc.Logger = log.New(memberlistLog{log: n.cfg.Logger.With("component", "gossip")}, "", 0)
	if cfg.Tune != nil {
		cfg.Tune(mc)
	}
	g.pilot = newPilot(g)
	g.ml, err = memberlist.Create(mc)
	if err != nil {
		g.cancel()
		return nil, fmt.Errorf("cluster: start gossip on %s: %w", cfg.Bind, err)
	}
	// Read before the loops start: memberlist rewrites its local node
	// when this node's metadata changes (refresh).
	g.selfAddr = g.ml.LocalNode().Address()
	g.started.Store(true)
	g.wg.Add(5)
	go g.joinLoop()
	go g.bootstrapLoop()
	go g.refreshLoop()
	go g.reconnectLoop(5 * mc.ProbeInterval)
	go func() {
		defer g.wg.Done()
		g.pilot.run(g.done)
	}()
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

// leavingNote is the message a node sends every member, over TCP, just
// before it leaves the gossip gracefully (cluster leave).
type leavingNote struct {
	Leaving string `json:"leaving"` // node id
	Run     string `json:"run"`
}

// NotifyMsg implements memberlist.Delegate: a member says it is leaving.
func (g *gossip) NotifyMsg(b []byte) {
	var note leavingNote
	if json.Unmarshal(b, &note) != nil || note.Leaving == "" {
		return
	}
	g.mu.Lock()
	g.leaving[note.Leaving] = note.Run
	g.mu.Unlock()
}

func (g *gossip) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (g *gossip) LocalState(join bool) []byte                { return nil }
func (g *gossip) MergeRemoteState(buf []byte, join bool)     {}

// NotifyJoin implements memberlist.EventDelegate.
func (g *gossip) NotifyJoin(node *memberlist.Node) { g.observe(node, "alive") }

// NotifyLeave implements memberlist.EventDelegate. memberlist reports both
// failures ("dead") and graceful departures ("left": the member said it
// was leaving, cluster leave) here. A server that left has already been
// taken out of the Raft configuration; everything that acts on a dead
// member acts on one that left alike.
func (g *gossip) NotifyLeave(node *memberlist.Node) {
	status := "dead"
	var meta memberMeta
	if json.Unmarshal(node.Meta, &meta) == nil {
		g.mu.Lock()
		if run, ok := g.leaving[meta.ID]; ok && run == meta.Run {
			status = "left"
		}
		g.mu.Unlock()
	}
	g.observe(node, status)
}

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
		if g.leaving[meta.ID] != meta.Run {
			delete(g.leaving, meta.ID) // a later run than the one that left
		}
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

// NotifyMerge implements memberlist.MergeDelegate: a member this node
// joined (or that joined it) sent its view of the cluster. When that view
// holds this node at another address, this node moved (restarted at a new
// address) and the member has not taken the new one yet: reconnectLoop
// joins the members again until none does.
func (g *gossip) NotifyMerge(peers []*memberlist.Node) error {
	if !g.started.Load() {
		return nil
	}
	for _, p := range peers {
		if p.Name == g.n.cfg.NodeID && p.Address() != g.selfAddr {
			g.stale.Store(true)
		}
	}
	return nil
}

// NotifyConflict implements memberlist.ConflictDelegate: gossip heard of
// a member named like another at a different address. When that name is
// this node's, another server may run under this node's id (started with
// the same --node-id, or on a copy of this one's data directory). Raft
// tells servers apart by id: two processes answering for one voter can
// each be elected in the same term with another server's vote, and commit
// what the other overwrites. checkTwin stops the one that started later.
// memberlist holds its lock here: the check runs on its own goroutine.
func (g *gossip) NotifyConflict(existing, other *memberlist.Node) {
	if other.Name != g.n.cfg.NodeID {
		return
	}
	var meta memberMeta
	if json.Unmarshal(other.Meta, &meta) != nil || meta.Raft == "" || meta.Raft == g.n.RaftAddr() {
		return
	}
	if !g.twinCheck.CompareAndSwap(false, true) {
		return
	}
	addr := other.Address()
	if !g.n.spawn(func() {
		defer g.twinCheck.Store(false)
		g.checkTwin(meta.Raft, addr)
	}) {
		g.twinCheck.Store(false)
	}
}

// checkTwin asks the server at Raft address raftAddr, which gossip
// announces under this node's id, for its status. A process answering
// there as this node is another server with this node's id: the later of
// the two to start halts, saying why; the earlier one logs it and goes on.
// A server that no longer answers there (one that moved, or stopped) is
// left alone.
func (g *gossip) checkTwin(raftAddr, gossipAddr string) {
	ctx, cancel := context.WithTimeout(g.n.life, 2*time.Second)
	defer cancel()
	st, err := g.n.PeerStatus(ctx, raftAddr)
	if err != nil || st.NodeID != g.n.cfg.NodeID || st.RaftAddr == g.n.RaftAddr() || st.Started == 0 {
		return
	}
	mine := g.n.started.UnixNano()
	if st.Started > mine || st.Started == mine && raftAddr > g.n.RaftAddr() {
		if g.twinLog.due() {
			g.n.cfg.Logger.Error("another server runs under this node's id; it started later and stops",
				"raft", raftAddr, "gossip", gossipAddr)
		}
		return
	}
	g.n.cfg.Logger.Error("another server already runs under this node's id: this one, started later, stops",
		"raft", raftAddr, "gossip", gossipAddr)
	g.n.fsm.Halt(fmt.Errorf("cluster: another server already runs under this node's id %s (Raft %s, gossip %s): "+
		"two servers must not share a node id (a repeated --node-id, or a copy of another server's data directory); "+
		"this one started later and stops", g.n.cfg.NodeID, raftAddr, gossipAddr))
}

// joinLoop contacts the join addresses until one answers.
func (g *gossip) joinLoop() {
	defer g.wg.Done()
	if len(g.cfg.Join) == 0 {
		g.joined.Store(true)
		return
	}
	backoff := 100 * time.Millisecond
	// Peers starting at the same time refuse the first attempts; failures
	// that go on (a wrong --join, gossip key or CA) are told, every 30
	// seconds at most.
	start, complain := time.Now(), warnEvery{every: 30 * time.Second}
	for {
		_, err := g.ml.Join(g.cfg.Join)
		if err == nil && !g.joined.Load() {
			g.joined.Store(true)
			g.n.cfg.Logger.Info("joined the cluster's gossip", "via", g.cfg.Join)
		}
		if err = g.joinedOthers(err); err == nil {
			return
		} else if time.Since(start) > 10*time.Second && complain.due() {
			g.n.cfg.Logger.Warn("gossip join keeps failing (check --join, and that every server has the same gossip key and CA); retrying",
				"via", g.cfg.Join, "for", time.Since(start).Round(time.Second).String(), "error", err)
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

// joinedOthers is the outcome of a Join that returned err: memberlist
// counts a push/pull with this node's own address (listed in --join like
// every other) as a success. That is enough to take part in a bootstrap
// (joined: the list may name this node under another name, and it may
// be the only one to bootstrap), but not to stop trying the others, which
// may never join this node in turn, unless the list names only it.
func (g *gossip) joinedOthers(err error) error {
	if err == nil && g.ml.NumMembers() < 2 && !g.onlySelf() {
		return errors.New("only this node's own address answered")
	}
	return err
}

// onlySelf tells whether every --join address is this node's own gossip
// address: there is nobody else to join.
func (g *gossip) onlySelf() bool {
	for _, a := range g.cfg.Join {
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if ip, err := resolveHost(host); err != nil || net.JoinHostPort(ip, port) != g.selfAddr {
			return false
		}
	}
	return true
}

// bootstrapLoop starts a new cluster, once: when exactly BootstrapExpect
// servers without Raft state and expecting as many see each other, the one
// with the lowest id asks every other one, over the cluster port, to promise
// that it has no Raft state and joins no other bootstrap (bootstrapPromise),
// and bootstraps them all as voters once all have; the others are contacted
// by the new leader. When more servers than expected wait, nothing
// bootstraps: which of them would form the cluster is not decided by
// anything they all agree on. A node that already has state, or that sees a
// member with state, never bootstraps, so restarting with the same flags
// cannot split the cluster.
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
			switch {
			case len(servers) > expect:
				g.reportTooMany(servers, expect)
			case len(servers) == expect && servers[0].ID == raft.ServerID(g.n.cfg.NodeID):
				g.tooMany.Store(0)
				if err := g.bootstrap(servers); err != nil {
					g.n.cfg.Logger.Info("bootstrap not agreed yet; retrying", "reason", err)
				} else {
					g.n.cfg.Logger.Info("bootstrapped a new cluster", "voters", len(servers))
					g.bootVoters.Store(int64(len(servers)))
					g.bootstrapped.Store(true)
					g.refresh()
					return
				}
			default:
				g.tooMany.Store(0)
				g.reportOtherExpect(expect)
			}
		}
		// Two servers that each saw a different set start their attempts
		// at different moments.
		select {
		case <-g.done:
			return
		case <-time.After(200*time.Millisecond + time.Duration(rand.Int64N(int64(100*time.Millisecond)))):
		}
	}
}

// reportTooMany tells the operator, every 10 seconds at most, that more
// servers wait for this bootstrap than it expects.
func (g *gossip) reportTooMany(servers []raft.Server, expect int) {
	g.tooMany.Store(int64(len(servers)))
	if !g.tooManyLog.due() {
		return
	}
	ids := make([]string, len(servers))
	for i, s := range servers {
		ids[i] = string(s.ID)
	}
	g.n.cfg.Logger.Error(fmt.Sprintf("%d servers without Raft state wait for a bootstrap of %d (--bootstrap-expect %d); "+
		"none will bootstrap until exactly %d do: start the extra servers with --bootstrap-expect 0, "+
		"they join once the cluster exists", len(servers), expect, expect, expect), "servers", ids)
}

// reportOtherExpect tells the operator, every 10 seconds at most, about
// servers without Raft state that wait for a bootstrap of another size:
// with them, no bootstrap ever gathers the servers it expects.
func (g *gossip) reportOtherExpect(expect int) {
	var others []string
	g.mu.Lock()
	for _, m := range g.members {
		if m.Status == "alive" && !m.meta.State && m.meta.Expect > 0 && m.meta.Expect != expect {
			others = append(others, fmt.Sprintf("%s (--bootstrap-expect %d)", m.ID, m.meta.Expect))
		}
	}
	g.mu.Unlock()
	if len(others) == 0 || !g.otherExpect.due() {
		return
	}
	slices.Sort(others)
	g.n.cfg.Logger.Warn(fmt.Sprintf("servers without Raft state wait for a bootstrap of another size than this one's %d: "+
		"start every founding server with the same --bootstrap-expect", expect), "servers", others)
}

// bootstrapPromiseTTL bounds how long a server stays promised to a
// bootstrap configuration whose initiator has not contacted it since.
const bootstrapPromiseTTL = 10 * time.Second

// bootstrapPromise is a server's agreement to be bootstrapped only into the
// configuration named by key, until the time given.
type bootstrapPromise struct {
	key   string
	until time.Time
}

// configKey names a bootstrap configuration: its servers' ids and Raft
// addresses, in order.
func configKey(servers []raft.Server) string {
	parts := make([]string, len(servers))
	for i, s := range servers {
		parts[i] = string(s.ID) + "@" + string(s.Address)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// grantPromise promises that this server will take part in no bootstrap
// but servers' until the promise expires, if it has no Raft state, expects
// a cluster of that size, is named in it with its own Raft address, sees no
// member with state and no other server waiting for the same bootstrap, and
// has promised no other configuration.
func (g *gossip) grantPromise(servers []raft.Server) error {
	self := raft.ServerID(g.n.cfg.NodeID)
	if g.n.HasState() {
		return fmt.Errorf("%s already has Raft state", self)
	}
	expect := g.cfg.BootstrapExpect
	if expect != len(servers) {
		return fmt.Errorf("%s expects %d servers, the configuration names %d", self, expect, len(servers))
	}
	named := map[string]bool{}
	for _, s := range servers {
		named[string(s.ID)] = true
		if s.ID == self && s.Address != raft.ServerAddress(g.n.RaftAddr()) {
			return fmt.Errorf("%s listens for Raft at %s, not %s", self, g.n.RaftAddr(), s.Address)
		}
	}
	if !named[string(self)] {
		return fmt.Errorf("%s is not in the configuration", self)
	}
	g.mu.Lock()
	for _, m := range g.members {
		switch {
		case m.Status != "alive":
		case m.meta.State:
			g.mu.Unlock()
			return fmt.Errorf("%s sees %s, which belongs to a cluster", self, m.ID)
		case m.meta.Expect == expect && !named[m.ID]:
			g.mu.Unlock()
			return fmt.Errorf("%s sees %s waiting for the same bootstrap", self, m.ID)
		case m.meta.Expect > 0 && m.meta.Expect != expect:
			g.mu.Unlock()
			return fmt.Errorf("%s sees %s waiting for a bootstrap of %d servers, not %d", self, m.ID, m.meta.Expect, expect)
		}
	}
	g.mu.Unlock()
	key := configKey(servers)
	now := time.Now()
	g.promiseMu.Lock()
	defer g.promiseMu.Unlock()
	if g.promise.key != "" && g.promise.key != key && now.Before(g.promise.until) {
		return fmt.Errorf("%s promised another bootstrap configuration (%s)", self, g.promise.key)
	}
	// A founder's empty state is all the new cluster has: it votes.
	if err := g.n.founded(); err != nil {
		return err
	}
	g.promise = bootstrapPromise{key: key, until: now.Add(bootstrapPromiseTTL)}
	return nil
}

// releasePromise withdraws a promise to the configuration named by key.
func (g *gossip) releasePromise(key string) {
	g.promiseMu.Lock()
	defer g.promiseMu.Unlock()
	if g.promise.key == key {
		g.promise = bootstrapPromise{}
	}
}

// bootstrap gathers every server's promise for servers, this one's first,
// and bootstraps them once all have promised; otherwise it releases the
// promises it gathered.
func (g *gossip) bootstrap(servers []raft.Server) error {
	self := raft.ServerID(g.n.cfg.NodeID)
	if err := g.grantPromise(servers); err != nil {
		return err
	}
	key := configKey(servers)
	var granted []raft.Server
	var failure error
	for _, s := range servers {
		if s.ID == self {
			continue
		}
		ctx, cancel := context.WithTimeout(g.ctx, 2*time.Second)
		var reply PromiseReply
		err := g.n.peers.call(ctx, string(s.Address), "Promise", PromiseArgs{Servers: servers}, &reply)
		cancel()
		if err == nil && reply.Refused != "" {
			err = errors.New(reply.Refused)
		}
		if err != nil {
			failure = fmt.Errorf("%s did not promise: %w", s.ID, err)
			break
		}
		granted = append(granted, s)
	}
	if failure == nil && g.n.HasState() {
		failure = fmt.Errorf("%s already has Raft state", self)
	}
	if failure != nil {
		g.releasePromise(key)
		for _, s := range granted {
			ctx, cancel := context.WithTimeout(g.ctx, time.Second)
			_ = g.n.peers.call(ctx, string(s.Address), "Promise", PromiseArgs{Servers: servers, Release: true}, &PromiseReply{})
			cancel()
		}
		return failure
	}
	return g.n.Bootstrap(servers)
}

// bootstrapSet lists the alive servers waiting for the same bootstrap,
// sorted by id; ok is false when some member already belongs to a cluster.
// While a server without state waits for a bootstrap of another size, the
// list is empty: servers that disagree on the size bootstrap nothing,
// rather than a cluster each.
func (g *gossip) bootstrapSet(expect int) ([]raft.Server, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var servers []raft.Server
	disagree := false
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
		disagree = disagree || m.meta.Expect > 0 && m.meta.Expect != expect
	}
	if disagree {
		return nil, true
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

// reconnectLoop heals gossip after a partition. memberlist stops talking
// to a member it has declared dead, so two sides of a network split that
// lasted longer than failure detection would never hear of each other
// again, and the leader would eventually remove healthy voters. Every
// interval, this node asks each Raft server that gossip holds dead (and
// that was not removed on purpose) to join it; a member that answers
// refutes its death and both sides see it alive again. While a member
// holds this node at an address it no longer has (NotifyMerge), it also
// joins every member it sees alive, which tells them its address: each
// takes it once it has declared the old one dead.
func (g *gossip) reconnectLoop(interval time.Duration) {
	defer g.wg.Done()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-g.done:
			return
		case <-t.C:
		}
		servers, err := g.n.Servers()
		if err != nil {
			continue
		}
		var dead, alive []string
		stale := g.stale.Swap(false)
		g.mu.Lock()
		for _, s := range servers {
			m := g.members[string(s.ID)]
			if m != nil && m.Status != "alive" && !g.removedLocked(m.ID) && string(s.ID) != g.n.cfg.NodeID {
				dead = append(dead, m.GossipAddr)
			}
		}
		for id, m := range g.members {
			if stale && m.Status == "alive" && id != g.n.cfg.NodeID {
				alive = append(alive, m.GossipAddr)
			}
		}
		g.mu.Unlock()
		for _, a := range slices.Concat(dead, alive) {
			select {
			case <-g.done:
				return
			default:
			}
			if _, err := g.ml.Join([]string{a}); err == nil && slices.Contains(dead, a) {
				g.n.cfg.Logger.Info("gossip reached a member it had declared dead", "addr", a)
			}
		}
	}
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
			cf := g.n.raft.GetConfiguration()
			g.noteRemovalsIn(cf)
			g.notePacking(cf)
		}
	}
}

// noteRemovals remembers, as removed on purpose, every server that has left
// the Raft configuration since this node last looked. Every node watches,
// so that whichever becomes leader next does not add back a server another
// leader removed while it still runs; one that was dead, or restarts,
// rejoins as usual (observe).
//
// Only a committed configuration counts: one a new leader may still
// discard would make a server that is being added look removed.
func (g *gossip) noteRemovals() { g.noteRemovalsIn(g.n.raft.GetConfiguration()) }

func (g *gossip) noteRemovalsIn(cf raft.ConfigurationFuture) {
	if cf.Error() != nil || cf.Index() > g.n.raft.AppliedIndex() {
		return
	}
	g.noteConfig(cf.Configuration().Servers)
}

// noteConfig remembers as removed every server of the configuration seen
// last that servers lacks, with the run it had then: a server that
// restarted in between (gossip already announces its next run) counts as
// rejoined, whichever this node heard of first.
func (g *gossip) noteConfig(servers []raft.Server) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cur := make(map[string]string, len(servers))
	addrs := make(map[string]string, len(servers))
	for _, s := range servers {
		cur[string(s.ID)] = g.runLocked(string(s.ID))
		addrs[string(s.ID)] = string(s.Address)
	}
	for id, run := range g.config {
		if _, ok := cur[id]; !ok && !g.movedLocked(id) {
			g.removed[id] = run
		}
	}
	g.config, g.configAddr = cur, addrs
}

// movedLocked tells whether server id, which left the configuration, is
// alive at another Raft address than the one the configuration held: it
// was taken out because another server took its old address over
// (containers restarted on each other's addresses), not removed, and is
// added back at its new address.
func (g *gossip) movedLocked(id string) bool {
	m := g.members[id]
	return m != nil && m.Status == "alive" && m.RaftAddr != "" && m.RaftAddr != g.configAddr[id]
}

// runLocked is the run gossip announces for id ("" when it knows none).
func (g *gossip) runLocked(id string) string {
	if m := g.members[id]; m != nil {
		return m.meta.Run
	}
	return ""
}

// removedLocked tells whether id was removed and has not rejoined since:
// gossip has seen no other run of it than the one removed.
func (g *gossip) removedLocked(id string) bool {
	run, ok := g.removed[id]
	return ok && (run == "" || run == g.runLocked(id))
}

// notePacking lets the leader pack commands into one entry
// (fsm.EncodePacked) only while every server of the latest configuration
// announces that it applies such entries: during a rolling upgrade, a
// server still on an older build would otherwise meet an entry it cannot
// read.
func (g *gossip) notePacking(cf raft.ConfigurationFuture) {
	if cf.Error() != nil {
		g.n.packOK.Store(false)
		return
	}
	all := true
	g.mu.Lock()
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == g.n.cfg.NodeID {
			continue
		}
		if m := g.members[string(s.ID)]; m == nil || m.meta.Format < fsm.EntryFormat {
			all = false
			break
		}
	}
	g.mu.Unlock()
	g.n.packOK.Store(all)
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
	return g.announced(id, func(m *Member) string { return m.API })
}

// raftAddr is the Raft address server id last announced.
func (g *gossip) raftAddr(id string) string {
	return g.announced(id, func(m *Member) string { return m.RaftAddr })
}

// announced is what pick reads from server id's last announcement, or ""
// when gossip has not heard of it.
func (g *gossip) announced(id string, pick func(*Member) string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.members[id]; m != nil {
		return pick(m)
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
	g.removed[id] = g.runLocked(id)
	g.mu.Unlock()
}

// forgetFailed is forget for a server removed as failed, which gossip
// held dead with run deadRun: false, forgetting nothing, when gossip sees
// it alive again; otherwise only that run is kept out.
func (g *gossip) forgetFailed(id, deadRun string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if m := g.members[id]; m != nil && m.Status == "alive" {
		return false
	}
	g.removed[id] = deadRun
	return true
}

// unforget undoes forget after a removal that did not happen.
func (g *gossip) unforget(id string) {
	g.mu.Lock()
	delete(g.removed, id)
	g.mu.Unlock()
}

// olderBuildAt tells whether an alive member announcing Raft address addr
// runs a build from before the island check.
func (g *gossip) olderBuildAt(addr string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, m := range g.members {
		if m.RaftAddr == addr && m.Status == "alive" && !m.meta.Island {
			return true
		}
	}
	return false
}

// wasRemoved reports whether id was removed and has not rejoined since.
func (g *gossip) wasRemoved(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.removedLocked(id)
}

// addr is this node's gossip address.
func (g *gossip) addr() string { return g.selfAddr }

// leave announces a graceful departure: first, to every member over TCP,
// that this node is leaving (so the others tell its departure from a
// failure, whatever order gossip delivers things in), then the departure.
func (g *gossip) leave(timeout time.Duration) error {
	note, _ := json.Marshal(leavingNote{Leaving: g.n.cfg.NodeID, Run: g.self.Load().Run})
	for _, m := range g.ml.Members() {
		if m.Name != g.ml.LocalNode().Name {
			_ = g.ml.SendReliable(m, note)
		}
	}
	return g.ml.Leave(timeout)
}

func (g *gossip) close() {
	g.cancel()
	close(g.done)
	g.wg.Wait()
	_ = g.ml.Shutdown()
}

// leaderChanged starts or stops the leader's membership management, on the
// pilot's own goroutine: it does not block.
func (g *gossip) leaderChanged(isLeader bool) { g.pilot.setLeader(isLeader) }

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

// ErrGossipKeyKept says that a gossip key change needs a restart: gossip
// that started unencrypted cannot be encrypted while it runs, nor the other
// way round. Gossip goes on as it was.
var ErrGossipKeyKept = errors.New("gossip goes on with the encryption it started with")

// UseGossipKey makes key the one gossip is encrypted with and accept the
// further keys it reads (members that have not switched to key yet are
// understood as long as their key is among them); keys named by neither
// are no longer read. A change between encrypted and unencrypted gossip is
// ErrGossipKeyKept. A node without gossip ignores it.
func (n *Node) UseGossipKey(key []byte, accept ...[]byte) error {
	if n.gossip == nil {
		return nil
	}
	kr := n.gossip.keyring
	switch {
	case kr == nil && len(key) == 0:
		return nil
	case kr == nil:
		return fmt.Errorf("%w: gossip started unencrypted; restart the server to encrypt it with the new key", ErrGossipKeyKept)
	case len(key) == 0:
		return fmt.Errorf("%w: the new bundle carries no gossip key, so gossip keeps its key; restart the server to run it unencrypted", ErrGossipKeyKept)
	}
	keep := append([][]byte{key}, accept...)
	for _, k := range keep {
		if err := kr.AddKey(k); err != nil {
			return fmt.Errorf("cluster: gossip key: %w", err)
		}
	}
	if err := kr.UseKey(key); err != nil {
		return fmt.Errorf("cluster: gossip key: %w", err)
	}
	// Keys the bundle no longer names are no longer read.
	for _, k := range kr.GetKeys() {
		if !slices.ContainsFunc(keep, func(want []byte) bool { return bytes.Equal(want, k) }) {
			if err := kr.RemoveKey(k); err != nil {
				return fmt.Errorf("cluster: gossip key: %w", err)
			}
		}
	}
	return nil
}
