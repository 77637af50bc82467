package cluster

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/hashicorp/raft"

	"github.com/raftlockd/raftlockd/fsm"
)

// checkTrust cross-checks a state file that survived a restart against the
// Raft log and snapshots before raft is told to keep it. The file is
// discarded (and rebuilt by raft from the latest snapshot and the log) when
// it is behind the latest snapshot, ahead of everything raft holds, or
// disagrees with the log about the term of its last applied entry or with
// the snapshots and log about the island's backend hash: for example after
// a crash in the middle of installing a snapshot, when the Raft directory
// was replaced, or when another cluster's state file was copied in.
func (n *Node) checkTrust(snaps raft.SnapshotStore) error {
	if !n.fsm.Trusted() {
		return nil
	}
	reason, err := n.distrust(snaps)
	if err != nil || reason == "" {
		return err
	}
	n.cfg.Logger.Warn("state file does not match the Raft log; rebuilding it from the snapshot and log", "reason", reason,
		"applied", n.fsm.Applied())
	return n.fsm.Reset()
}

func (n *Node) distrust(snaps raft.SnapshotStore) (string, error) {
	applied, term := n.fsm.Applied(), n.fsm.AppliedTerm()
	var snapIndex, snapTerm uint64
	metas, err := snaps.List()
	if err != nil {
		return "", fmt.Errorf("cluster: list snapshots: %w", err)
	}
	if len(metas) > 0 {
		snapIndex, snapTerm = metas[0].Index, metas[0].Term
	}
	first, err := n.store.FirstIndex()
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	last, err := n.store.LastIndex()
	if err != nil {
		return "", fmt.Errorf("cluster: %w", err)
	}
	inLog := func(i uint64) (*raft.Log, bool) {
		if first == 0 || i < first || i > last {
			return nil, false
		}
		var l raft.Log
		if n.store.GetLog(i, &l) != nil {
			return nil, false
		}
		return &l, true
	}
	switch {
	case applied > max(last, snapIndex):
		return fmt.Sprintf("applied index %d is beyond the log (%d) and snapshot (%d)", applied, last, snapIndex), nil
	case applied == snapIndex && applied > 0 && term != snapTerm:
		return fmt.Sprintf("applied term %d differs from the snapshot's %d", term, snapTerm), nil
	}
	if l, ok := inLog(applied); ok && applied > 0 && l.Term != term {
		return fmt.Sprintf("applied entry %d has term %d in the log, %d in the state", applied, l.Term, term), nil
	}
	// Behind the latest snapshot is fine only when every entry in between
	// is one the state machine never sees (raft's own no-ops).
	for i := applied + 1; i <= snapIndex; i++ {
		l, ok := inLog(i)
		if !ok {
			return fmt.Sprintf("applied index %d is behind snapshot %d and the entries between are gone", applied, snapIndex), nil
		}
		if l.Type == raft.LogCommand || l.Type == raft.LogConfiguration {
			return fmt.Sprintf("applied index %d is behind snapshot %d", applied, snapIndex), nil
		}
	}
	return n.foreign(metas, first, inLog), nil
}

// foreign tells whether the state file belongs to another island (another
// cluster's file copied in): its backend hash, the island's identity set by
// the first set_backend entry, differs from the one the snapshots and the
// log hold. Two clusters may well share an applied index and its term. The
// cluster's hash is read from the newest snapshot that reads back, or, when
// that holds none, from the first log entry up to the applied index that
// names the island. It has no opinion when the cluster's records do not
// tell.
func (n *Node) foreign(metas []*raft.SnapshotMeta, first uint64, inLog func(uint64) (*raft.Log, bool)) string {
	applied, own := n.fsm.Applied(), n.fsm.BackendHash()
	var theirs string
	var at uint64 // the island was named at or before this index
	// whole: the records seen hold every entry up to the applied index.
	whole := first <= 1
	for _, m := range metas {
		path := filepath.Join(raftDirOf(n.cfg.DataDir), "snapshots", m.ID, "state.bin")
		hash, snapApplied, err := fsm.StateBackend(path)
		if err != nil {
			n.cfg.Logger.Warn("cannot read a snapshot's backend hash", "snapshot", m.ID, "error", err)
			continue
		}
		theirs, at, whole = hash, snapApplied, first <= m.Index+1
		break
	}
	for i := max(first, 1); theirs == "" && whole && i <= applied; i++ {
		l, ok := inLog(i)
		if !ok {
			whole = false
			break
		}
		if l.Type == raft.LogCommand {
			theirs, at = fsm.EntryBackend(l.Data), i
		}
	}
	switch {
	case own == theirs:
		return ""
	case own != "" && theirs != "",
		own == "" && at <= applied,
		theirs == "" && whole:
		return fmt.Sprintf("its backend hash %q differs from the cluster's %q: it is another cluster's state file", own, theirs)
	}
	return ""
}

// dropsApplied stops the node when raft cuts off log entries from min on
// that it has applied: the cluster elected a leader without them, so they
// were lost to it (a server's data directory was rolled back or replaced
// from an older copy, and its vote counted for writes it had forgotten),
// and this server's state and snapshots hold writes no other server has.
// Serving them would diverge for good. The node marks its data directory
// for a resync (see resync) and stops.
func (n *Node) dropsApplied(min, max, term uint64) {
	applied := n.fsm.Applied()
	_, leader := n.raft.LeaderWithID()
	err := markFile(n.cfg.DataDir, resyncFile)
	n.cfg.Logger.Error("the cluster's leader replaced log entries this server had applied: writes acknowledged "+
		"before were lost to the cluster (was a data directory rolled back or restored from an older copy?); "+
		"stopping: on restart this server drops its state and catches up from the cluster",
		"dropped_from", min, "dropped_to", max, "dropped_term", term, "applied", applied, "applied_term", n.fsm.AppliedTerm(),
		"commit_index", n.raft.CommitIndex(), "term", n.raft.CurrentTerm(), "leader", leader, "mark_error", err)
	n.fsm.Halt(fmt.Errorf("cluster: the Raft log drops entries %d..%d, applied up to %d", min, max, applied))
}

// resyncFile, in a data directory, says that its state and Raft log hold
// entries the cluster replaced (dropsApplied).
const resyncFile = "resync"

// resync empties the state and the Raft directory of a node marked for a
// resync, once the state file is open (so no other process uses the
// directory): the node then starts without Raft state, joining, and
// catches up from the cluster's leader.
func (n *Node) resync(raftDir string) error {
	mark := filepath.Join(n.cfg.DataDir, resyncFile)
	if _, err := os.Stat(mark); err != nil {
		return nil
	}
	n.cfg.Logger.Warn("this server's state holds entries the cluster replaced; dropping it and its Raft log to catch up from the cluster")
	if err := n.fsm.Reset(); err != nil {
		return err
	}
	if err := os.RemoveAll(raftDir); err != nil {
		return fmt.Errorf("cluster: resync: %w", err)
	}
	if err := os.MkdirAll(raftDir, 0o700); err != nil {
		return fmt.Errorf("cluster: resync: %w", err)
	}
	if err := fsm.SyncDir(n.cfg.DataDir); err != nil {
		return fmt.Errorf("cluster: resync: %w", err)
	}
	if err := os.Remove(mark); err != nil {
		return fmt.Errorf("cluster: resync: %w", err)
	}
	if err := fsm.SyncDir(n.cfg.DataDir); err != nil {
		return fmt.Errorf("cluster: resync: %w", err)
	}
	return nil
}
