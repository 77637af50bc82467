package cluster

import (
	"path/filepath"
	"testing"

	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
)

// A term saved after the node shut its store down is dropped, not an error
// raft would panic on; one saved before is kept.
func TestStableSavesAfterShutdownAreDropped(t *testing.T) {
	path := filepath.Join(t.TempDir(), "raft.db")
	store, err := raftboltdb.NewBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	s := &closingStable{StableStore: store}
	if err := s.SetUint64([]byte("CurrentTerm"), 3); err != nil {
		t.Fatal(err)
	}
	s.shutDown()
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetUint64([]byte("CurrentTerm"), 4); err != nil {
		t.Fatalf("a save after shutdown: %v", err)
	}
	if err := s.Set([]byte("LastVoteCand"), []byte("x")); err != nil {
		t.Fatalf("a save after shutdown: %v", err)
	}
	store, err = raftboltdb.NewBoltStore(path)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if term, err := store.GetUint64([]byte("CurrentTerm")); err != nil || term != 3 {
		t.Fatalf("term %d %v, want 3", term, err)
	}
}
