package cluster

import (
	"fmt"

	"github.com/hashicorp/raft"
)

// checkTrust cross-checks a state file that survived a restart against the
// Raft log and snapshots before raft is told to keep it. The file is
// discarded (and rebuilt by raft from the latest snapshot and the log) when
// it is behind the latest snapshot, ahead of everything raft holds, or
// disagrees with the log about the term of its last applied entry: for
// example after a crash in the middle of installing a snapshot, or when the
// Raft directory was replaced.
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
	return "", nil
}
