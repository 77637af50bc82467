package cluster

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/raftlockd/raftlockd/fsm"
)

// A server that starts without Raft state and founds no cluster (it
// neither bootstraps nor promises to be bootstrapped) joins one that
// exists, or rejoins one it was a voter of, its data directory emptied or
// lost. Raft counts on every voter keeping what it acknowledged: an entry
// a majority acknowledged may now be held only by the servers of that
// majority other than this one. Were this server to vote before it holds
// that entry again, a server lacking it could be elected with its vote
// and overwrite it; were it to campaign, it could be elected itself. So
// until it has caught up it grants no vote and asks for none (the
// transport's vote gate).
//
// It has caught up once it has applied the commit index a leader sent it
// and that entry is of the leader's term: a leader that has committed an
// entry of its own term has committed every entry of the terms before,
// and knows of every entry committed in its own. The state is kept in a
// file in the Raft directory, so a server restarted part way is still
// joining.

// errJoining is how a joining server answers a vote request.
var errJoining = errors.New("cluster: this server is catching up after joining: it votes once it holds what the cluster committed")

const joiningFile = "joining"

func joiningIn(raftDir string) string { return filepath.Join(raftDir, joiningFile) }

// markFile creates the empty file name in dir, durably: a mark that
// outlives a crash.
func markFile(dir, name string) error { return writeMark(dir, name, nil) }

// writeMark writes the file name in dir holding mark, durably.
func writeMark(dir, name string, mark []byte) error {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if _, err := f.Write(mark); err != nil {
		f.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cluster: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := fsm.SyncDir(dir); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	return nil
}

// Joining reports whether this server is catching up after joining: it
// then takes no part in elections.
func (n *Node) Joining() bool { return n.transport.joining.Load() }

// founded ends joining for a server that is one of a new cluster's
// founders: its empty state is all the cluster has.
func (n *Node) founded() error {
	if !n.transport.joining.Load() {
		return nil
	}
	return n.joined("founds a new cluster")
}

// joiningKey names, in the Raft log store's stable keys, the mark the
// joining file holds: the mark belongs to that store. An operator who
// replaces the store with another server's copy (the way on after a
// majority lost their data, see README.md) leaves the file behind in the
// Raft directory; the copied store does not hold the mark, so the server
// votes with the log it was given instead of waiting for a leader that
// only it could help elect.
var joiningKey = []byte("raftlockd_joining")

// markJoining marks the server as joining: a random mark in the store
// first, then the file holding it, both durably.
func markJoining(raftDir string, store raft.StableStore) error {
	mark := newBackendHash()
	if err := store.Set(joiningKey, []byte(mark)); err != nil {
		return fmt.Errorf("cluster: mark joining: %w", err)
	}
	return writeMark(raftDir, joiningFile, []byte(mark))
}

// joiningMarked tells whether the server is joining: the joining file
// exists and the store holds its mark. A file without a mark was written
// by an earlier build, which kept none in the store: it counts. A file
// whose mark the store lacks was left behind when the store was replaced;
// it is removed.
func joiningMarked(raftDir string, store raft.StableStore, log *slog.Logger) (bool, error) {
	mark, err := os.ReadFile(joiningIn(raftDir))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("cluster: %w", err)
	}
	if len(mark) == 0 {
		return true, nil
	}
	held, err := store.Get(joiningKey)
	switch {
	case err == nil && bytes.Equal(held, mark):
		return true, nil
	case err != nil && !errors.Is(err, raftboltdb.ErrKeyNotFound):
		return false, fmt.Errorf("cluster: read the joining mark: %w", err)
	}
	log.Warn("the Raft log store was replaced since this server began joining (a copy of another server's): " +
		"it takes part in elections with the log it holds")
	if err := os.Remove(joiningIn(raftDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("cluster: %w", err)
	}
	if err := fsm.SyncDir(raftDir); err != nil {
		return false, fmt.Errorf("cluster: %w", err)
	}
	return false, nil
}

// joined ends joining, durably first.
func (n *Node) joined(why string) error {
	if err := os.Remove(joiningIn(raftDirOf(n.cfg.DataDir))); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cluster: %w", err)
	}
	if err := fsm.SyncDir(raftDirOf(n.cfg.DataDir)); err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	n.transport.joining.Store(false)
	n.cfg.Logger.Info("this server takes part in elections from now on", "reason", why)
	return nil
}

// watchJoining ends joining once the server has caught up (see above).
func (n *Node) watchJoining() {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n.transport.joining.Load() {
		select {
		case <-n.life.Done():
			return
		case <-t.C:
		}
		if !n.caughtUp() {
			continue
		}
		if err := n.joined("caught up after joining"); err != nil {
			n.cfg.Logger.Warn("ending joining", "error", err)
		}
	}
}

// caughtUp tells whether the latest commit index a leader sent is applied
// here and is an entry of that leader's term, the latest term this server
// knows of (a deposed leader's commit index may miss what its successor
// committed).
func (n *Node) caughtUp() bool {
	c := n.transport.commit.Load()
	if c == nil || c.index == 0 || c.term != n.raft.CurrentTerm() || n.fsm.Applied() < c.index {
		return false
	}
	return n.termAt(c.index) == c.term
}

// termAt returns the term of the entry at index, from the log or, once
// compacted, the latest snapshot; 0 when neither holds it.
func (n *Node) termAt(index uint64) uint64 {
	var l raft.Log
	if err := n.store.GetLog(index, &l); err == nil {
		return l.Term
	}
	if snaps, err := n.snaps.List(); err == nil && len(snaps) > 0 && snaps[0].Index == index {
		return snaps[0].Term
	}
	return 0
}
