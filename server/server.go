// Package server assembles one raftlockd node from its parts: the Raft node
// and its state machine (cluster, fsm), the key service and its waiting
// acquirers (rm), the coordinator (tc), the leader-only sweeper and the HTTP
// API. It holds no logic of its own beyond start-up order and shutdown, so
// the binary and the tests start exactly the same node.
package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/access"
	"github.com/raftlockd/raftlockd/api"
	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/cluster"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/sweeper"
	"github.com/raftlockd/raftlockd/tc"
)

// Server is a running node.
type Server struct {
	cfg       config.Server
	tls       *auth.Source // nil with mTLS disabled
	log       *slog.Logger
	node      *cluster.Node
	sweeper   *sweeper.Sweeper
	pruner    *sweeper.Pruner
	forgetter *sweeper.Forgetter
	resolver  *tc.Resolver
	http      *http.Server
	listener  net.Listener
	served    chan error
	registry  *prometheus.Registry
	drain     context.CancelCauseFunc // ends every request's context at shutdown
	fresh     freshConns              // API connections without a request yet
	done      chan struct{}           // closed once Close has finished
	dropped   chan struct{}           // closed once dropStaleWaits has returned
	orphans   chan struct{}           // closed once rm.WithdrawOrphans has returned

	closeOnce sync.Once
	closeErr  error
}

// NodeID returns the node id of the data directory: the one kept there, or
// the configured one, or a new one, kept there from then on. A configured id
// that differs from the kept one is refused once the directory holds a Raft
// log (Raft knows the node by the kept one).
func NodeID(cfg config.Server) (string, error) {
	path := filepath.Join(cfg.DataDir, "node-id")
	stored := storedNodeID(cfg.DataDir)
	id := cfg.NodeID
	switch {
	case id == "" && stored != "", id != "" && id == stored:
		return stored, nil
	case id == "":
		id = "node-" + xid.New().String()
	case stored != "" && cluster.HasLog(cfg.DataDir):
		// Raft knows this server by its old id: under another it would
		// never be a voter of its cluster.
		return "", fmt.Errorf("server: the data directory %s belongs to node %q, not %q: start it with --node-id %s, or give %s an empty data directory",
			cfg.DataDir, stored, id, stored, id)
	}
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("server: keep node id: %w", err)
	}
	return id, nil
}

// storedNodeID is the node id kept in dataDir, "" when there is none.
func storedNodeID(dataDir string) string {
	raw, err := os.ReadFile(filepath.Join(dataDir, "node-id"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(raw))
}

// boundNodeID is NodeID for a server whose bundle is src (nil without
// mTLS): a certificate bound to a node id (auth new server --node-id) gives
// the id when none is configured or kept, and refuses any other, so that a
// server started with another node's bundle, or under another node's id,
// does not take that node's place.
func boundNodeID(cfg config.Server, src *auth.Source) (string, error) {
	bound := ""
	if src != nil {
		bound = src.Node()
	}
	if bound == "" {
		return NodeID(cfg)
	}
	for _, id := range []string{cfg.NodeID, storedNodeID(cfg.DataDir)} {
		if id != "" && id != bound {
			return "", fmt.Errorf("server: the certificate of %s is node %q's, but this server is node %q: "+
				"give it that node's bundle, or a bundle issued for %q (raftlockd auth new server --node-id %s)",
				src.Path(), bound, id, id, id)
		}
	}
	cfg.NodeID = bound
	return NodeID(cfg)
}

// Option adjusts how a node reaches its peers; tests use them to inject
// network faults.
type Option func(*options)

type options struct {
	network    cluster.Network
	peerDial   func(ctx context.Context, network, addr string) (net.Conn, error)
	gossipHook func(*memberlist.Config)
	httpHook   func(*http.Server)
	clock      cluster.Clock
}

// WithNetwork carries Raft and forwarded requests over n.
func WithNetwork(n cluster.Network) Option { return func(o *options) { o.network = n } }

// WithPeerDialer opens the connections to other nodes' and islands' HTTP
// APIs (decisions passed on to the leader, the coordinator's calls to
// other islands) with dial; TLS runs over what it returns.
func WithPeerDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.peerDial = dial }
}

// WithGossipHook adjusts memberlist's configuration after the gossip
// profile was applied (for example to install a transport).
func WithGossipHook(h func(*memberlist.Config)) Option { return func(o *options) { o.gossipHook = h } }

// WithClock runs the node on clock c instead of the wall clock: tests set
// nodes' clocks apart with it.
func WithClock(c cluster.Clock) Option { return func(o *options) { o.clock = c } }

// WithHTTPServer adjusts the API's http.Server (its timeouts and limits)
// before it starts serving.
func WithHTTPServer(h func(*http.Server)) Option { return func(o *options) { o.httpHook = h } }

// Start opens the node's state, joins (or bootstraps) its cluster and starts
// serving HTTP. It returns once the listener is bound.
func Start(cfg config.Server, log *slog.Logger, opts ...Option) (s *Server, err error) {
	o := options{clock: wallClock{}}
	for _, opt := range opts {
		opt(&o)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Peers call the advertised endpoint and compare it with the ones
	// operators name: it is published in the form they use. Other
	// islands' endpoints are held to the form their registry keeps.
	if cfg.APIAdvertise != "" {
		if cfg.APIAdvertise, err = cluster.NormalizeEndpoint(cfg.APIAdvertise); err != nil {
			return nil, fmt.Errorf("api-advertise: %w", err)
		}
	}
	cfg.TCPeers = slices.Clone(cfg.TCPeers)
	for i, p := range cfg.TCPeers {
		if cfg.TCPeers[i], err = cluster.NormalizeEndpoint(p); err != nil {
			return nil, fmt.Errorf("tc-peer: %w", err)
		}
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("server: data dir: %w", err)
	}
	var src *auth.Source
	if cfg.DisableMTLS {
		log.Warn("mTLS is disabled: the HTTP API accepts plain, unauthenticated requests from anyone, " +
			"and Raft, forwarding and gossip run unencrypted; use this for development only")
	} else if src, err = openBundle(cfg, log); err != nil {
		return nil, err
	}
	id, err := boundNodeID(cfg, src)
	if err != nil {
		return nil, err
	}
	if src != nil {
		src.RunAs(id)
	}
	log = log.With("node", id)
	warnExpiry(log, src, time.Now())
	if cfg.TCDisableAuth && !cfg.DisableMTLS {
		log.Warn("TC authentication is disabled: the coordinator and resource-manager endpoints accept requests without a certificate")
	}
	if cfg.TxnRetention <= 2*fsm.TxnClockSkew {
		log.Warn("the decision retention is short: another island's prepare or a decide naming this island's keys "+
			"rolls back a transaction this island has no record of once it is older than the retention less a minute",
			"tc_decision_retention", cfg.TxnRetention)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if src != nil {
		reg.MustRegister(certExpiry(src))
	}

	waits := rm.NewWaits()
	// The sweeper proposes through the node, and the node's state machine
	// tells the sweeper about new deadlines; the late binding breaks the cycle.
	var node *cluster.Node
	sweepProposer := proposerFunc(func(ctx context.Context, c *fsm.Command) (*fsm.Result, error) { return node.Propose(ctx, c) })
	schedule := scheduleFunc(func(r int64) (int64, bool) { return node.FSM().NextDeadline(r) })
	// Deadlines are judged with the clock commands are stamped with.
	leaderClock := clockFunc(func() time.Time { return node.Now() })
	sw := sweeper.New(sweepProposer, schedule, leaderClock, sweeper.Config{TxnRetention: cfg.TxnRetention,
		Formats: lateFormats{node: &node}, Logger: log})
	// The coordinator reaches other islands over their HTTP APIs; its
	// resolver finishes decisions on the leader.
	island := lateIsland{node: &node}
	var checker *auth.Checker
	if src != nil {
		checker = auth.NewChecker(src, lateLists{node: &node})
	}
	peers := peerHTTP(checker, o.peerDial)
	coord := tc.New(island, island, &tc.HTTPRemote{HTTP: peers}, leaderClock, tc.Config{
		FanoutTimeout: cfg.TCFanoutTimeout, FanoutAttempts: cfg.TCFanoutAttempts, FanoutBaseDelay: cfg.TCFanoutBaseDelay,
		FanoutMaxDelay: cfg.TCFanoutMaxDelay, FanoutMultiplier: cfg.TCFanoutMultiplier, PendingTTL: cfg.TCPendingTTL,
		Peers: cfg.TCPeers, Logger: log})
	resolver := tc.NewResolver(coord, 0, 0)

	// The HTTP listener is bound first: its address goes into the gossip
	// metadata peers use to send clients here.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("server: listen %s: %w", cfg.Listen, err)
	}
	if src != nil {
		ln = tls.NewListener(plainHTTPGuard{ln}, src.APIConfig())
	}
	defer func() {
		if err != nil {
			ln.Close()
		}
	}()
	node, err = cluster.Open(cluster.Config{
		NodeID: id, DataDir: cfg.DataDir, RaftBind: cfg.RaftListen, RaftAdvertise: cfg.RaftAdvertise,
		Gossip: &cluster.GossipConfig{Bind: cfg.GossipListen, Advertise: cfg.GossipAdvertise, Join: cfg.Join,
			BootstrapExpect: cfg.BootstrapExpect, ClusterName: cfg.ClusterName, APIEndpoint: cfg.APIEndpoint(ln.Addr().String()),
			SecretKey: gossipKey(src), AcceptKeys: gossipAccept(src),
			DeadServerTimeout: cfg.DeadServerTimeout, MinQuorum: cfg.MinQuorum, Tune: gossipTune(cfg.GossipProfile, o.gossipHook)},
		Network: o.network, TLS: peerTLS(src),
		HeartbeatTimeout: cfg.HeartbeatTimeout, ElectionTimeout: cfg.ElectionTimeout, LeaderWait: cfg.LeaderWait,
		SnapshotThreshold: cfg.SnapshotThreshold, SnapshotInterval: cfg.SnapshotInterval, TrailingLogs: cfg.TrailingLogs,
		FSM: fsm.Options{Observers: []fsm.Observer{waits, sw, resolver}}, Grants: waits,
		Clock: o.clock, Logger: log, Registerer: reg,
	})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			sw.Stop()
			resolver.Stop()
			_ = node.Close()
		}
	}()
	node.OnLeadership(sw.SetLeader)
	node.OnLeadership(resolver.SetLeader)

	self := rm.Server{ID: id, Run: xid.New().String()}
	keys := rm.NewKeys(node, waits, node, rm.Limits{DefaultTTL: cfg.DefaultTTL, MaxTTL: cfg.MaxTTL,
		MaxBlock: cfg.AcquireBlock, MaxStateBytes: cfg.MaxStateBytes}, self)
	queues := rm.NewQueues(node, waits, node, rm.QueueLimits{DefaultVisibility: cfg.QueueVisibility,
		DefaultMaxAttempts: cfg.QueueMaxAttempts, MaxPayloadBytes: cfg.MaxPayloadBytes, MaxWait: cfg.AcquireBlock,
		StagedTxnTTL: cfg.TCPendingTTL}, self, coord)
	utxos := rm.NewUTXOs(node, node, rm.UTXOLimits{BatchSize: cfg.UTXOBatchSize, MaxEntryBytes: cfg.MaxEntryBytes,
		DefaultTxnTTL: cfg.DefaultTTL, MaxTxnTTL: cfg.MaxTTL})
	chain := rm.NewChain(node, node, rm.ChainLimits{MaxEntryBytes: cfg.MaxEntryBytes, Retention: cfg.UTXORetentionBlocks,
		Window: cfg.UTXORollbackWindow, PruneBatch: cfg.UTXOPruneBatch})
	chain.Observe(newChainMetrics(reg).observe)
	chain.Leads(node.IsLeader)
	pruner := sweeper.NewPruner(chain, pruneDue{node, chain}, cfg.UTXOPruneInterval, log)
	node.OnLeadership(pruner.SetLeader)
	forgetter := sweeper.NewForgetter(sweepProposer, forgettableKeys{node}, node, sweeper.ForgetConfig{Logger: log})
	node.OnLeadership(forgetter.SetLeader)
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "raftlockd_keys_forgotten_total",
		Help: "Key records this node forgot as leader because they held nothing but their fencing counters."},
		func() float64 { return float64(forgetter.Forgotten()) }))
	reg.MustRegister(newStateCollector(node, waits), newUTXOCollector(node))
	var authn api.Authenticator
	if checker != nil {
		authn = checker
	}
	handler := api.New(api.Options{Auth: authn, NodeID: id, Leases: keys, Releaser: coord, Ready: readiness{node},
		Leadership: node, Cluster: node, Backups: node, TC: node, Coordinator: coord,
		RM: rm.NewEnlisted(node, node, leaderClock, cfg.TCPendingTTL), LeaderOf: node, PeerHTTP: peers, Queues: queues,
		UTXOs: utxos, Chain: chain, MaxUTXOBodyBytes: cfg.MaxUTXORequestBytes, MaxTTL: cfg.MaxTTL, Clock: leaderClock,
		Access: access.New(node, node.FSM()), TCAuthDisabled: cfg.TCDisableAuth,
		Gatherer: reg, Registerer: reg, Logger: log, Pprof: cfg.Pprof})

	base, drain := context.WithCancelCause(context.Background())
	s = &Server{cfg: cfg, log: log, node: node, tls: src, sweeper: sw, pruner: pruner, forgetter: forgetter, resolver: resolver, listener: ln, served: make(chan error, 1), registry: reg,
		drain: drain, done: make(chan struct{}), dropped: make(chan struct{}), orphans: make(chan struct{}),
		http: &http.Server{
			Handler:           handler,
			BaseContext:       func(net.Listener) context.Context { return rm.WithServerLife(base, base) },
			ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout:       60 * time.Second,
			WriteTimeout:      cfg.AcquireBlock + 60*time.Second,
			IdleTimeout:       2 * time.Minute,
			MaxHeaderBytes:    64 << 10,
			ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		}}
	s.http.ConnState = s.fresh.track
	// A node that left its cluster (asked over HTTP or by another member)
	// has nothing left to serve.
	node.OnLeft(s.shutDownAfterLeaving)
	if o.httpHook != nil {
		o.httpHook(s.http)
	}
	go s.dropStaleWaits(base, self)
	go func() {
		defer close(s.orphans)
		rm.WithdrawOrphans(base, node, waits, self, log)
	}()
	go func() { s.served <- s.http.Serve(ln) }()
	log.Info("raftlockd serving", "api", s.URL(), "raft", node.RaftAddr(), "data_dir", cfg.DataDir)
	return s, nil
}

// stateCollector reports lease gauges, reading the state once per scrape.
type stateCollector struct {
	node                *cluster.Node
	waits               *rm.Waits
	held, queued, local *prometheus.Desc
}

func newStateCollector(n *cluster.Node, w *rm.Waits) *stateCollector {
	return &stateCollector{node: n, waits: w,
		held:   prometheus.NewDesc("raftlockd_leases_held", "Leases currently held (replicated state).", nil, nil),
		queued: prometheus.NewDesc("raftlockd_lease_waiters", "Acquirers queued for a lease (replicated state).", nil, nil),
		local:  prometheus.NewDesc("raftlockd_lease_waiters_local", "Acquire requests waiting on this node.", nil, nil),
	}
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.held
	ch <- c.queued
	ch <- c.local
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	var leases, waiters int
	// A state that cannot be read (closed, or failing) leaves its metrics
	// out of the scrape rather than reporting zeros.
	if c.node.FSM().View(func(v *fsm.View) error {
		leases, waiters = v.Counts()
		return nil
	}) == nil {
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(leases))
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(waiters))
	}
	ch <- prometheus.MustNewConstMetric(c.local, prometheus.GaugeValue, float64(c.waits.Len()))
}

// gossipTune returns memberlist timing adjustments for a profile, followed
// by hook.
func gossipTune(profile string, hook func(*memberlist.Config)) func(*memberlist.Config) {
	return func(c *memberlist.Config) {
		if profile == "fast" {
			fastGossip(c)
		}
		if hook != nil {
			hook(c)
		}
	}
}

// fastGossip detects failures within about a second on a loopback or
// otherwise fast network.
func fastGossip(c *memberlist.Config) {
	c.ProbeInterval = 200 * time.Millisecond
	c.ProbeTimeout = 100 * time.Millisecond
	c.GossipInterval = 50 * time.Millisecond
	c.SuspicionMult = 2
	c.PushPullInterval = 5 * time.Second
	c.TCPTimeout = time.Second
	c.GossipToTheDeadTime = 5 * time.Second
}

type proposerFunc func(ctx context.Context, c *fsm.Command) (*fsm.Result, error)

func (f proposerFunc) Propose(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
	return f(ctx, c)
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// pruneDue asks the node's state whether a prune pass has work, or has to
// record this server's retention and rollback window.
type pruneDue struct {
	node  *cluster.Node
	chain *rm.Chain
}

// forgettableKeys lists, from the node's state, the key records that hold
// nothing but their fencing counters.
type forgettableKeys struct{ node *cluster.Node }

func (k forgettableKeys) ForgettableKeys(after []byte, limit, scan int) (keys []fsm.KeyName, next []byte, err error) {
	err = k.node.FSM().View(func(v *fsm.View) error { keys, next = v.ForgettableKeys(after, limit, scan); return nil })
	return keys, next, err
}

func (p pruneDue) PruneDue() (due bool, mark string) {
	_ = p.node.FSM().View(func(v *fsm.View) error {
		due, mark = v.UTXOPruneDue() || p.chain.PolicyStale(v), v.UTXOChainMark()
		return nil
	})
	return due, mark
}

type scheduleFunc func(retention int64) (int64, bool)

func (f scheduleFunc) NextDeadline(r int64) (int64, bool) { return f(r) }

// lateFormats is the node as the sweeper sees it when it decides whether
// the island adopts this build's rules.
type lateFormats struct{ node **cluster.Node }

func (l lateFormats) Rules() int               { return (*l.node).FSM().Rules() }
func (l lateFormats) EveryServerApplies() bool { return (*l.node).EveryServerApplies() }

// lateIsland is the node as the coordinator sees it; the node is opened
// after the coordinator is built (its state machine reports to the
// coordinator's resolver), and used only once it runs.
type lateIsland struct{ node **cluster.Node }

func (l lateIsland) Propose(ctx context.Context, c *fsm.Command) (*fsm.Result, error) {
	return (*l.node).Propose(ctx, c)
}

func (l lateIsland) Read(ctx context.Context, fn func(v *fsm.View) error) error {
	return (*l.node).Read(ctx, fn)
}

func (l lateIsland) BackendHash() string { return (*l.node).BackendHash() }
func (l lateIsland) IsLeader() bool      { return (*l.node).IsLeader() }
func (l lateIsland) LeaderEndpoint() string {
	_, ep := (*l.node).Leader()
	return ep
}
func (l lateIsland) Term() uint64 { return (*l.node).Term() }
func (l lateIsland) Endpoints() ([]string, time.Time, error) {
	return (*l.node).Endpoints()
}

// peerHTTP is the client a node uses to reach other nodes' and islands'
// APIs: with mTLS it presents the node's server certificate and accepts
// servers of the island's CA and of the CAs on its trust list, and it
// never calls a peer over plain http, where no certificate is checked.
func peerHTTP(c *auth.Checker, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	t := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second, DialContext: dial}
	if c != nil {
		t.DialTLSContext = c.DialPeerOver(dial)
		t.DialContext = func(_ context.Context, _, addr string) (net.Conn, error) {
			return nil, fmt.Errorf("%w: http://%s", errPlainPeer, addr)
		}
	}
	return &http.Client{Transport: t}
}

// errPlainPeer refuses an http:// peer endpoint on a node that uses mTLS.
var errPlainPeer = errors.New("server: this node uses mTLS and calls no peer over plain http")

// lateLists are the access lists of the node's state, which is opened
// after the peer client that checks against them is built.
type lateLists struct{ node **cluster.Node }

func (l lateLists) AuthGeneration() uint64 {
	if *l.node == nil {
		return 0
	}
	return (*l.node).FSM().AuthGeneration()
}

func (l lateLists) AccessLists() ([]string, [][]byte, error) {
	if *l.node == nil {
		return nil, nil, nil
	}
	return access.New(*l.node, (*l.node).FSM()).AccessLists()
}

type readiness struct{ node *cluster.Node }

func (r readiness) Ready(ctx context.Context) error {
	if !r.node.HasLeader() {
		e := errcode.NotReady.With("no leader")
		e.RetryAfter = 1
		return e
	}
	if applied, commit, behind := r.node.Behind(); behind {
		e := errcode.NotReady.With("catching up: applied entry %d of the leader's %d", applied, commit)
		if commit == 0 {
			e = errcode.NotReady.With("catching up: no entries from the leader yet")
		}
		e.RetryAfter = 1
		return e
	}
	return nil
}

// Addr returns the HTTP address the node listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// URL returns the base URL of the HTTP API.
func (s *Server) URL() string { return s.cfg.Scheme() + "://" + s.Addr() }

// Reload reads the node's bundle again (after its files were replaced):
// new connections present the new certificate and are checked against
// the new CA, and gossip switches to the bundle's gossip key. Connections
// already open keep the certificate they were made with.
func (s *Server) Reload() error {
	if s.tls == nil {
		return nil
	}
	if err := s.tls.Reload(); err != nil {
		return fmt.Errorf("server: reload %s: %w", s.tls.Path(), err)
	}
	if err := s.node.UseGossipKey(gossipKey(s.tls), gossipAccept(s.tls)...); errors.Is(err, cluster.ErrGossipKeyKept) {
		s.log.Warn("the reloaded bundle's gossip key is not used", "bundle", s.tls.Path(), "reason", err)
	} else if err != nil {
		return err
	}
	s.log.Info("reloaded TLS bundle", "bundle", s.tls.Path(), "serial", auth.SerialOf(s.tls.Bundle().Cert),
		"not_after", s.tls.Bundle().Cert.NotAfter)
	warnExpiry(s.log, s.tls, time.Now())
	return nil
}

// Node returns the Raft node (for tests and operator commands).
func (s *Server) Node() *cluster.Node { return s.node }

// Registry returns the node's metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.registry }

// Close stops accepting requests, lets in-flight ones finish for
// drainGrace (and no longer than ctx), ends those that still wait, then
// stops the sweeper and the Raft node and flushes the state file.
// Later calls return the first call's result.
func (s *Server) Close(ctx context.Context) error {
	s.closeOnce.Do(func() {
		s.closeErr = s.close(ctx)
		close(s.done)
	})
	return s.closeErr
}

// Done is closed once the server has shut down: after Close, or by itself
// after it left its cluster (POST /v1/cluster/leave, or another member
// asked it to leave).
func (s *Server) Done() <-chan struct{} { return s.done }

// shutDownAfterLeaving closes the server in the background: the request
// that made it leave is answered first (Close waits for it).
func (s *Server) shutDownAfterLeaving() {
	s.log.Info("left the cluster; shutting down")
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			s.log.Warn("shutdown after leaving", "error", err)
		}
	}()
}

// freshConns tracks the API connections on which no request has begun.
// http.Server.Shutdown waits for such a connection as for one serving a
// request, for up to five seconds; a client's transport often holds one
// (dialed for a request that then went out on another connection). At
// shutdown they are closed at once, as if they had arrived after it. (The
// API speaks HTTP/1.1, where a connection's first request moves it on from
// StateNew.)
type freshConns struct {
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
}

// track is the http.Server's ConnState hook.
func (f *freshConns) track(c net.Conn, st http.ConnState) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if st != http.StateNew {
		delete(f.conns, c)
		return
	}
	if f.closed {
		c.Close()
		return
	}
	if f.conns == nil {
		f.conns = map[net.Conn]struct{}{}
	}
	f.conns[c] = struct{}{}
}

// closeAll closes the connections without a request, and any that arrive
// from now on.
func (f *freshConns) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	clear(f.conns)
}

// drainGrace is how long shutdown lets the requests in flight finish before
// it ends them: a write being applied gets its answer (an answer cut short
// would leave its client not knowing whether it took effect), while
// requests that wait (blocked acquires, dequeue waits, subscriptions) are
// then told to retry elsewhere.
const drainGrace = 500 * time.Millisecond

func (s *Server) close(ctx context.Context) error {
	s.fresh.closeAll()
	shut := make(chan error, 1)
	go func() { shut <- s.http.Shutdown(ctx) }()
	grace := time.NewTimer(drainGrace)
	var err error
	select {
	case err = <-shut:
		grace.Stop()
	case <-grace.C:
		e := errcode.ShuttingDown.With("node is shutting down")
		e.RetryAfter = 1
		s.drain(e)
		err = <-shut
	}
	s.drain(errcode.ShuttingDown.With("node is shutting down")) // the server's own context
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		err = s.http.Close()
	}
	if serr := <-s.served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if nerr := s.stopNode(); nerr != nil && err == nil {
		err = nerr
	}
	return err
}

// dropStaleWaits withdraws the requests that a crash of this server's
// previous run left waiting in the replicated state (fsm.DropWaitsCmd), so
// that no key or message is granted to a client that is gone. It proposes
// once every server of the cluster applies the command (an older build
// would not), and tries again every second until it is applied or ctx,
// the server's life, ends.
func (s *Server) dropStaleWaits(ctx context.Context, self rm.Server) {
	defer close(s.dropped)
	cmd := &fsm.Command{Op: fsm.OpDropWaits, DropWaits: &fsm.DropWaitsCmd{Node: self.ID, Run: self.Run}}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.node.EveryServerApplies() {
			pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			res, err := s.node.Propose(pctx, cmd)
			cancel()
			if err == nil {
				if res.Cancelled {
					s.log.Info("withdrew the requests this server's previous run left waiting")
				}
				return
			}
		}
		t.Reset(time.Second)
	}
}

// stopNode stops the leader-only loops, then the node itself. The
// server's context has ended (drain), which ends dropStaleWaits and rm.WithdrawOrphans.
func (s *Server) stopNode() error {
	<-s.dropped
	<-s.orphans
	s.sweeper.Stop()
	s.pruner.Stop()
	s.forgetter.Stop()
	s.resolver.Stop()
	return s.node.Close()
}
