package fsm

import (
	"encoding/hex"
	"slices"
	"testing"

	"github.com/raftlockd/raftlockd/wire"
)

// The delete-at-height timelines: a parent P (tx 1) whose outputs are all
// spent by children, verified child by child before P is pruned. Heights
// are set directly; the retention is 288 blocks.

func (h *harness) setHeight(height uint32) {
	h.t.Helper()
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOHeight, Height: height}})
}

// mempoolTx creates transaction n with outs outputs, its inputs listed as
// parents, unmined.
func (h *harness) mempoolTx(n byte, outs int, ins ...[2]int) {
	h.t.Helper()
	m := &UTXOMaster{Records: 1, Vouts: uint32(outs), Total: outs}
	var o []UTXOOut
	for v := 0; v < outs; v++ {
		o = append(o, UTXOOut{Vout: uint32(v), Hash: outHash(n, uint32(v)), Sats: 10})
	}
	var spends []UTXOSpendItem
	for vin, in := range ins {
		m.Inputs = append(m.Inputs, UTXOPoint{TxID: tidHex(byte(in[0])), Vout: uint32(in[1])})
		x := outHash(byte(in[0]), uint32(in[1]))
		spends = append(spends, UTXOSpendItem{TxID: tidHex(byte(in[0])), Vout: uint32(in[1]), Hash: hex.EncodeToString(x[:]),
			Spender: tidHex(n), Vin: uint32(vin)})
	}
	h.ok(&Command{Op: OpUTXOCreate, UTXOCreate: &UTXOCreateCmd{Phase: UTXOPhaseWhole, TxID: tidHex(n), Owner: "o", Records: 1,
		Count: uint32(max(outs, 1)), Master: m, Outputs: o}})
	if len(spends) > 0 {
		h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: spends}})
	}
}

func (h *harness) mine(n byte, blockID, height uint32) {
	h.t.Helper()
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOMined, TxIDs: []string{tidHex(n)}, BlockID: blockID,
		Height: height, OnLongestChain: true}})
}

func (h *harness) flag(kind string, n byte, value bool, height uint32) {
	h.t.Helper()
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: kind, TxIDs: []string{tidHex(n)}, Value: value,
		Height: height, OnLongestChain: value}})
}

func (h *harness) prune() *PruneResult {
	h.t.Helper()
	return h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 100, Retention: 288}}).UTXO.Prune
}

// at moves the chain to height and runs a prune pass; it reports whether
// tx n is still there.
func (h *harness) pruneAt(height uint32, n byte) (kept bool, res *PruneResult) {
	h.t.Helper()
	h.setHeight(height)
	res = h.prune()
	return h.tx(n) != nil, res
}

// parentAndChild: P (tx 1, one output) mined at 1000; child C (tx 2)
// spends it at 1000, unmined. P's DAH is 1288.
func parentAndChild(t *testing.T) *harness {
	h := openHarness(t, t.TempDir())
	h.setHeight(1000)
	h.mempoolTx(1, 1)
	h.mine(1, 1, 1000)
	h.mempoolTx(2, 1, [2]int{1, 0})
	if dah := h.tx(1).DeleteAtHeight; dah != 1288 {
		t.Fatalf("P's DAH is %d, want 1288", dah)
	}
	return h
}

func TestDAHChildNeverMinedKeepsTheParent(t *testing.T) {
	h := parentAndChild(t)
	for _, height := range []uint32{1288, 1500, 2000} {
		kept, res := h.pruneAt(height, 1)
		if !kept || res.Retained.UnminedChild != 1 {
			t.Fatalf("at %d: kept %v, %+v", height, kept, res)
		}
	}
	if st := h.status(); st.Stats.LastRetained.UnminedChild != 1 || st.Stats.Pruned != 0 {
		t.Fatalf("status: %+v", st.Stats)
	}
}

func TestDAHChildMinedLateDeletesAtChildHeightPlusRetention(t *testing.T) {
	h := parentAndChild(t)
	if kept, _ := h.pruneAt(1288, 1); !kept {
		t.Fatal("deleted at 1288 with an unmined child")
	}
	h.setHeight(1500)
	h.mine(2, 2, 1500)
	kept, res := h.pruneAt(1787, 1)
	if !kept || res.Retained.UnstableChild != 1 {
		t.Fatalf("287 blocks after the child: kept %v %+v", kept, res)
	}
	if kept, res = h.pruneAt(1788, 1); kept || !slices.Equal(res.Pruned, []string{tidHex(1)}) {
		t.Fatalf("288 blocks after the child: kept %v %+v", kept, res)
	}
}

// The seed's 1288/1289 boundary: child mined at 1001.
func TestDAHBoundaryIsInclusive(t *testing.T) {
	h := parentAndChild(t)
	h.setHeight(1001)
	h.mine(2, 2, 1001)
	if kept, _ := h.pruneAt(1288, 1); !kept {
		t.Fatal("1288 - 1001 = 287 < 288, yet deleted")
	}
	if kept, _ := h.pruneAt(1289, 1); kept {
		t.Fatal("1289 - 1001 = 288, yet kept")
	}
}

func TestDAHReorgOrphansTheChildAndItIsMinedAgain(t *testing.T) {
	h := parentAndChild(t)
	h.setHeight(1100)
	h.mine(2, 2, 1100)
	h.setHeight(1200)
	h.flag(UTXOLongestChain, 2, false, 0) // the reorg orphans the child
	if kept, res := h.pruneAt(1288, 1); !kept || res.Retained.UnminedChild != 1 {
		t.Fatalf("orphaned child: kept %v %+v", kept, res)
	}
	h.setHeight(1300)
	h.mine(2, 3, 1300)
	if kept, res := h.pruneAt(1587, 1); !kept || res.Retained.UnstableChild != 1 {
		t.Fatalf("re-mined at 1300, at 1587: kept %v %+v", kept, res)
	}
	if kept, _ := h.pruneAt(1588, 1); kept {
		t.Fatal("re-mined at 1300, still kept at 1588")
	}
}

func TestDAHEveryChildMustBeStable(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.setHeight(1000)
	h.mempoolTx(1, 2)
	h.mine(1, 1, 1000)
	h.mempoolTx(2, 1, [2]int{1, 0})
	h.mempoolTx(3, 1, [2]int{1, 1})
	h.mine(2, 2, 1000)
	h.setHeight(1250)
	h.mine(3, 3, 1250)
	if kept, res := h.pruneAt(1288, 1); !kept || res.Retained.UnstableChild != 1 {
		t.Fatalf("one unstable child: kept %v %+v", kept, res)
	}
	if kept, _ := h.pruneAt(1537, 1); !kept {
		t.Fatal("deleted before the second child is stable")
	}
	if kept, _ := h.pruneAt(1538, 1); kept {
		t.Fatal("both children stable, still kept")
	}
}

func TestDAHConflictingPreservedAndLocked(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.setHeight(500)
	h.mempoolTx(1, 1)
	h.flag(UTXOConflicting, 1, true, 0) // a DAH at once, unspent and unmined
	if dah := h.tx(1).DeleteAtHeight; dah != 788 {
		t.Fatalf("conflicting: DAH %d", dah)
	}
	if kept, _ := h.pruneAt(787, 1); !kept {
		t.Fatal("deleted before its DAH")
	}
	if kept, _ := h.pruneAt(788, 1); kept {
		t.Fatal("a conflicting transaction without children stays past its DAH")
	}

	// Preserved until 2000: no DAH before then, then height + retention.
	h.mempoolTx(3, 1)
	h.mine(3, 1, 800)
	h.mempoolTx(4, 1, [2]int{3, 0})
	h.mine(4, 2, 800)
	if dah := h.tx(3).DeleteAtHeight; dah != 788+288 {
		t.Fatalf("tx 3: DAH %d", dah)
	}
	h.flag(UTXOPreserve, 3, false, 2000)
	if m := h.tx(3); m.DeleteAtHeight != 0 || m.PreserveUntil != 2000 {
		t.Fatalf("preserved: %+v", m)
	}
	if kept, _ := h.pruneAt(1999, 3); !kept || h.tx(3).DeleteAtHeight != 0 {
		t.Fatal("preserved transaction lost")
	}
	if kept, res := h.pruneAt(2000, 3); !kept || res.Preserved != 1 || h.tx(3).DeleteAtHeight != 2288 {
		t.Fatalf("preserve ended: %+v %+v", res, h.tx(3))
	}

	// Locking removes the DAH, unlocking brings it back; unspending
	// clears it.
	h.flag(UTXOLockedFlag, 3, true, 0)
	if h.tx(3).DeleteAtHeight != 0 {
		t.Fatal("a locked transaction keeps its DAH")
	}
	h.flag(UTXOLockedFlag, 3, false, 0)
	if h.tx(3).DeleteAtHeight == 0 {
		t.Fatal("unlocked, no DAH")
	}
	x := outHash(3, 0)
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOUnspend, Outpoints: []UTXOPoint{{TxID: tidHex(3), Hash: hex.EncodeToString(x[:])}}}})
	if h.tx(3).DeleteAtHeight != 0 {
		t.Fatal("unspent output, DAH kept")
	}
	if st := h.status(); st.Stats.DAHPending != 0 {
		t.Fatalf("DAH index: %+v", st.Stats)
	}
}

// Pruning a transaction records it in its parents' deleted_children, and a
// late re-spend of the parent by the deleted child is INVALID_SPEND.
func TestDeletedChildrenMakeALateRespendInvalid(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.setHeight(100)
	h.mempoolTx(1, 2) // grandparent: one output stays unspent
	h.mine(1, 1, 100)
	h.mempoolTx(2, 1, [2]int{1, 0})
	h.mine(2, 2, 100)
	h.mempoolTx(3, 1, [2]int{2, 0})
	h.mine(3, 3, 100)
	if kept, _ := h.pruneAt(388, 2); kept {
		t.Fatal("tx 2 is spent, mined and its child stable: it goes")
	}
	if g := h.tx(1); !slices.Equal(g.DeletedChildren, []string{tidHex(2)}) {
		t.Fatalf("deleted_children: %v", g.DeletedChildren)
	}
	x := outHash(1, 0)
	r := h.one(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: tidHex(1), Vout: 0,
		Hash: hex.EncodeToString(x[:]), Spender: tidHex(2)}}}})
	if r.Err == nil || len(r.Err.Spends) != 1 || r.Err.Spends[0].Code != wire.UTXOInvalidSpend {
		t.Fatalf("late re-spend: %+v", r.Err)
	}
}

// A pass does at most its limit and resumes after the last transaction it
// looked at; a pass that reaches the end starts the next one over.
func TestPrunePassesResumeFromTheCursor(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.setHeight(10)
	for n := byte(1); n <= 4; n++ {
		h.mempoolTx(n, 1)
		h.flag(UTXOConflicting, n, true, 0)
	}
	h.mempoolTx(5, 1)
	h.mine(5, 1, 10)
	h.mempoolTx(6, 1, [2]int{5, 0}) // tx 5 has an unmined child: kept
	h.setHeight(300)
	pass := func() *PruneResult {
		return h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 2}}).UTXO.Prune
	}
	var pruned []string
	for i := 0; i < 3; i++ {
		r := pass()
		pruned = append(pruned, r.Pruned...)
		if wantWrap := i == 2; r.Wrapped != wantWrap || (r.Cursor == "") != wantWrap {
			t.Fatalf("pass %d: %+v", i, r)
		}
	}
	if len(pruned) != 4 || h.tx(5) == nil {
		t.Fatalf("pruned %v", pruned)
	}
	if r := pass(); r.Examined != 1 || len(r.Pruned) != 0 || !r.Wrapped {
		t.Fatalf("next cycle: %+v", r)
	}
}

// A reorganisation through blocks: the child is mined in a block that is
// rolled back, so it becomes unmined and keeps its parent; mined again in
// a later block, the parent goes retention blocks after that.
func TestBlockRollbackOrphansTheChildAndKeepsTheParent(t *testing.T) {
	h := openHarness(t, t.TempDir())
	block := func(height uint32, txs ...BlockTx) {
		t.Helper()
		c := blockCmd(height, txs...)
		c.UTXOBlock.Retention = 3
		h.ok(c)
	}
	pruneAt := func(height uint32, n byte) (bool, *PruneResult) {
		t.Helper()
		if h.status().Height != height {
			t.Fatalf("at %d, not %d", h.status().Height, height)
		}
		r := h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 100, Retention: 3}}).UTXO.Prune
		return h.tx(n) != nil, r
	}
	filler := byte(100)
	fill := func(from, to uint32) {
		for height := from; height <= to; height++ {
			filler++
			block(height, btx(filler, 1))
		}
	}
	block(1, btx(1, 1)) // P
	h.mempoolTx(2, 1, [2]int{1, 0})
	block(2, BlockTx{TxID: tid(2), Inputs: []BlockIn{{TxID: tid(1), Vout: 0, Hash: outHash(1, 0)}}, Outputs: []UTXOOut{{Vout: 0, Hash: outHash(2, 0), Sats: 10}}})
	fill(3, 4)
	h.ok(rollbackCmd(1))
	if c := h.tx(2); c == nil || c.UnminedSince == nil || h.tx(1).SpentOutputs != 1 {
		t.Fatalf("the child left the chain: %+v", c)
	}
	fill(2, 6)
	if kept, res := pruneAt(6, 1); !kept || res.Retained.UnminedChild != 1 {
		t.Fatalf("orphaned child: kept %v %+v", kept, res)
	}
	block(7, BlockTx{TxID: tid(2), Inputs: []BlockIn{{TxID: tid(1), Vout: 0, Hash: outHash(1, 0)}}, Outputs: []UTXOOut{{Vout: 0, Hash: outHash(2, 0), Sats: 10}}})
	fill(8, 9)
	if kept, res := pruneAt(9, 1); !kept || res.Retained.UnstableChild != 1 {
		t.Fatalf("child mined again at 7, at 9: kept %v %+v", kept, res)
	}
	fill(10, 10)
	if kept, _ := pruneAt(10, 1); kept {
		t.Fatal("child mined at 7, retention 3: still kept at 10")
	}
}

// A child pruned before its parent became due does not keep the parent:
// the parent's deleted_children lists it as verified, so the parent is
// pruned at its own delete-at-height and no prune stays due.
func TestDAHChildPrunedFirstDoesNotKeepTheParent(t *testing.T) {
	h := openHarness(t, t.TempDir())
	// Block 1: P (tx 1) with 2 outputs; C (tx 2) spends P:0; D (tx 3) spends C:0.
	h.ok(blockCmd(1, btx(1, 2), btx(2, 1, [2]int{1, 0}), btx(3, 1, [2]int{2, 0})))
	for height := uint32(2); height < 50; height++ {
		h.ok(blockCmd(height, btx(byte(100+height), 1)))
	}
	// Block 50: E (tx 4) spends P:1, so P is fully spent only now.
	h.ok(blockCmd(50, btx(4, 1, [2]int{1, 1})))
	if dc, dp := h.tx(2).DeleteAtHeight, h.tx(1).DeleteAtHeight; dc != 1+288 || dp != 50+288 {
		t.Fatalf("delete-at-height of C %d, of P %d", dc, dp)
	}
	h.setHeight(1 + 288)
	if res := h.prune(); h.tx(2) != nil {
		t.Fatalf("C not pruned: %+v", res)
	}
	if dc := h.tx(1).DeletedChildren; len(dc) != 1 || dc[0] != tidHex(2) {
		t.Fatalf("P's deleted children: %v", dc)
	}
	h.setHeight(50 + 288)
	if res := h.prune(); h.tx(1) != nil || len(res.Pruned) != 1 || res.Pruned[0] != tidHex(1) {
		t.Fatalf("P kept at its delete-at-height: %+v", res)
	}
	var due bool
	_ = h.f.View(func(v *View) error { due = v.UTXOPruneDue(); return nil })
	if due {
		t.Fatal("a prune is still due")
	}
}
