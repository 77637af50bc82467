package cluster

import (
	"sync"

	"github.com/hashicorp/raft"
)

// closingStable is the stable store raft writes its term and vote to. Raft
// answers heartbeats on the transport's goroutines, which its Shutdown does
// not wait for: one that passed raft's shutdown check can still save a new
// term after Close shut the store, and raft panics on a failed save. Once
// shut, a save is dropped instead: raft has stopped, and a heartbeat
// carries no entries, so nothing it acknowledges depends on the term.
type closingStable struct {
	raft.StableStore
	mu   sync.RWMutex
	shut bool
}

func (s *closingStable) Set(key, val []byte) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.shut {
		return nil
	}
	return s.StableStore.Set(key, val)
}

func (s *closingStable) SetUint64(key []byte, val uint64) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.shut {
		return nil
	}
	return s.StableStore.SetUint64(key, val)
}

// shutDown waits for saves in flight and drops later ones; call it before
// closing the store.
func (s *closingStable) shutDown() {
	s.mu.Lock()
	s.shut = true
	s.mu.Unlock()
}
