// Package cluster owns this node's membership in its Raft group: the
// hashicorp/raft instance with its durable log (raft-boltdb/v2), its snapshot
// store and TCP transport, bootstrap of a new cluster, leadership
// notifications, and the two doors other packages use to reach the
// replicated state: Propose (a write, stamped with the leader's clock) and
// Read (a linearizable view). Nothing outside this package touches raft.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/fsm"
)

// Clock is this node's own clock. Commands are stamped with it as
// corrected to the members' median (clocksync.go).
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Config describes one node.
type Config struct {
	NodeID        string
	DataDir       string
	RaftBind      string // host:port to listen on for Raft traffic
	RaftAdvertise string // host:port peers dial; defaults to RaftBind
	// Bootstrap makes a node with no Raft state start a one-voter cluster.
	Bootstrap bool

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	// LeaderWait bounds how long a request waits for a leader to appear.
	LeaderWait time.Duration

	FSM fsm.Options
	// Grants receives the grants the leader pushes for acquirers waiting
	// on this server (the same observer that waits for the local state
	// machine's events).
	Grants     fsm.Observer
	Clock      Clock
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Network carries Raft and forwarded requests; default TCP.
	Network Network
	// TLS, when set, runs every internal connection over mutual TLS.
	TLS PeerTLS
	// Gossip, when set, discovers peers, bootstraps new clusters and lets
	// the leader manage the voter set.
	Gossip *GossipConfig
}

func (c *Config) defaults() {
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = 500 * time.Millisecond
	}
	if c.ElectionTimeout == 0 {
		c.ElectionTimeout = 500 * time.Millisecond
	}
	if c.LeaderLeaseTimeout == 0 {
		c.LeaderLeaseTimeout = c.HeartbeatTimeout / 2
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = 16384
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 30 * time.Second
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = 10240
	}
	if c.LeaderWait == 0 {
		c.LeaderWait = 5 * time.Second
	}
	if c.RaftAdvertise == "" {
		c.RaftAdvertise = c.RaftBind
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Network == nil {
		c.Network = TCP{}
	}
	if c.TLS != nil {
		c.Network = tlsNetwork{inner: c.Network, tls: c.TLS}
	}
}

// Directory maps node ids to the API endpoints clients should use; the
// gossip layer provides it.
type Directory interface {
	APIEndpoint(id string) string
}

// Node is one member of the Raft group.
type Node struct {
	cfg       Config
	raft      *raft.Raft
	fsm       *fsm.FSM
	store     *raftboltdb.BoltStore
	snaps     raft.SnapshotStore
	transport *raftTransport
	mux       *mux
	peers     *peers
	gossip    *gossip
	metrics   *nodeMetrics
	packer    *packer
	packOK    atomic.Bool // every server applies this build's entries (gossip.notePacking)
	dir       atomic.Pointer[Directory]

	leader    atomic.Bool
	readyTerm atomic.Uint64 // term whose first no-op is applied: reads are safe in it
	stamps    stampClock
	clocks    *clockSync // the members' median clock, which stamps commands
	started   time.Time  // when Open began: of two servers running under one id, the later one stops
	watchMu   sync.Mutex // guards watchers, onLeft and leaderCh; never held while calling out
	watchers  []func(isLeader bool)
	// callMu orders leadership deliveries: it is held while watchers are
	// called, and only OnLeadership and watchLeadership take it, so a slow
	// watcher never holds up a request waiting for a leader.
	callMu    sync.Mutex
	onLeft    []func()       // called after this node left the cluster
	restoreMu sync.RWMutex   // held by a restore; proposals take it shared to enqueue
	closing   atomic.Bool    // set (under restoreMu) before raft shuts down: nothing more is enqueued
	calls     sync.WaitGroup // requests to raft (see await) whose futures have not answered yet
	leaderCh  chan struct{}  // closed and replaced whenever leadership changes anywhere
	notify    chan bool
	observeCh chan raft.Observation
	observer  *raft.Observer
	done      chan struct{}
	wg        sync.WaitGroup
	life      context.Context // ends when Close begins waiting for the node's goroutines
	endLife   context.CancelFunc
	spawnMu   sync.Mutex
	spawnEnd  bool // set by Close: spawn starts nothing more
	closeOnce sync.Once
	closeErr  error
}

// Open starts the node: it opens the state file, the Raft log and snapshot
// store, binds the transport, bootstraps a new single-voter cluster when
// asked to and none exists, and starts Raft.
func Open(cfg Config) (_ *Node, err error) {
	cfg.defaults()
	if cfg.NodeID == "" {
		return nil, errors.New("cluster: node id required")
	}
	raftDir := raftDirOf(cfg.DataDir)
	if err := os.MkdirAll(raftDir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	// n is not the result: the closers below use it after a failed Open
	// has answered nil.
	n := &Node{cfg: cfg, started: time.Now(), leaderCh: make(chan struct{}), notify: make(chan bool, 8),
		observeCh: make(chan raft.Observation, 64), done: make(chan struct{})}
	n.life, n.endLife = context.WithCancel(context.Background())
	closers := []io.Closer{closerFunc(func() error { n.endLife(); return nil })}
	defer func() {
		if err != nil {
			for i := len(closers) - 1; i >= 0; i-- {
				_ = closers[i].Close()
			}
		}
	}()
	n.clocks = newClockSync(cfg.Clock, cfg.Logger.With("component", "clock"))
	n.metrics = newNodeMetrics(cfg.Registerer, n)
	n.packer = &packer{maxSize: maxPackedBytes, packs: n.packOK.Load,
		sent: func(commands int) { n.metrics.entryCommands.Observe(float64(commands)) },
		send: func(data []byte, timeout time.Duration) (raft.Future, error) {
			return n.await(func() raft.Future { return n.raft.Apply(data, timeout) })
		}}
	cfg.FSM.Logger = cfg.Logger
	grants := newGrantPusher(n)
	cfg.FSM.Observers = append(slices.Clip(cfg.FSM.Observers), grants)
	n.fsm, err = fsm.Open(filepath.Join(cfg.DataDir, "state.db"), cfg.FSM)
	if err != nil {
		return nil, err
	}
	closers = append(closers, n.fsm)
	// A restore cut short by a crash left its upload behind (the state
	// file, now open, keeps a second node off this directory).
	if leftover, _ := filepath.Glob(filepath.Join(cfg.DataDir, uploadPattern)); len(leftover) > 0 {
		for _, p := range leftover {
			_ = os.Remove(p)
		}
		cfg.Logger.Warn("removed the uploads of restores cut short", "files", len(leftover))
	}
	if err := n.resync(raftDir); err != nil {
		return nil, err
	}
	// The freelist is rebuilt on open instead of being rewritten (and
	// synced) on every append.
	if err := fsm.CheckFileLength(raftLogIn(raftDir)); err != nil {
		return nil, fmt.Errorf("cluster: Raft log %w; restore the data directory from a copy, or, when other "+
			"servers of the cluster hold the log, empty it (keeping node-id and tls) to catch up from them", err)
	}
	n.store, err = raftboltdb.New(raftboltdb.Options{Path: raftLogIn(raftDir),
		BoltOptions: &bolt.Options{Timeout: time.Second, NoFreelistSync: true, FreelistType: bolt.FreelistMapType}})
	if err != nil {
		return nil, fmt.Errorf("cluster: open raft log: %w", err)
	}
	closers = append(closers, n.store)
	hl := hclog.New(&hclog.LoggerOptions{Name: "raft", Level: raftLogLevel(cfg.Logger), JSONFormat: true,
		Output: &hclogToSlog{log: cfg.Logger.With("component", "raft")}})
	// A snapshot cut short by a crash left raft's temporary directory,
	// which raft only warns about, on every listing, for good.
	if err := removeSnapshotsCutShort(raftDir, cfg.Logger); err != nil {
		return nil, err
	}
	snaps, err := raft.NewFileSnapshotStoreWithLogger(raftDir, 2, hl)
	if err != nil {
		return nil, fmt.Errorf("cluster: snapshot store: %w", err)
	}
	n.snaps = snaps
	ln, err := cfg.Network.Listen(cfg.RaftBind)
	if err != nil {
		return nil, fmt.Errorf("cluster: listen %s: %w", cfg.RaftBind, err)
	}
	advertise, err := advertiseAddr(cfg.RaftAdvertise, ln.Addr())
	if err != nil {
		ln.Close()
		return nil, err
	}
	rpcServer := rpc.NewServer()
	if err := rpcServer.RegisterName("Cluster", &rpcService{n: n}); err != nil {
		ln.Close()
		return nil, fmt.Errorf("cluster: %w", err)
	}
	// The cluster port accepts connections from here on, but the RPC
	// handlers use raft (and gossip): they wait until Open has finished
	// (a peer's leader polls a restarting node's status every second).
	opened := make(chan struct{})
	defer close(opened) // runs before the closers above when Open fails
	n.mux = newMux(ln, func(c net.Conn) {
		<-opened
		if n.raft == nil {
			c.Close() // Open failed
			return
		}
		rpcServer.ServeConn(c)
	}, cfg.NodeID, n.fsm.BackendHash, cfg.TLS, cfg.Logger)
	closers = append(closers, closerFunc(func() error { n.mux.close(); return nil }))
	n.peers = &peers{network: cfg.Network, clients: map[string]*rpc.Client{}}
	closers = append(closers, closerFunc(func() error { n.peers.close(); return nil }))
	has, err := raft.HasExistingState(n.store, n.store, snaps)
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if !has && !cfg.Bootstrap {
		if err := markJoining(raftDir, n.store); err != nil {
			return nil, err
		}
	}
	joining, err := joiningMarked(raftDir, n.store, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if joining {
		cfg.Logger.Info("joining: this server takes no part in elections until it has caught up")
	}
	addrs := &raftAddresses{}
	n.transport = newRaftTransport(raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream:                &streamLayer{m: n.mux, network: cfg.Network, advertise: advertise, older: addrs.olderBuild},
		ServerAddressProvider: addrs, MaxPool: 3, Timeout: 10 * time.Second, Logger: hl}), joining)
	closers = append(closers, n.transport)

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = hl
	rc.NotifyCh = n.notify
	// BatchApplyCh stays off: raft never answers an entry still queued in a
	// buffered apply channel when it shuts down, so its proposer would wait
	// forever. Unbuffered, every entry raft takes while it runs is answered
	// (applied, or failed on leadership loss), Close lets raft answer them
	// before shutting it down (drainCalls), and the leader loop still takes
	// all waiting entries as one batch.
	rc.MaxAppendEntries = 256
	// A leader that commits its own removal steps down rather than shutting
	// raft down under the requests it is serving: raft would never answer
	// those whose entries it had committed alongside the removal. The node
	// stays up, outside the configuration, until it is closed.
	rc.ShutdownOnRemove = false
	// Followers learn that an entry committed from the leader's next
	// AppendEntries; when no new entry follows, that is CommitTimeout
	// later. A follower's linearizable reads and the grants to acquirers
	// parked on it wait for that, so it is kept short (raft's default is
	// 50ms); an idle follower costs a few small RPCs per 10ms.
	rc.CommitTimeout = 5 * time.Millisecond
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	if err := n.checkTrust(snaps); err != nil {
		return nil, err
	}
	// The state file keeps its own applied index; when it survived, raft
	// must not overwrite it with an older snapshot on start.
	rc.NoSnapshotRestoreOnStart = n.fsm.Trusted()
	if err := n.checkReplay(snaps, raftDir, rc.NoSnapshotRestoreOnStart); err != nil {
		return nil, err
	}
	n.stamps.clock, n.stamps.offset, n.stamps.stepGrace = n.clocks, n.clocks.Offset, clockStepGrace
	if err := raft.ValidateConfig(rc); err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	if cfg.Bootstrap && !has {
		conf := raft.Configuration{Servers: []raft.Server{{Suffrage: raft.Voter, ID: rc.LocalID, Address: n.transport.LocalAddr()}}}
		if err := raft.BootstrapCluster(rc, n.store, n.store, snaps, n.transport, conf); err != nil {
			return nil, fmt.Errorf("cluster: bootstrap: %w", err)
		}
		cfg.Logger.Info("bootstrapped a new cluster", "raft", n.transport.LocalAddr())
	}
	logs, err := raft.NewLogCache(1024, &timedLogStore{LogStore: n.store, m: n.metrics, applied: n.fsm.Applied, dropsApplied: n.dropsApplied})
	if err != nil {
		return nil, fmt.Errorf("cluster: %w", err)
	}
	n.raft, err = raft.NewRaft(rc, &instrumentedFSM{FSM: n.fsm, m: n.metrics, reached: n.packer.reached}, logs, n.store, snaps, n.transport)
	if err != nil {
		return nil, fmt.Errorf("cluster: start raft: %w", err)
	}
	n.observer = raft.NewObserver(n.observeCh, false, func(o *raft.Observation) bool {
		_, ok := o.Data.(raft.LeaderObservation)
		return ok
	})
	n.raft.RegisterObserver(n.observer)
	addrs.raft.Store(n.raft)
	n.transport.setWanted(n.replicatesTo)
	n.wg.Add(1)
	go n.watchLeadership()
	n.spawn(grants.run)
	if n.transport.joining.Load() {
		n.spawn(n.watchJoining)
	}
	if cfg.Gossip != nil {
		if n.gossip, err = startGossip(n, *cfg.Gossip); err != nil {
			_ = n.stop()
			return nil, err
		}
		addrs.gossip.Store(n.gossip)
		n.SetDirectory(n.gossip)
		n.OnLeadership(n.gossip.leaderChanged)
	}
	return n, nil
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// SetDirectory installs the map from node ids to API endpoints.
func (n *Node) SetDirectory(d Directory) { n.dir.Store(&d) }

// APIEndpoint returns the API endpoint of node id, when known.
func (n *Node) APIEndpoint(id string) string {
	if d := n.dir.Load(); d != nil {
		return (*d).APIEndpoint(id)
	}
	return ""
}

// ID returns the node id.
func (n *Node) ID() string { return n.cfg.NodeID }

// RaftAddr returns the address peers reach this node's Raft transport at.
func (n *Node) RaftAddr() string { return string(n.transport.LocalAddr()) }

// IsLeader reports whether this node currently leads.
func (n *Node) IsLeader() bool { return n.leader.Load() }

// FSM exposes the state machine for read-only inspection (tests, metrics).
func (n *Node) FSM() *fsm.FSM { return n.fsm }

// OnLeadership registers fn to be told, in order, every time this node
// gains (true) or loses (false) leadership. fn must not block: the next
// change is delivered after it returns. Requests waiting for a leader do not
// wait for the watchers.
func (n *Node) OnLeadership(fn func(isLeader bool)) {
	n.callMu.Lock()
	defer n.callMu.Unlock()
	n.watchMu.Lock()
	n.watchers = append(n.watchers, fn)
	n.watchMu.Unlock()
	if n.leader.Load() {
		fn(true)
	}
}

// watchLeadership is the single goroutine that drains raft's notifications.
// A new leader starts establishing its term and wakes the requests waiting
// for a leader before it tells the watchers.
func (n *Node) watchLeadership() {
	defer n.wg.Done()
	for {
		select {
		case isLeader := <-n.notify:
			term := n.raft.CurrentTerm()
			n.callMu.Lock()
			changed := n.leader.Swap(isLeader) != isLeader
			if isLeader {
				n.wg.Add(1)
				go n.establish(term)
			}
			n.kickLeaderWaiters()
			if changed {
				n.watchMu.Lock()
				watchers := slices.Clone(n.watchers)
				n.watchMu.Unlock()
				for _, fn := range watchers {
					fn(isLeader)
				}
			}
			n.callMu.Unlock()
			n.metrics.leaderChanges.Inc()
			n.cfg.Logger.Info("leadership changed", "leader", isLeader, "term", term)
		case <-n.observeCh:
			n.kickLeaderWaiters()
		case <-n.done:
			return
		}
	}
}

func (n *Node) kickLeaderWaiters() {
	n.watchMu.Lock()
	close(n.leaderCh)
	n.leaderCh = make(chan struct{})
	n.watchMu.Unlock()
}

// Status summarises one node's view of the cluster.
type Status struct {
	NodeID        string `json:"node_id"`
	RaftAddr      string `json:"raft_addr"`
	State         string `json:"state"`
	Leader        string `json:"leader_id"`
	LeaderAddr    string `json:"leader_raft_addr"`
	Term          uint64 `json:"term"`
	LastIndex     uint64 `json:"last_index"`
	LastLogTerm   uint64 `json:"last_log_term"`
	CommitIndex   uint64 `json:"commit_index"`
	AppliedIndex  uint64 `json:"applied_index"`
	LastContactMs int64  `json:"last_contact_ms"` // since the leader was last heard; 0 on the leader, -1 if never heard
	BackendHash   string `json:"backend_hash,omitempty"`
	Joining       bool   `json:"joining,omitempty"` // catching up after joining: takes no part in elections yet
	// Started is when this server's process opened the node (Unix
	// nanoseconds; 0 from builds that do not report it).
	Started int64 `json:"started_unix_nano,omitempty"`
}

// Status reports this node's Raft state.
func (n *Node) Status() Status {
	addr, id := n.raft.LeaderWithID()
	st := Status{NodeID: n.cfg.NodeID, RaftAddr: n.RaftAddr(), State: n.raft.State().String(), Leader: string(id),
		LeaderAddr: string(addr), Term: n.raft.CurrentTerm(), LastIndex: n.raft.LastIndex(),
		LastLogTerm: parseUint(n.raft.Stats()["last_log_term"]), CommitIndex: n.raft.CommitIndex(),
		AppliedIndex: n.fsm.Applied(), BackendHash: n.fsm.BackendHash(), Joining: n.Joining(), Started: n.started.UnixNano()}
	if !n.IsLeader() {
		st.LastContactMs = -1
		if lc := n.raft.LastContact(); !lc.IsZero() {
			st.LastContactMs = time.Since(lc).Milliseconds()
		}
	}
	return st
}

// HasLeader reports whether the cluster has a known leader.
func (n *Node) HasLeader() bool {
	addr, _ := n.raft.LeaderWithID()
	return addr != ""
}

// readySlack is how many entries a follower may have left to apply of the
// commit index its leader sent and still count as caught up: under load a
// follower always has a few batches on their way to its state machine.
const readySlack = 1024

// Behind tells whether this server, a follower, has more than readySlack
// entries left to apply of the commit index its leader last sent, or has
// had no entries from a leader since it started; applied and commit say
// how far it is. A leader is never behind.
func (n *Node) Behind() (applied, commit uint64, behind bool) {
	applied = n.fsm.Applied()
	if n.IsLeader() {
		return applied, applied, false
	}
	c := n.transport.commit.Load()
	if c == nil {
		return applied, 0, true
	}
	return applied, c.index, applied+readySlack < c.index
}

// replicatesTo tells whether raft, leading in term, still replicates to
// server id: this server leads in that term and id is in the latest
// configuration.
func (n *Node) replicatesTo(id raft.ServerID, term uint64) bool {
	if n.raft.State() != raft.Leader || n.raft.CurrentTerm() != term {
		return false
	}
	f := n.raft.GetConfiguration()
	if f.Error() != nil {
		return false
	}
	for _, s := range f.Configuration().Servers {
		if s.ID == id {
			return true
		}
	}
	return false
}

// Snapshot asks raft to take a snapshot now.
func (n *Node) Snapshot() error { return n.raft.Snapshot().Error() }

// Close stops raft, then closes the transport, the log and the state file.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		if n.gossip != nil {
			n.gossip.close()
		}
		err := n.stop()
		n.peers.close()
		for _, c := range []io.Closer{n.transport, closerFunc(func() error { n.mux.close(); return nil }), n.store, n.fsm} {
			if cerr := c.Close(); cerr != nil && err == nil {
				err = cerr
			}
		}
		n.closeErr = err
	})
	return n.closeErr
}

// stop shuts raft down and waits for the node's goroutines; the transport,
// the RPC connections, the log and the state file stay open.
func (n *Node) stop() error {
	// Enqueue nothing from here on, and let raft answer what it took.
	n.restoreMu.Lock()
	n.closing.Store(true)
	n.restoreMu.Unlock()
	n.drainCalls()
	shut := n.raft.Shutdown()
	// Raft's goroutines may be reading from a peer (a snapshot being
	// installed) that will never send more, or waiting for a peer that
	// does not answer: their connections, and dials, end now.
	// (Raft closes the transport itself once they have stopped; closing it
	// first keeps its listener from reporting the end of the mux as a
	// failure.)
	_ = n.transport.Close()
	n.mux.shut()
	err := shut.Error()
	n.transport.shutHeartbeats()
	n.raft.DeregisterObserver(n.observer)
	close(n.done)
	n.stopSpawning()
	n.wg.Wait()
	return err
}

// drainTimeout bounds how long Close waits for raft to answer the requests
// already made to it. Raft answers each while it runs: a leader commits an
// entry or gives up leading within its lease timeout.
const drainTimeout = 10 * time.Second

// drainCalls waits for the futures of requests made through await. Raft
// never answers an entry waiting in its state machine's queue, nor a
// leadership check still queued, when it shuts down, so whoever waits on
// one would wait forever; Close therefore shuts raft down only once every
// request made to it has its answer (or drainTimeout has passed).
func (n *Node) drainCalls() {
	idle := make(chan struct{})
	go func() {
		n.calls.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-time.After(drainTimeout):
		n.cfg.Logger.Warn("shutting raft down with requests it has not answered", "waited", drainTimeout)
	}
}

// spawn runs fn on a goroutine that Close waits for; fn should end soon
// after n.life does. It reports false, running nothing, once Close has begun
// waiting.
func (n *Node) spawn(fn func()) bool {
	n.spawnMu.Lock()
	defer n.spawnMu.Unlock()
	if n.spawnEnd {
		return false
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		fn()
	}()
	return true
}

// stopSpawning ends n.life and refuses further spawns, before Close waits.
func (n *Node) stopSpawning() {
	n.spawnMu.Lock()
	n.spawnEnd = true
	n.spawnMu.Unlock()
	n.endLife()
}

// raftDirOf is where a node keeps its Raft log and snapshots, in dataDir.
func raftDirOf(dataDir string) string { return filepath.Join(dataDir, "raft") }

// removeSnapshotsCutShort removes the temporary directories of snapshots
// that raft's file snapshot store (raftDir/snapshots) was writing when the
// process ended: a snapshot taken, installed from the leader or restored
// by an operator. Only a running node writes there, and the state file it
// holds open keeps a second one off the data directory.
func removeSnapshotsCutShort(raftDir string, log *slog.Logger) error {
	entries, err := os.ReadDir(filepath.Join(raftDir, "snapshots"))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster: snapshot store: %w", err)
	}
	removed := 0
	for _, e := range entries {
		if !e.IsDir() || !strings.HasSuffix(e.Name(), ".tmp") {
			continue
		}
		if err := os.RemoveAll(filepath.Join(raftDir, "snapshots", e.Name())); err != nil {
			return fmt.Errorf("cluster: remove a snapshot cut short: %w", err)
		}
		removed++
	}
	if removed > 0 {
		log.Warn("removed the snapshots a crash cut short", "snapshots", removed)
	}
	return nil
}

// raftLogIn is the Raft log's file in raftDir.
func raftLogIn(raftDir string) string { return filepath.Join(raftDir, "raft.db") }

// HasLog reports whether a node has kept a Raft log in dataDir.
func HasLog(dataDir string) bool {
	_, err := os.Stat(raftLogIn(raftDirOf(dataDir)))
	return err == nil
}

// EveryServerApplies reports whether every server of the configuration
// announces that it applies this build's entry format (fsm.EntryFormat):
// commands only this build knows may be proposed.
func (n *Node) EveryServerApplies() bool { return n.packOK.Load() }
