package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
)

// checkReplay refuses a Raft directory raft cannot start from: raft starts
// from the newest snapshot it can read (the newest listed when the state
// file is kept, the newest that opens otherwise) and reads every log entry
// after it, and panics when the log no longer holds them. That is the case
// when the newest snapshot is damaged (an unreadable meta.json, a state.bin
// missing or shorter than meta.json says) and the log was compacted past
// the older ones.
func (n *Node) checkReplay(snaps raft.SnapshotStore, raftDir string, keepState bool) error {
	metas, err := snaps.List()
	if err != nil {
		return fmt.Errorf("cluster: list snapshots: %w", err)
	}
	var damaged []string
	entries, _ := os.ReadDir(filepath.Join(raftDir, "snapshots"))
	for _, e := range entries {
		listed := slices.ContainsFunc(metas, func(m *raft.SnapshotMeta) bool { return m.ID == e.Name() })
		if e.IsDir() && !listed && !strings.HasSuffix(e.Name(), ".tmp") {
			damaged = append(damaged, e.Name()+": meta.json does not read back")
		}
	}
	var from uint64
	for _, m := range metas {
		if keepState {
			from = m.Index
			break
		}
		data := filepath.Join(raftDir, "snapshots", m.ID, "state.bin")
		fi, err := os.Stat(data)
		if err == nil && fi.Size() == m.Size {
			from = m.Index
			break
		}
		if err == nil {
			err = fmt.Errorf("state.bin holds %d bytes, meta.json says %d", fi.Size(), m.Size)
		}
		damaged = append(damaged, fmt.Sprintf("%s: %v", m.ID, err))
	}
	first, err := n.store.FirstIndex()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	last, err := n.store.LastIndex()
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	if last <= from || first <= from+1 {
		return nil
	}
	why := "no snapshot reaches it"
	if len(damaged) > 0 {
		why = "damaged: " + strings.Join(damaged, "; ")
	}
	return fmt.Errorf("cluster: the Raft log in %s starts at entry %d, but the newest snapshot that reads back ends at %d "+
		"(%s); restore the data directory from a copy, or, when other servers of the cluster hold the log, "+
		"empty it (keeping node-id and tls) to catch up from them", raftDir, first, from, why)
}
