package config

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// A pending transaction that names no expiry lasts --tc-pending-ttl, which
// another island accepts only up to its --max-ttl.
func TestPendingTTLWithinMaxTTL(t *testing.T) {
	s := Default()
	s.TCPendingTTL = s.MaxTTL
	if err := s.Validate(); err != nil {
		t.Fatalf("tc-pending-ttl = max-ttl: %v", err)
	}
	s.TCPendingTTL = s.MaxTTL + time.Second
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "tc-pending-ttl <= max-ttl") {
		t.Fatalf("tc-pending-ttl above max-ttl: %v", err)
	}
}

// The fan-out backoff multiplier is bounded: a huge one is refused.
func TestFanoutMultiplierIsBounded(t *testing.T) {
	for _, m := range []float64{0.5, 101, 1e12} {
		s := Default()
		s.TCFanoutMultiplier = m
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "tc-fanout-multiplier <= 100") {
			t.Fatalf("multiplier %g: %v", m, err)
		}
	}
}

// Log levels are read in any case, as slog reads them; others are refused.
func TestLogLevelInAnyCase(t *testing.T) {
	for _, lv := range []string{"INFO", "Debug", "warn", "ERROR"} {
		s := Default()
		s.LogLevel = lv
		if err := s.Validate(); err != nil {
			t.Fatalf("log-level %q: %v", lv, err)
		}
	}
	s := Default()
	s.LogLevel = "verbose"
	if err := s.Validate(); err == nil || !strings.Contains(err.Error(), `log-level "verbose"`) {
		t.Fatalf("log-level verbose: %v", err)
	}
}

// A setting that cannot work is refused naming its flag and value, and no
// other flag of its kind: the operator sees which one to fix.
func TestValidateNamesTheFlag(t *testing.T) {
	flags := []string{"tc-fanout-timeout", "tc-fanout-attempts", "tc-fanout-base-delay", "tc-fanout-max-delay",
		"tc-fanout-multiplier", "tc-pending-ttl", "queue-visibility", "queue-max-attempts", "max-payload-bytes",
		"utxo-retention-blocks", "utxo-rollback-window", "utxo-prune-batch", "utxo-prune-interval", "utxo-batch-size",
		"max-utxo-request-bytes", "max-entry-bytes", "snapshot-threshold", "snapshot-trailing-logs", "snapshot-interval",
		"dead-server-timeout", "min-quorum"}
	for _, c := range []struct {
		flag, says string
		set        func(*Server)
	}{
		{"tc-fanout-timeout", "tc-fanout-timeout 0s", func(s *Server) { s.TCFanoutTimeout = 0 }},
		{"tc-fanout-attempts", "tc-fanout-attempts 0", func(s *Server) { s.TCFanoutAttempts = 0 }},
		{"tc-fanout-base-delay", "tc-fanout-base-delay -1s", func(s *Server) { s.TCFanoutBaseDelay = -time.Second }},
		{"tc-fanout-max-delay", "tc-fanout-max-delay 1ms", func(s *Server) { s.TCFanoutMaxDelay = time.Millisecond }},
		{"tc-fanout-multiplier", "tc-fanout-multiplier 0.5", func(s *Server) { s.TCFanoutMultiplier = 0.5 }},
		{"tc-pending-ttl", "tc-pending-ttl 0s", func(s *Server) { s.TCPendingTTL = 0 }},
		{"tc-pending-ttl", "tc-pending-ttl 500µs", func(s *Server) { s.TCPendingTTL = 500 * time.Microsecond }},
		{"queue-visibility", "queue-visibility 500ms", func(s *Server) { s.QueueVisibility = 500 * time.Millisecond }},
		{"queue-max-attempts", "queue-max-attempts 0", func(s *Server) { s.QueueMaxAttempts = 0 }},
		{"max-payload-bytes", "max-payload-bytes 0", func(s *Server) { s.MaxPayloadBytes = 0 }},
		{"utxo-retention-blocks", "utxo-retention-blocks 0", func(s *Server) { s.UTXORetentionBlocks, s.UTXORollbackWindow = 0, 0 }},
		{"utxo-rollback-window", "utxo-rollback-window 1", func(s *Server) { s.UTXORollbackWindow = 1 }},
		{"utxo-prune-batch", "utxo-prune-batch 0", func(s *Server) { s.UTXOPruneBatch = 0 }},
		{"utxo-prune-interval", "utxo-prune-interval 0s", func(s *Server) { s.UTXOPruneInterval = 0 }},
		{"utxo-batch-size", "utxo-batch-size 0", func(s *Server) { s.UTXOBatchSize = 0 }},
		{"utxo-batch-size", "utxo-batch-size 1048577", func(s *Server) { s.UTXOBatchSize, s.MaxEntryBytes = 1<<20+1, 1<<40 }},
		{"utxo-prune-batch", "utxo-prune-batch 1048577", func(s *Server) { s.UTXOPruneBatch = 1<<20 + 1 }},
		{"max-utxo-request-bytes", "max-utxo-request-bytes 0", func(s *Server) { s.MaxUTXORequestBytes = 0 }},
		{"max-entry-bytes", "max-entry-bytes 10", func(s *Server) { s.MaxEntryBytes = 10 }},
		{"snapshot-threshold", "snapshot-threshold 0", func(s *Server) { s.SnapshotThreshold = 0 }},
		{"snapshot-trailing-logs", "snapshot-trailing-logs 0", func(s *Server) { s.TrailingLogs = 0 }},
		{"snapshot-interval", "snapshot-interval 1ms", func(s *Server) { s.SnapshotInterval = time.Millisecond }},
		{"dead-server-timeout", "dead-server-timeout 0s", func(s *Server) { s.DeadServerTimeout = 0 }},
		{"min-quorum", "min-quorum -1", func(s *Server) { s.MinQuorum = -1 }},
	} {
		s := Default()
		c.set(&s)
		err := s.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), c.says+": want ") {
			t.Errorf("%s: %v; want an error starting %q", c.flag, err, c.says+": want ")
			continue
		}
		for _, other := range flags {
			if other != c.flag && strings.Contains(err.Error(), other+" ") && !strings.Contains(err.Error(), "want at least "+other) {
				t.Errorf("%s: %v; names %s too", c.flag, err, other)
			}
		}
	}
}

// An address whose port cannot be bound is refused with its flag before
// anything is written to the data directory.
func TestListenAddressesNeedAPort(t *testing.T) {
	for _, addr := range []string{"127.0.0.1:99999", "127.0.0.1:-1", "127.0.0.1:x y"} {
		s := Default()
		s.RaftListen = addr
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "raft-listen") {
			t.Fatalf("raft-listen %q: %v", addr, err)
		}
	}
	s := Default()
	s.Listen = "127.0.0.1:0"
	if err := s.Validate(); err != nil {
		t.Fatalf("listen on any port: %v", err)
	}
}

// With mTLS on, a peer is called and the API advertised over https only:
// plain http would carry no certificate either way.
func TestPeersOverHTTPSWithMTLS(t *testing.T) {
	for _, c := range []struct {
		set  func(*Server)
		says string
	}{
		{func(s *Server) { s.TCPeers = []string{"http://10.0.0.2:9341"} }, `tc-peer "http://10.0.0.2:9341"`},
		{func(s *Server) { s.APIAdvertise = "HTTP://10.0.0.2:9341" }, `api-advertise "HTTP://10.0.0.2:9341"`},
	} {
		s := Default()
		c.set(&s)
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), "https") {
			t.Fatalf("want %s refused: %v", c.says, err)
		}
		s.DisableMTLS = true
		if err := s.Validate(); err != nil {
			t.Fatalf("%s without mTLS: %v", c.says, err)
		}
	}
	s := Default()
	s.TCPeers, s.APIAdvertise = []string{"https://10.0.0.2:9341"}, "https://10.0.0.3:9341"
	if err := s.Validate(); err != nil {
		t.Fatalf("https peers: %v", err)
	}
}

// Leases are replicated in milliseconds: a default TTL that rounds down to
// none would make every acquire that names no TTL a malformed command.
func TestDefaultTTLOfLessThanAMillisecondIsRefused(t *testing.T) {
	for _, d := range []time.Duration{time.Microsecond, 999 * time.Microsecond} {
		s := Default()
		s.DefaultTTL = d
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "default-ttl") {
			t.Errorf("default-ttl %s: %v, want it refused", d, err)
		}
	}
	s := Default()
	s.DefaultTTL = time.Millisecond
	if err := s.Validate(); err != nil {
		t.Fatalf("default-ttl 1ms: %v", err)
	}
}

// A node id is kept in the data directory as a line of text: one with
// spaces around it, or with characters that are not printable, is refused
// at start rather than kept as another id than the one given (the next
// start with the same flags would be refused, and one without them would
// run under an id its Raft configuration does not know).
func TestNodeIDIsPrintableWithoutSurroundingSpaces(t *testing.T) {
	for _, id := range []string{"n1", "node 1", "nœud-1", ""} {
		s := Default()
		s.NodeID = id
		if err := s.Validate(); err != nil {
			t.Errorf("node-id %q: %v", id, err)
		}
	}
	for _, id := range []string{" n1", "n1 ", "n1\n", " ", "n\x001", "n\t1"} {
		s := Default()
		s.NodeID = id
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("node-id %q", id)) {
			t.Errorf("node-id %q: %v, want a refusal naming it", id, err)
		}
	}
}
