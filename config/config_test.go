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
