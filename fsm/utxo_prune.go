package fsm

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strconv"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// Safe deletion of UTXO transactions.
//
// A transaction's delete-at-height (DAH) follows from its master whenever
// the master is written (utxoLifecycle): it is set to height + retention
// once every output is spent and the transaction is mined on the longest
// chain, or at once when it is conflicting; preserve_until suppresses it,
// locking removes it, it is never lowered, and unspending an output or
// leaving the longest chain clears it. An index (dah|txid) lists the
// transactions with a DAH, and another (preserve_until|txid) the preserved
// ones, so that a prune pass reads only what is due.
//
// A prune pass (utxoPrune) deletes a due transaction only after positive
// verification that every child named in its outputs' spending data is
// mined on the longest chain at a height at least retention blocks below
// the chain height. Anything else (an unmined, recently mined, missing or
// unreadable child) keeps it for a later pass. A pass does a bounded amount
// of work and resumes from a cursor kept in the replicated state; deleting a
// transaction records it in its parents' deleted_children.

var (
	bucketUTXODAH      = []byte("utxo_dah")          // dah(4)|txid(32) -> nil
	bucketUTXOPreserve = []byte("utxo_preserve")     // preserve_until(4)|txid(32) -> nil
	metaUTXORetention  = []byte("utxo_retention")    // blocks (8 bytes)
	metaUTXOWindow     = []byte("utxo_window")       // rollback window in blocks (8 bytes)
	metaUTXOCursor     = []byte("utxo_prune_cursor") // the DAH index key the next pass starts after
	metaUTXOStats      = []byte("utxo_stats")        // UTXOStats
)

// Retention and rollback window used until a command sets them.
const (
	DefaultUTXORetention = 288
	DefaultUTXOWindow    = 4320
)

// UTXOStats are the replicated counters of the UTXO records.
type UTXOStats struct {
	Txs     int64 `json:"txs"`
	Records int64 `json:"records"`
	Outputs int64 `json:"outputs"`
	// DAHPending counts transactions with a delete-at-height.
	DAHPending int64 `json:"dah_pending"`
	Pruned     int64 `json:"pruned"`
	Passes     int64 `json:"passes"`
	Cycles     int64 `json:"cycles"` // passes that reached the end of the due transactions
	// Retained in the current cycle, by reason.
	Retained Retained `json:"retained"`
	// Retained in the last completed cycle.
	LastRetained  Retained `json:"last_retained"`
	BlocksApplied int64    `json:"blocks_applied"`
	BlocksUndone  int64    `json:"blocks_undone"`
}

// Retained counts due transactions a prune pass kept, by the reason.
type Retained struct {
	UnminedChild    int64 `json:"unmined_child"`
	UnstableChild   int64 `json:"unstable_child"`
	UnreadableChild int64 `json:"unreadable_child"`
}

// utxoStats returns the batch's counters, loaded on first use and written
// back when the batch finishes.
func (s *applyState) utxoStats() *UTXOStats {
	if s.ustats == nil {
		s.ustats = s.readUTXOStats()
	}
	return s.ustats
}

func (r reader) readUTXOStats() *UTXOStats {
	st := &UTXOStats{}
	r.getJSON(bucketMeta, metaUTXOStats, st)
	return st
}

func (r reader) metaU32(key []byte, def uint32) uint32 {
	if v := r.b(bucketMeta).Get(key); v != nil {
		return uint32(u64(v))
	}
	return def
}

func (r reader) utxoRetention() uint32 { return r.metaU32(metaUTXORetention, DefaultUTXORetention) }
func (r reader) utxoWindow() uint32    { return r.metaU32(metaUTXOWindow, DefaultUTXOWindow) }

// setUTXOPolicy records the retention and rollback window a command
// carries (0 leaves a value as it is).
func (s *applyState) setUTXOPolicy(retention, window uint32) {
	if retention > 0 && retention != s.utxoRetention() {
		s.put(bucketMeta, metaUTXORetention, putU64(uint64(retention)))
	}
	if window > 0 && window != s.utxoWindow() {
		s.put(bucketMeta, metaUTXOWindow, putU64(uint64(window)))
	}
}

func heightKey(h uint32, txid []byte) []byte {
	return append(binary.BigEndian.AppendUint32(nil, h), txid...)
}

// mined reports whether m is mined on the longest chain.
func (m *UTXOMaster) mined() bool { return m.UnminedSince == nil && len(m.BlockHeights) > 0 }

// dueDAH is the delete-at-height m should have at height.
func dueDAH(rec *UTXORecord, height, retention uint32) uint32 {
	m := rec.Master
	switch {
	case m.Locked || m.StagedBy != "" || rec.Creating || m.PreserveUntil > height:
		return 0
	case m.DeleteAtHeight != 0 && (m.Conflicting || (m.Spent >= m.Total && m.mined())):
		return m.DeleteAtHeight // never lowered
	case m.Conflicting || (m.Spent >= m.Total && m.mined()):
		return uint32(min(uint64(height)+uint64(retention), 1<<32-1))
	}
	return 0
}

// utxoLifecycle brings the master's delete-at-height up to date and moves
// its index entries.
func (s *applyState) utxoLifecycle(txid []byte, rec *UTXORecord) {
	m := rec.Master
	m.DeleteAtHeight = dueDAH(rec, s.utxoHeight(), s.utxoRetention())
	if m.DeleteAtHeight != m.dahWas {
		st := s.utxoStats()
		if m.dahWas != 0 {
			s.del(bucketUTXODAH, heightKey(m.dahWas, txid))
			st.DAHPending--
		}
		if m.DeleteAtHeight != 0 {
			s.put(bucketUTXODAH, heightKey(m.DeleteAtHeight, txid), nil)
			st.DAHPending++
		}
		m.dahWas = m.DeleteAtHeight
	}
	if m.PreserveUntil != m.presWas {
		if m.presWas != 0 {
			s.del(bucketUTXOPreserve, heightKey(m.presWas, txid))
		}
		if m.PreserveUntil > s.utxoHeight() {
			s.put(bucketUTXOPreserve, heightKey(m.PreserveUntil, txid), nil)
		}
		m.presWas = m.PreserveUntil
	}
}

// unindexUTXO removes the index entries of a transaction being deleted.
func (s *applyState) unindexUTXO(txid []byte, m *UTXOMaster) {
	if m.dahWas != 0 {
		s.del(bucketUTXODAH, heightKey(m.dahWas, txid))
		s.utxoStats().DAHPending--
	}
	if m.presWas != 0 {
		s.del(bucketUTXOPreserve, heightKey(m.presWas, txid))
	}
}

// UTXOPruneCmd runs one prune pass of at most Limit transactions.
type UTXOPruneCmd struct {
	Limit     int    `json:"limit"`
	Retention uint32 `json:"retention,omitempty"`
	Window    uint32 `json:"window,omitempty"`
	// KeepTip keeps the record of the highest block whose undo delta the
	// pass frees: a rollback may reach that block, and the next block must
	// then extend it. Only builds of entry format 4 apply it; a pass
	// without it frees the record with the delta, as older builds do.
	KeepTip bool `json:"keep_tip,omitempty"`
}

// PruneResult reports a prune pass.
type PruneResult struct {
	Examined int      `json:"examined"`
	Pruned   []string `json:"pruned,omitempty"`
	Retained Retained `json:"retained"`
	// Preserved counts transactions whose preserve_until passed and whose
	// delete-at-height was brought up to date.
	Preserved   int    `json:"preserved,omitempty"`
	DeltasFreed int    `json:"deltas_freed,omitempty"`
	Cursor      string `json:"cursor,omitempty"` // hex; empty when the pass wrapped
	Wrapped     bool   `json:"wrapped,omitempty"`
	Height      uint32 `json:"height"`
}

// Why a child keeps its parent.
const (
	childSafe = iota
	childUnmined
	childUnstable
	childUnreadable
)

// childState verifies one spending child: it must exist, be readable, be
// mined on the longest chain, and its highest block must be retention
// blocks below height (boundary inclusive). A child that is gone and is
// listed in the parent's deleted (the parent's deleted_children) was
// verified when it was pruned, so it is safe.
func (r reader) childState(child []byte, deleted []string, height, retention uint32) int {
	raw := r.b(bucketUTXORecs).Get(recKey(child, 0))
	if raw == nil && slices.Contains(deleted, hex.EncodeToString(child)) {
		return childSafe
	}
	var rec UTXORecord
	if raw == nil || decodeRecord(raw, &rec) != nil || rec.Master == nil {
		return childUnreadable
	}
	m := rec.Master
	if m.UnminedSince != nil || len(m.BlockHeights) == 0 {
		return childUnmined
	}
	if uint64(slices.Max(m.BlockHeights))+uint64(retention) > uint64(height) {
		return childUnstable
	}
	return childSafe
}

// spendingChildren lists the distinct children named in txid's outputs'
// spending data, and whether a pending two-phase spend reserves one of
// them; ok is false when an output cannot be read.
func (r reader) spendingChildren(txid []byte) (children [][]byte, reserved, ok bool) {
	c := r.b(bucketUTXOOuts).Cursor()
	seen := map[string]bool{}
	for k, v := c.Seek(txid); k != nil && bytes.HasPrefix(k, txid); k, v = c.Next() {
		var o utxoOutput
		if decodeOut(v, &o) != nil {
			return nil, false, false
		}
		reserved = reserved || o.Rsv != nil
		if !o.Spent {
			continue
		}
		b, err := hex.DecodeString(o.Spender)
		if err != nil || len(b) != 32 {
			return nil, false, false
		}
		if !seen[string(b)] {
			seen[string(b)] = true
			children = append(children, b)
		}
	}
	return children, reserved, true
}

func (s *applyState) utxoPrune(c *UTXOPruneCmd) *Result {
	if c.Limit <= 0 || c.Limit > wire.UTXOMaxPruneBatch {
		return fail(errcode.MalformedCmd.With("utxo prune needs a limit"))
	}
	s.setUTXOPolicy(c.Retention, c.Window)
	height, retention := s.utxoHeight(), s.utxoRetention()
	res := &PruneResult{Height: height}
	st := s.utxoStats()
	st.Passes++
	budget := c.Limit

	// Preserved transactions whose time has come get their DAH.
	for _, k := range s.dueHeightKeys(bucketUTXOPreserve, nil, height, budget) {
		budget--
		s.del(bucketUTXOPreserve, k)
		txid := k[4:]
		if rec := s.utxoMaster(txid); rec != nil {
			rec.Master.presWas = 0
			s.putUTXORecord(txid, 0, rec)
			res.Preserved++
		}
	}

	cursor := bytes.Clone(s.b(bucketMeta).Get(metaUTXOCursor))
	due := s.dueHeightKeys(bucketUTXODAH, cursor, height, max(budget, 0)+1)
	more := len(due) > max(budget, 0)
	if more {
		due = due[:max(budget, 0)]
	}
	for _, k := range due {
		res.Examined++
		cursor = k
		txid := k[4:]
		rec := s.utxoMaster(txid)
		if rec == nil || rec.Master.DeleteAtHeight != binary.BigEndian.Uint32(k) {
			s.del(bucketUTXODAH, k) // stale entry
			st.DAHPending--
			continue
		}
		why := childSafe
		children, reserved, ok := s.spendingChildren(txid)
		switch {
		case !ok:
			why = childUnreadable
		case reserved && s.rules() >= formatV9:
			// A pending two-phase spend: its child is not even written.
			why = childUnmined
		}
		for _, ch := range children {
			if why != childSafe {
				break
			}
			why = s.childState(ch, rec.Master.DeletedChildren, height, retention)
		}
		switch why {
		case childUnmined:
			res.Retained.UnminedChild++
		case childUnstable:
			res.Retained.UnstableChild++
		case childUnreadable:
			res.Retained.UnreadableChild++
		default:
			s.pruneUTXOTx(txid, rec.Master)
			res.Pruned = append(res.Pruned, hex.EncodeToString(txid))
		}
	}
	st.Retained.UnminedChild += res.Retained.UnminedChild
	st.Retained.UnstableChild += res.Retained.UnstableChild
	st.Retained.UnreadableChild += res.Retained.UnreadableChild
	st.Pruned += int64(len(res.Pruned))
	if more {
		s.put(bucketMeta, metaUTXOCursor, cursor)
		res.Cursor = hex.EncodeToString(cursor)
	} else {
		// Every due transaction was looked at: the next pass starts over.
		s.del(bucketMeta, metaUTXOCursor)
		res.Wrapped = true
		st.Cycles++
		st.LastRetained, st.Retained = st.Retained, Retained{}
	}
	res.DeltasFreed = s.freeDeltas(c.Limit, c.KeepTip)
	return &Result{UTXO: &UTXOResult{Prune: res, Height: height}}
}

// dueHeightKeys returns up to limit keys of a height-ordered index after
// cursor whose height is at most height.
func (s *applyState) dueHeightKeys(bucket, cursor []byte, height uint32, limit int) [][]byte {
	var out [][]byte
	c := s.b(bucket).Cursor()
	var k []byte
	if cursor == nil {
		k, _ = c.First()
	} else {
		k, _ = c.Seek(cursor)
		if bytes.Equal(k, cursor) {
			k, _ = c.Next()
		}
	}
	for ; k != nil && len(out) < limit && len(k) == 36 && binary.BigEndian.Uint32(k) <= height; k, _ = c.Next() {
		out = append(out, bytes.Clone(k))
	}
	return out
}

// pruneUTXOTx deletes a verified transaction and records it in each
// parent's deleted_children.
func (s *applyState) pruneUTXOTx(txid []byte, m *UTXOMaster) {
	s.dropUTXOTx(txid)
	id := hex.EncodeToString(txid)
	var done []string
	for _, in := range m.Inputs {
		if slices.Contains(done, in.TxID) {
			continue
		}
		done = append(done, in.TxID)
		p, ok := txidBytes(in.TxID)
		if !ok {
			continue
		}
		if rec := s.utxoMaster(p); rec != nil && !slices.Contains(rec.Master.DeletedChildren, id) {
			rec.Master.DeletedChildren = append(rec.Master.DeletedChildren, id)
			s.putUTXORecord(p, 0, rec)
		}
	}
}

// UTXOStatus is the state's part of the UTXO status view.
type UTXOStatus struct {
	Height      uint32     `json:"height"`
	Tip         *BlockInfo `json:"tip,omitempty"`
	Retention   uint32     `json:"retention"`
	Window      uint32     `json:"window"`
	OldestDelta uint32     `json:"oldest_delta,omitempty"` // lowest height a rollback can reach
	Deltas      int        `json:"deltas"`
	Cursor      string     `json:"cursor,omitempty"`
	Stats       UTXOStats  `json:"stats"`
	// DueNow counts transactions whose DAH has been reached (at most
	// 100000 are counted).
	DueNow int `json:"due_now"`
}

// UTXOPolicy is the retention and rollback window in force.
type UTXOPolicy struct{ Retention, Window uint32 }

// UTXOPolicy returns the retention and rollback window in force: the
// defaults until a block apply or a prune pass records a server's.
func (v *View) UTXOPolicy() UTXOPolicy {
	return UTXOPolicy{Retention: v.utxoRetention(), Window: v.utxoWindow()}
}

// UTXOStatus returns the status of the UTXO records.
func (v *View) UTXOStatus() UTXOStatus {
	st := UTXOStatus{Height: v.utxoHeight(), Retention: v.utxoRetention(), Window: v.utxoWindow(),
		Stats: *v.readUTXOStats(), Cursor: hex.EncodeToString(v.b(bucketMeta).Get(metaUTXOCursor))}
	st.Tip = v.tipBlock()
	if k, _ := v.b(bucketUTXOUndo).Cursor().First(); k != nil {
		st.OldestDelta = max(binary.BigEndian.Uint32(k), 1) - 1 // a chain from genesis rolls back to 0 at most
	} else if st.Tip != nil {
		st.OldestDelta = st.Tip.Height
	}
	st.Deltas = v.b(bucketUTXOUndo).Stats().KeyN
	dc := v.b(bucketUTXODAH).Cursor()
	for k, _ := dc.First(); k != nil && st.DueNow < 100000 && binary.BigEndian.Uint32(k) <= st.Height; k, _ = dc.Next() {
		st.DueNow++
	}
	return st
}

// UTXOChainMark names the chain a prune pass judges by: its height and
// tip block. A transaction a pass retained (a child unmined or too recent)
// is judged again the same way until the chain moves on.
func (v *View) UTXOChainMark() string {
	tip := ""
	if b := v.tipBlock(); b != nil {
		tip = b.Hash
	}
	return strconv.FormatUint(uint64(v.utxoHeight()), 10) + "/" + tip
}

// UTXOPruneDue reports whether a prune pass has work: a transaction past
// its delete-at-height, a preserve that ended, or an undo delta out of the
// rollback window.
func (v *View) UTXOPruneDue() bool {
	height := v.utxoHeight()
	for _, b := range [][]byte{bucketUTXODAH, bucketUTXOPreserve} {
		if k, _ := v.b(b).Cursor().First(); len(k) == 36 && binary.BigEndian.Uint32(k) <= height {
			return true
		}
	}
	cutoff, ok := v.deltaCutoff()
	return ok && (len(v.heightsUpTo(bucketUTXOUndo, cutoff, 1)) > 0 ||
		(cutoff > 0 && len(v.heightsUpTo(bucketUTXOBlocks, cutoff-1, 1)) > 0))
}
