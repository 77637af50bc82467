// Package config owns the server's settings: their names, defaults and
// validation. Flags and RAFTLOCKD_* environment variables are bound to these
// fields by the command line in cmd/raftlockd; the server only ever sees a
// validated Server value.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"
)

// Server is one node's configuration.
type Server struct {
	DataDir       string
	NodeID        string // empty: generated once and kept in the data dir
	Listen        string // HTTP API address
	RaftListen    string
	RaftAdvertise string // empty: RaftListen
	APIAdvertise  string // the API endpoint peers hand to clients; empty: derived from Listen
	DisableMTLS   bool
	Pprof         bool // serve Go's profiler under /debug/pprof/ on the API address

	GossipListen      string
	GossipAdvertise   string
	Join              []string // gossip addresses of existing members
	BootstrapExpect   int      // servers that must meet before a new cluster starts; 0: only join
	ClusterName       string
	DeadServerTimeout time.Duration
	MinQuorum         int // fewest voters dead-server cleanup may leave; 0: a majority of BootstrapExpect
	// GossipProfile picks memberlist's timing: "lan" (memberlist's LAN
	// defaults) or "fast" (sub-second failure detection for loopback
	// clusters and tests).
	GossipProfile string

	DefaultTTL    time.Duration
	MaxTTL        time.Duration
	AcquireBlock  time.Duration // longest an acquire may wait for a lease
	MaxStateBytes int64
	TxnRetention  time.Duration // how long final decisions are kept for retries

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
		DataDir:           DefaultDataDir(),
		Listen:            "127.0.0.1:9341",
		RaftListen:        "127.0.0.1:9342",
		GossipListen:      "127.0.0.1:9343",
		BootstrapExpect:   1,
		ClusterName:       "raftlockd",
		DeadServerTimeout: time.Minute,
		GossipProfile:     "lan",
		DefaultTTL:        30 * time.Second,
		MaxTTL:            time.Hour,
		AcquireBlock:      60 * time.Second,
		MaxStateBytes:     1 << 20,
		TxnRetention:      10 * time.Minute,
		LeaderWait:        5 * time.Second,
		HeartbeatTimeout:  500 * time.Millisecond,
		ElectionTimeout:   500 * time.Millisecond,
		SnapshotThreshold: 16384,
		TrailingLogs:      10240,
		SnapshotInterval:  30 * time.Second,
		LogLevel:          "info",
	}
}

// APIEndpoint is the endpoint this node publishes for clients.
func (s *Server) APIEndpoint(bound string) string {
	if s.APIAdvertise != "" {
		return s.APIAdvertise
	}
	host, port, err := net.SplitHostPort(bound)
	if err != nil {
		return "http://" + bound
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return "http://" + net.JoinHostPort(host, port)
}

// Validate reports every setting that cannot work.
func (s *Server) Validate() error {
	var errs []error
	if s.DataDir == "" {
		errs = append(errs, errors.New("data dir is required"))
	}
	for name, addr := range map[string]string{"listen": s.Listen, "raft-listen": s.RaftListen, "gossip-listen": s.GossipListen} {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s %q: %w", name, addr, err))
		}
	}
	if s.DefaultTTL <= 0 || s.MaxTTL < time.Second || s.DefaultTTL > s.MaxTTL {
		errs = append(errs, fmt.Errorf("need 0 < default-ttl (%s) <= max-ttl (%s), max-ttl >= 1s", s.DefaultTTL, s.MaxTTL))
	}
	if s.AcquireBlock < 0 {
		errs = append(errs, errors.New("acquire-block must not be negative"))
	}
	if s.MaxStateBytes <= 0 {
		errs = append(errs, errors.New("max-state-bytes must be positive"))
	}
	if s.LeaderWait <= 0 {
		errs = append(errs, errors.New("leader-wait must be positive"))
	}
	if s.BootstrapExpect < 0 {
		errs = append(errs, errors.New("bootstrap-expect must not be negative"))
	}
	if s.BootstrapExpect == 0 && len(s.Join) == 0 {
		errs = append(errs, errors.New("a node that does not bootstrap (bootstrap-expect 0) needs --join"))
	}
	if s.DeadServerTimeout <= 0 || s.MinQuorum < 0 {
		errs = append(errs, errors.New("dead-server-timeout must be positive and min-quorum not negative"))
	}
	if s.TxnRetention < 0 {
		errs = append(errs, errors.New("txn-retention must not be negative"))
	}
	if s.GossipProfile != "lan" && s.GossipProfile != "fast" {
		errs = append(errs, fmt.Errorf("gossip-profile %q: want lan or fast", s.GossipProfile))
	}
	switch s.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log-level %q: want debug, info, warn or error", s.LogLevel))
	}
	return errors.Join(errs...)
}
