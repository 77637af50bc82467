package config

import (
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
