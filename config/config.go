// Package config owns the server's settings: their names, defaults and
// validation. Flags and RAFTLOCKD_* environment variables are bound to these
// fields by the command line in cmd/raftlockd; the server only ever sees a
// validated Server value.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode"

	"github.com/raftlockd/raftlockd/wire"
)

// Server is one node's configuration.
type Server struct {
	DataDir       string
	NodeID        string // empty: generated once and kept in the data dir
	Listen        string // HTTP API address
	RaftListen    string
	RaftAdvertise string // empty: RaftListen
	APIAdvertise  string // the API endpoint peers hand to clients; empty: derived from Listen
	// DisableMTLS serves the API over plain HTTP to anyone and runs Raft,
	// forwarding and gossip unencrypted (development only).
	DisableMTLS bool
	// Bundle is the node's server bundle (certificate, key, CA, gossip
	// key); empty: <data-dir>/tls/server.pem, which the single-node
	// default creates with its CA on first start.
	Bundle string
	// TCDisableAuth opens the coordinator and resource-manager endpoints
	// to callers without a certificate; the others still need one.
	TCDisableAuth bool
	Pprof         bool // serve Go's profiler under /debug/pprof/ on the API address

	GossipListen      string
	GossipAdvertise   string
	Join              []string // gossip addresses of existing members
	BootstrapExpect   int      // servers that must meet before a new cluster starts; 0: only join
	ClusterName       string
	DeadServerTimeout time.Duration
	MinQuorum         int // fewest voters dead-server cleanup may leave; 0: a majority of the most voters the island has had alive
	// GossipProfile picks memberlist's timing: "lan" (memberlist's LAN
	// defaults) or "fast" (sub-second failure detection for loopback
	// clusters and tests).
	GossipProfile string

	DefaultTTL    time.Duration
	MaxTTL        time.Duration
	AcquireBlock  time.Duration // longest an acquire may wait for a lease
	MaxStateBytes int64
	TxnRetention  time.Duration // how long final decisions are kept for retries and late replays

	// Queues.
	QueueVisibility  time.Duration // delivery lease when neither message nor dequeue names one
	QueueMaxAttempts int           // failed deliveries before a message moves to the dead-letter queue
	MaxPayloadBytes  int64         // largest message payload

	// UTXO records.
	UTXOBatchSize       int   // outputs per record; a larger transaction is stored as several records
	MaxEntryBytes       int   // largest Raft entry a UTXO command may encode to
	MaxUTXORequestBytes int64 // largest body of a UTXO create or spend request
	// Blocks and pruning.
	UTXORetentionBlocks uint32        // blocks a spent, mined transaction is kept (delete-at-height = height + retention)
	UTXORollbackWindow  uint32        // blocks whose undo deltas are kept (never fewer than the retention)
	UTXOPruneBatch      int           // transactions one prune pass looks at
	UTXOPruneInterval   time.Duration // time between prune passes on the leader

	// Transactions across islands (other raftlockd clusters).
	TCPeers            []string      // API endpoints of other islands to register with
	TCFanoutTimeout    time.Duration // one attempt to reach another island
	TCFanoutAttempts   int           // attempts per island before answering txn_fanout_failed
	TCFanoutBaseDelay  time.Duration // first retry delay
	TCFanoutMaxDelay   time.Duration // longest retry delay
	TCFanoutMultiplier float64       // growth of the retry delay
	TCPendingTTL       time.Duration // how long a pending decision lasts when its request names no expiry

	LeaderWait        time.Duration // how long a request waits for a leader before 503
	HeartbeatTimeout  time.Duration
	ElectionTimeout   time.Duration
	SnapshotThreshold uint64
	TrailingLogs      uint64 // log entries kept after a snapshot for followers that lag a little
	SnapshotInterval  time.Duration

	LogLevel string
}

// DefaultDataDir is where the single-node default keeps its state:
// $XDG_DATA_HOME/raftlockd, else ~/.local/share/raftlockd.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "raftlockd")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "share", "raftlockd")
	}
	return "raftlockd-data"
}

// Default returns the settings of `raftlockd server` with no flags.
func Default() Server {
	return Server{
		DataDir:             DefaultDataDir(),
		Listen:              "127.0.0.1:9341",
		RaftListen:          "127.0.0.1:9342",
		GossipListen:        "127.0.0.1:9343",
		BootstrapExpect:     1,
		ClusterName:         "raftlockd",
		DeadServerTimeout:   time.Minute,
		GossipProfile:       "lan",
		DefaultTTL:          30 * time.Second,
		MaxTTL:              time.Hour,
		AcquireBlock:        60 * time.Second,
		MaxStateBytes:       1 << 20,
		TxnRetention:        10 * time.Minute,
		QueueVisibility:     30 * time.Second,
		QueueMaxAttempts:    5,
		MaxPayloadBytes:     1 << 20,
		UTXOBatchSize:       wire.UTXODefaultBatchSize,
		MaxEntryBytes:       wire.UTXODefaultEntryBytes,
		MaxUTXORequestBytes: 32 << 20,
		UTXORetentionBlocks: 288,
		UTXORollbackWindow:  4320,
		UTXOPruneBatch:      1000,
		UTXOPruneInterval:   time.Second,
		TCFanoutTimeout:     5 * time.Second,
		TCFanoutAttempts:    4,
		TCFanoutBaseDelay:   50 * time.Millisecond,
		TCFanoutMaxDelay:    2 * time.Second,
		TCFanoutMultiplier:  2,
		TCPendingTTL:        30 * time.Second,
		LeaderWait:          5 * time.Second,
		HeartbeatTimeout:    500 * time.Millisecond,
		ElectionTimeout:     500 * time.Millisecond,
		SnapshotThreshold:   16384,
		TrailingLogs:        10240,
		SnapshotInterval:    30 * time.Second,
		LogLevel:            "info",
	}
}

// Scheme is the API's URL scheme: https unless mTLS is disabled.
func (s *Server) Scheme() string {
	if s.DisableMTLS {
		return "http"
	}
	return "https"
}

// TLSDir is where the single-node default keeps its bundles.
func (s *Server) TLSDir() string { return filepath.Join(s.DataDir, "tls") }

// BundlePath is the node's server bundle.
func (s *Server) BundlePath() string {
	if s.Bundle != "" {
		return s.Bundle
	}
	return filepath.Join(s.TLSDir(), "server.pem")
}

// SingleNode reports whether the node starts a cluster of its own (the
// default) rather than joining or forming one with others.
func (s *Server) SingleNode() bool { return s.BootstrapExpect <= 1 && len(s.Join) == 0 }

// APIEndpoint is the endpoint this node publishes for clients.
func (s *Server) APIEndpoint(bound string) string {
	if s.APIAdvertise != "" {
		return s.APIAdvertise
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return s.Scheme() + "://" + bound
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return s.Scheme() + "://" + net.JoinHostPort(host, port)
}

func notPrintable(r rune) bool { return !unicode.IsPrint(r) }

// Validate reports every setting that cannot work, each naming its flag
// and the value it was given.
func (s *Server) Validate() error {
	var errs []error
	// want records, unless ok, that flag cannot be v: it must be what
	// format and args say.
	want := func(ok bool, flag string, v any, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s %v: want %s", flag, v, fmt.Sprintf(format, args...)))
		}
	}
	if s.DataDir == "" {
		errs = append(errs, errors.New("data dir is required"))
	}
	// The id is kept in the data directory as a line of text and read
	// back without the spaces around it: an id with any would not be the
	// same one after a restart.
	want(s.NodeID == "" || strings.TrimSpace(s.NodeID) == s.NodeID && !strings.ContainsFunc(s.NodeID, notPrintable),
		"node-id", fmt.Sprintf("%q", s.NodeID), "printable characters without spaces around them")
	for name, addr := range map[string]string{"listen": s.Listen, "raft-listen": s.RaftListen, "gossip-listen": s.GossipListen} {
		_, port, err := net.SplitHostPort(addr)
		if err == nil {
			_, err = net.LookupPort("tcp", port)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, addr, err))
		}
	}
	// Leases are replicated in milliseconds: a shorter default would be
	// none, and every acquire naming no TTL a malformed command.
	if s.DefaultTTL < time.Millisecond || s.MaxTTL < time.Second || s.DefaultTTL > s.MaxTTL {
		errs = append(errs, fmt.Errorf("need 1ms <= default-ttl (%s) <= max-ttl (%s), max-ttl >= 1s", s.DefaultTTL, s.MaxTTL))
	}
	if s.AcquireBlock < 0 {
		errs = append(errs, errors.New("acquire-block must not be negative"))
	}
	if s.MaxStateBytes <= 0 {
		errs = append(errs, errors.New("max-state-bytes must be positive"))
	}
	want(s.QueueVisibility >= time.Second, "queue-visibility", s.QueueVisibility, "at least 1s")
	want(s.QueueMaxAttempts >= 1, "queue-max-attempts", s.QueueMaxAttempts, "at least 1")
	want(s.MaxPayloadBytes > 0, "max-payload-bytes", s.MaxPayloadBytes, "more than 0")
	want(s.UTXORetentionBlocks >= 1, "utxo-retention-blocks", s.UTXORetentionBlocks, "at least 1")
	want(s.UTXORollbackWindow >= s.UTXORetentionBlocks, "utxo-rollback-window", s.UTXORollbackWindow,
		"at least utxo-retention-blocks (%d)", s.UTXORetentionBlocks)
	want(s.UTXOPruneBatch >= 1 && s.UTXOPruneBatch <= wire.UTXOMaxPruneBatch, "utxo-prune-batch", s.UTXOPruneBatch,
		"1 <= utxo-prune-batch <= %d", wire.UTXOMaxPruneBatch)
	want(s.UTXOPruneInterval > 0, "utxo-prune-interval", s.UTXOPruneInterval, "more than 0")
	want(s.UTXOBatchSize >= 1 && s.UTXOBatchSize <= wire.UTXOMaxBatchSize, "utxo-batch-size", s.UTXOBatchSize,
		"1 <= utxo-batch-size <= %d", wire.UTXOMaxBatchSize)
	want(s.MaxUTXORequestBytes > 0, "max-utxo-request-bytes", s.MaxUTXORequestBytes, "more than 0")
	want(s.UTXOBatchSize < 1 || s.MaxEntryBytes >= wire.UTXORecordBytes(s.UTXOBatchSize), "max-entry-bytes", s.MaxEntryBytes,
		"at least %d (%d bytes per output of a batch, plus 1 KiB)",
		wire.UTXORecordBytes(max(s.UTXOBatchSize, 1)), wire.UTXOOutputBytes)
	// Raft's leader lease is half the heartbeat timeout and, like the
	// snapshot interval, at least 5ms.
	if s.HeartbeatTimeout < 10*time.Millisecond || s.ElectionTimeout < s.HeartbeatTimeout {
		errs = append(errs, fmt.Errorf("need raft-heartbeat-timeout (%s) >= 10ms and raft-election-timeout (%s) >= raft-heartbeat-timeout",
			s.HeartbeatTimeout, s.ElectionTimeout))
	}
	want(s.SnapshotThreshold >= 1, "snapshot-threshold", s.SnapshotThreshold, "at least 1")
	want(s.TrailingLogs >= 1, "snapshot-trailing-logs", s.TrailingLogs, "at least 1")
	want(s.SnapshotInterval >= 5*time.Millisecond, "snapshot-interval", s.SnapshotInterval, "at least 5ms")
	if s.LeaderWait <= 0 {
		errs = append(errs, errors.New("leader-wait must be positive"))
	}
	if s.BootstrapExpect < 0 {
		errs = append(errs, errors.New("bootstrap-expect must not be negative"))
	}
	if s.BootstrapExpect == 0 && len(s.Join) == 0 {
		errs = append(errs, errors.New("a node that does not bootstrap (bootstrap-expect 0) needs --join"))
	}
	want(s.DeadServerTimeout > 0, "dead-server-timeout", s.DeadServerTimeout, "more than 0")
	want(s.MinQuorum >= 0, "min-quorum", s.MinQuorum, "0 or more")
	if s.TxnRetention < 0 {
		errs = append(errs, errors.New("tc-decision-retention must not be negative"))
	}
	want(s.TCFanoutTimeout > 0, "tc-fanout-timeout", s.TCFanoutTimeout, "more than 0")
	want(s.TCFanoutAttempts >= 1, "tc-fanout-attempts", s.TCFanoutAttempts, "at least 1")
	want(s.TCFanoutBaseDelay > 0, "tc-fanout-base-delay", s.TCFanoutBaseDelay, "more than 0")
	want(s.TCFanoutMaxDelay >= s.TCFanoutBaseDelay, "tc-fanout-max-delay", s.TCFanoutMaxDelay,
		"at least tc-fanout-base-delay (%s)", s.TCFanoutBaseDelay)
	want(s.TCFanoutMultiplier >= 1 && s.TCFanoutMultiplier <= 100, "tc-fanout-multiplier", s.TCFanoutMultiplier,
		"1 <= tc-fanout-multiplier <= 100")
	// Replicated in milliseconds, like leases: less would be none.
	want(s.TCPendingTTL >= time.Millisecond && s.TCPendingTTL <= s.MaxTTL, "tc-pending-ttl", s.TCPendingTTL,
		"1ms <= tc-pending-ttl <= max-ttl (%s)", s.MaxTTL)
	for _, p := range s.TCPeers {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("tc-peer %q: want an http(s) URL", p))
		} else if u.Scheme == "http" && !s.DisableMTLS {
			errs = append(errs, fmt.Errorf("tc-peer %q: with mTLS, peers are called over https", p))
		}
	}
	if u, err := url.Parse(s.APIAdvertise); s.APIAdvertise != "" && err == nil && strings.EqualFold(u.Scheme, "http") && !s.DisableMTLS {
		errs = append(errs, fmt.Errorf("api-advertise %q: with mTLS, the API is served over https", s.APIAdvertise))
	}
	if s.GossipProfile != "lan" && s.GossipProfile != "fast" {
		errs = append(errs, fmt.Errorf("gossip-profile %q: want lan or fast", s.GossipProfile))
	}
	switch strings.ToLower(s.LogLevel) { // slog reads levels in any case
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log-level %q: want debug, info, warn or error", s.LogLevel))
	}
	return errors.Join(errs...)
}
