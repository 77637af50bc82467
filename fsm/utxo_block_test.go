package fsm

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"slices"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// tid is a recognisable txid: every byte n.
func tid(n byte) [32]byte { return [32]byte(bytes.Repeat([]byte{n}, 32)) }

func tidHex(n byte) string { t := tid(n); return hex.EncodeToString(t[:]) }

// outHash is the utxo_hash of output vout of transaction n.
func outHash(n byte, vout uint32) [32]byte {
	h := tid(n)
	h[0], h[31] = 0xAA, byte(vout)
	return h
}

// btx builds a block transaction n with outputs outs, spending ins (each
// given as {tx, vout}).
func btx(n byte, outs int, ins ...[2]int) BlockTx {
	t := BlockTx{TxID: tid(n)}
	for _, in := range ins {
		t.Inputs = append(t.Inputs, BlockIn{TxID: tid(byte(in[0])), Vout: uint32(in[1]), Hash: outHash(byte(in[0]), uint32(in[1]))})
	}
	for v := 0; v < outs; v++ {
		t.Outputs = append(t.Outputs, UTXOOut{Vout: uint32(v), Hash: outHash(n, uint32(v)), Sats: 1000})
	}
	return t
}

func blockHash(h uint32) string { return fmt.Sprintf("%064x", h+0xB0000) }

func blockCmd(h uint32, txs ...BlockTx) *Command {
	prev := blockHash(h - 1)
	return &Command{Op: OpUTXOBlock, UTXOBlock: &UTXOBlockCmd{Phase: BlockPhaseApply, Height: h, Hash: blockHash(h), Prev: prev,
		Retention: 288, Txs: txs}}
}

func rollbackCmd(to uint32) *Command {
	return &Command{Op: OpUTXOBlock, UTXOBlock: &UTXOBlockCmd{Phase: BlockPhaseRollback, Height: to}}
}

func (h *harness) ok(c *Command) *Result {
	h.t.Helper()
	r := h.one(c)
	if r.Err != nil {
		h.t.Fatalf("%s: %v", c.Op, r.Err)
	}
	return r
}

func (h *harness) tx(n byte) *wire.UTXOTx {
	var out *wire.UTXOTx
	_ = h.f.View(func(v *View) error { out = v.UTXOTx(tidHex(n)); return nil })
	return out
}

func (h *harness) status() UTXOStatus {
	var out UTXOStatus
	_ = h.f.View(func(v *View) error { out = v.UTXOStatus(); return nil })
	return out
}

func TestBlockApplyCreatesSpendsAndMarksMined(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2)))
	// Block 2 spends an output of block 1 and one created earlier in
	// block 2 itself.
	r := h.ok(blockCmd(2, btx(2, 2, [2]int{1, 0}), btx(3, 1, [2]int{2, 1})))
	if b := r.UTXO.Block.Applied; b == nil || b.Created != 2 || b.Spent != 2 || b.Txs != 2 {
		t.Fatalf("applied: %+v", r.UTXO.Block)
	}
	a, b, c := h.tx(1), h.tx(2), h.tx(3)
	if a.SpentOutputs != 1 || a.Outputs[0].SpendingTxID != tidHex(2) || a.Outputs[1].SpendingTxID != "" {
		t.Fatalf("tx 1: %+v", a)
	}
	if b.Outputs[1].SpendingTxID != tidHex(3) || *b.Outputs[1].Vin != 0 || !slices.Equal(b.BlockHeights, []uint32{2}) ||
		b.UnminedSince != nil || c.ChainHeight != 2 {
		t.Fatalf("tx 2: %+v", b)
	}
	st := h.status()
	if st.Height != 2 || st.Tip == nil || st.Tip.Hash != blockHash(2) || st.Stats.Txs != 3 || st.Stats.Outputs != 5 {
		t.Fatalf("status: %+v", st)
	}
	// The same block again is a no-op; another block at the tip's height
	// or one that does not extend the tip is not on the tip.
	before := h.hashWithoutMeta()
	if r := h.ok(blockCmd(2, btx(2, 2, [2]int{1, 0}), btx(3, 1, [2]int{2, 1}))); !r.UTXO.Block.AlreadyApplied {
		t.Fatalf("re-apply: %+v", r.UTXO.Block)
	}
	stray := blockCmd(3, btx(9, 1))
	stray.UTXOBlock.Prev = blockHash(1)
	wantCode(t, h.one(stray), errcode.BlockNotOnTip)
	gap := blockCmd(4, btx(9, 1))
	gap.UTXOBlock.Prev = blockHash(2)
	wantCode(t, h.one(gap), errcode.BlockNotOnTip)
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a no-op or refused block changed the state")
	}
}

func TestAFailingInputRejectsTheWholeBlock(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2)))
	h.ok(blockCmd(2, btx(2, 1, [2]int{1, 0})))
	before := h.hashWithoutMeta()
	// tx 3 is fine; tx 4 double-spends 1:0, tx 5 spends a missing output,
	// tx 6 spends an output created later in the block.
	bad := blockCmd(3, btx(3, 1, [2]int{1, 1}), btx(4, 1, [2]int{1, 0}), btx(5, 1, [2]int{1, 7}),
		btx(6, 1, [2]int{7, 0}), btx(7, 1))
	r := h.one(bad)
	wantCode(t, r, errcode.BlockRejected)
	codes := map[string]string{}
	for _, it := range r.Err.Spends {
		codes[it.TxID] = it.Code
	}
	want := map[string]string{tidHex(4): wire.UTXOSpent, tidHex(5): wire.UTXONotFound, tidHex(6): wire.UTXONotFound}
	if fmt.Sprint(codes) != fmt.Sprint(want) {
		t.Fatalf("codes %v, want %v (%+v)", codes, want, r.Err.Spends)
	}
	if it := r.Err.Spends[0]; it.SpendingTxID != tidHex(2) || it.Input == nil || *it.Input != 0 {
		t.Fatalf("the double spend names its spender: %+v", it)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) || h.status().Height != 2 {
		t.Fatal("a rejected block changed the state")
	}
}

// A transaction listed twice fails as TX_EXISTS, and the block's other
// failures are reported with it, in block order.
func TestABlockListingATransactionTwiceReportsEveryFailure(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2)))
	before := h.hashWithoutMeta()
	r := h.one(blockCmd(2, btx(2, 1, [2]int{1, 0}), btx(3, 1, [2]int{1, 9}), btx(2, 1, [2]int{1, 1}), btx(4, 1, [2]int{1, 0})))
	wantCode(t, r, errcode.BlockRejected)
	var got []string
	for _, it := range r.Err.Spends {
		got = append(got, fmt.Sprintf("%d:%s", it.Index, it.Code))
	}
	want := []string{"1:" + wire.UTXONotFound, "2:" + wire.UTXOTxExists, "3:" + wire.UTXOSpent}
	if !slices.Equal(got, want) {
		t.Fatalf("failures %v, want %v", got, want)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a rejected block changed the state")
	}
}

// Rolling back restores the state exactly as it was before the blocks,
// transactions that existed before a block become unmined again, and the
// blocks can be applied once more.
func TestRollbackRestoresSpentOutputsExactly(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2), btx(2, 2)))
	// tx 5 is validated before it is mined: created and its input spent.
	h.ok(&Command{Op: OpUTXOCreate, UTXOCreate: &UTXOCreateCmd{Phase: UTXOPhaseWhole, TxID: tidHex(5), Owner: "o", Records: 1,
		Count: 1, Master: &UTXOMaster{Records: 1, Vouts: 1, Total: 1}, Outputs: []UTXOOut{{Vout: 0, Hash: outHash(5, 0), Sats: 1}}}})
	h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: tidHex(2), Vout: 1,
		Hash: hex.EncodeToString(func() []byte { x := outHash(2, 1); return x[:] }()), Spender: tidHex(5), Vin: 0}}}})
	before := h.hashWithoutMeta()
	h.ok(blockCmd(2, btx(3, 2, [2]int{1, 0}, [2]int{1, 1}), btx(4, 1, [2]int{3, 0}, [2]int{2, 0}), btx(5, 1, [2]int{2, 1})))
	h.ok(blockCmd(3, btx(6, 1, [2]int{3, 1})))
	if m := h.tx(5); m.UnminedSince != nil || !slices.Equal(m.BlockHeights, []uint32{2}) {
		t.Fatalf("tx 5 is mined in block 2: %+v", m)
	}
	if m := h.tx(1); m.DeleteAtHeight != 2+288 {
		t.Fatalf("tx 1 is spent and mined: dah %d", m.DeleteAtHeight)
	}
	r := h.ok(rollbackCmd(1))
	if len(r.UTXO.Block.Undone) != 2 || h.status().Height != 1 {
		t.Fatalf("undone: %+v", r.UTXO.Block)
	}
	m := h.tx(5)
	if m == nil || m.UnminedSince == nil || *m.UnminedSince != 1 || len(m.BlockIDs) != 0 {
		t.Fatalf("tx 5 existed before block 2 and is unmined now: %+v", m)
	}
	// Apart from tx 5's unmined mark, everything is as before.
	after := h.hashWithoutMeta()
	if !bytes.Equal(stripTx(before, 5), stripTx(after, 5)) {
		t.Fatalf("rollback did not restore the state:\n%s\n%s", before, after)
	}
	if h.tx(3) != nil || h.tx(6) != nil || h.tx(1).SpentOutputs != 0 || h.tx(1).DeleteAtHeight != 0 {
		t.Fatal("created transactions remain or spends were not undone")
	}
	// The blocks apply again.
	h.ok(blockCmd(2, btx(3, 2, [2]int{1, 0}, [2]int{1, 1}), btx(4, 1, [2]int{3, 0}, [2]int{2, 0}), btx(5, 1, [2]int{2, 1})))
	if st := h.status(); st.Height != 2 || st.Stats.BlocksUndone != 2 {
		t.Fatalf("status: %+v", st)
	}
}

// stripTx drops from a state dump the master record of transaction n.
func stripTx(dump []byte, n byte) []byte {
	t := tid(n)
	key := fmt.Sprintf("%q=", append(t[:], 0, 0, 0, 0))
	i := bytes.Index(dump, []byte(key))
	if i < 0 {
		return dump
	}
	j := bytes.IndexByte(dump[i:], ';')
	return append(bytes.Clone(dump[:i]), dump[i+j+1:]...)
}

func TestBlockStagedInChunksIsInvisibleUntilApplied(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2)))
	stage := func(chunk int, txs ...BlockTx) *Command {
		return &Command{Op: OpUTXOBlock, UTXOBlock: &UTXOBlockCmd{Phase: BlockPhaseStage, Height: 2, Hash: blockHash(2), Chunk: chunk, Txs: txs}}
	}
	h.ok(stage(0, btx(2, 1, [2]int{1, 0})))
	h.ok(stage(1, btx(3, 1, [2]int{2, 0})))
	if h.tx(2) != nil || h.tx(1).SpentOutputs != 0 || h.status().Height != 1 {
		t.Fatal("a staged chunk is visible")
	}
	apply := blockCmd(2)
	apply.UTXOBlock.Chunks = 3
	wantCode(t, h.one(apply), errcode.InvalidUTXOBlock) // chunk 2 was never staged
	apply.UTXOBlock.Chunks = 2
	h.ok(apply)
	if h.tx(3) == nil || h.tx(2).Outputs[0].SpendingTxID != tidHex(3) {
		t.Fatal("the staged block was not applied whole")
	}
	var left int
	_ = h.f.View(func(v *View) error { left = v.b(bucketUTXOStage).Stats().KeyN; return nil })
	if left != 0 {
		t.Fatalf("%d staged chunks left", left)
	}
}

// A storage failure in the middle of a block apply stops the node: the
// bbolt transaction is not committed and nothing of the block is there
// when the node opens its state again.
func TestBlockApplyInterruptedMidwayLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	h := openHarness(t, dir)
	h.ok(blockCmd(1, btx(1, 4)))
	before := h.hashWithoutMeta()
	applied := h.f.Applied()
	fatal := make(chan error, 1)
	h.f.fatal = func(err error) { fatal <- err }
	putFault = func(bucket []byte) bool { return bytes.Equal(bucket, bucketUTXOOuts) }
	defer func() { putFault = nil }()
	if r := h.one(blockCmd(2, btx(2, 2, [2]int{1, 0}), btx(3, 2, [2]int{1, 1}))); r.Err == nil {
		t.Fatal("the interrupted block was acknowledged")
	}
	if err := <-fatal; err == nil {
		t.Fatal("no fatal stop")
	}
	putFault = nil
	_ = h.f.Close()
	h2 := openHarness(t, dir)
	if h2.f.Applied() != applied || !bytes.Equal(before, h2.hashWithoutMeta()) || h2.status().Height != 1 {
		t.Fatal("part of an interrupted block is visible")
	}
	h2.index = applied
	h2.ok(blockCmd(2, btx(2, 2, [2]int{1, 0}), btx(3, 2, [2]int{1, 1})))
}

// Undo deltas are kept for the rollback window (never less than the
// retention): a prune pass frees older ones, and a rollback reaching below
// what is kept is refused and changes nothing.
func TestRollbackWindowBoundsTheDeltasKept(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for height := uint32(1); height <= 8; height++ {
		c := blockCmd(height, btx(byte(height), 1))
		c.UTXOBlock.Retention, c.UTXOBlock.Window = 2, 3
		h.ok(c)
	}
	due := func() (d bool) {
		_ = h.f.View(func(v *View) error { d = v.UTXOPruneDue(); return nil })
		return d
	}
	if !due() {
		t.Fatal("deltas out of the window, yet no prune pass due")
	}
	r := h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 100, KeepTip: true}}).UTXO.Prune
	if r.DeltasFreed != 5 || due() {
		t.Fatalf("freed %d deltas, still due %v", r.DeltasFreed, due())
	}
	if st := h.status(); st.Deltas != 3 || st.OldestDelta != 5 {
		t.Fatalf("status %+v", st)
	}
	before := h.hashWithoutMeta()
	wantCode(t, h.one(rollbackCmd(4)), errcode.BlockRollbackWindow)
	if !bytes.Equal(before, h.hashWithoutMeta()) {
		t.Fatal("a refused rollback changed the state")
	}
	if r := h.ok(rollbackCmd(5)); len(r.UTXO.Block.Undone) != 3 || h.tx(6) != nil || h.tx(5) == nil {
		t.Fatalf("rollback to the oldest height kept: %+v", r.UTXO.Block)
	}
	// Block 5 is the tip now: the chain goes on from it and from nothing
	// else, and nothing below it can be reached.
	if st := h.status(); st.Height != 5 || st.Tip == nil || st.Tip.Hash != blockHash(5) || st.OldestDelta != 5 || st.Deltas != 0 {
		t.Fatalf("status after the rollback to the window's edge: %+v (tip %+v)", st, st.Tip)
	}
	wantCode(t, h.one(rollbackCmd(4)), errcode.BlockRollbackWindow)
	wantCode(t, h.one(blockCmd(2, btx(40, 1))), errcode.BlockNotOnTip)
	stray := blockCmd(6, btx(41, 1))
	stray.UTXOBlock.Prev = blockHash(99)
	wantCode(t, h.one(stray), errcode.BlockNotOnTip)
	if r := h.ok(blockCmd(6, btx(42, 1))); r.UTXO.Block.Applied == nil || h.status().Tip.Height != 6 {
		t.Fatalf("block 6 on the tip: %+v", r.UTXO.Block)
	}
}

// A prune pass without keep_tip frees the records of the blocks whose
// deltas it frees, as builds of an older entry format do: every node of a
// cluster that is being upgraded holds the same state.
func TestPrunePassWithoutKeepTipFreesAsOlderBuildsDo(t *testing.T) {
	for _, keep := range []bool{false, true} {
		h := openHarness(t, t.TempDir())
		for height := uint32(1); height <= 8; height++ {
			c := blockCmd(height, btx(byte(height), 1))
			c.UTXOBlock.Retention, c.UTXOBlock.Window = 2, 3
			h.ok(c)
		}
		h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 100, KeepTip: keep}})
		var kept []uint32
		_ = h.f.View(func(v *View) error {
			for height := uint32(1); height <= 8; height++ {
				if v.blockAt(height) != nil {
					kept = append(kept, height)
				}
			}
			return nil
		})
		want := []uint32{6, 7, 8}
		if keep {
			want = []uint32{5, 6, 7, 8}
		}
		if !slices.Equal(kept, want) {
			t.Fatalf("keep_tip %v: block records kept %v, want %v", keep, kept, want)
		}
	}
}

// A block that mines a transaction whose creation was left unfinished
// completes it as a mined mark does: creating is cleared on every record
// and the lock is dropped.
func TestBlockMiningAnUnfinishedCreationCompletesIt(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for _, c := range []*Command{utxoStep(UTXOPhaseLock, 0), utxoStep(UTXOPhaseRecord, 0), utxoStep(UTXOPhaseRecord, 1)} {
		h.ok(c)
	}
	// The block spends an output of the transaction it mines.
	spender := BlockTx{TxID: tid(2), Inputs: []BlockIn{{TxID: tid(0xa1), Vout: 3, Hash: tid(1)}}}
	h.ok(blockCmd(1, BlockTx{TxID: tid(0xa1)}, spender))
	tx := h.tx(0xa1)
	if tx.Creating || len(tx.RecordsCreating) != 0 || tx.SpentOutputs != 1 {
		t.Fatalf("after the block: creating %v, records creating %v, spent %d", tx.Creating, tx.RecordsCreating, tx.SpentOutputs)
	}
	txid, _ := txidBytes(genTxIDs[0])
	_ = h.f.View(func(v *View) error {
		if l := v.utxoLock(txid); l != nil {
			t.Fatalf("the creation lock stays: %+v", l)
		}
		return nil
	})
}

// Rolling back a block unspends only the outputs its transactions still
// spend: an output unspent by an admin and spent by another transaction
// since keeps that spend.
func TestRollbackKeepsASpendTheBlockDidNotMake(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(blockCmd(1, btx(1, 2)))
	h.ok(blockCmd(2, btx(2, 1, [2]int{1, 0}, [2]int{1, 1})))
	x := outHash(1, 0)
	hs := hex.EncodeToString(x[:])
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOUnspend, Outpoints: []UTXOPoint{{TxID: tidHex(1), Vout: 0, Hash: hs}}}})
	h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: tidHex(1), Vout: 0, Hash: hs, Spender: tidHex(9)}}}})
	h.ok(rollbackCmd(1))
	tx := h.tx(1)
	if o := tx.Outputs[0]; o.SpendingTxID != tidHex(9) {
		t.Fatalf("the rollback of block 2 erased the spend by tx 9: %+v", o)
	}
	if o := tx.Outputs[1]; o.SpendingTxID != "" || tx.SpentOutputs != 1 {
		t.Fatalf("the rollback of block 2 kept its own spend: %+v, spent %d", o, tx.SpentOutputs)
	}
}

// A block that mines a transaction whose creation lost a record completes
// it with the outputs it carries: the missing record is written as the
// creator lays it out, so a later block spends its outputs. A mined mark,
// which carries no outputs, leaves such a creation creating.
func TestBlockMiningACreationWithAMissingRecordWritesIt(t *testing.T) {
	h := openHarness(t, t.TempDir())
	// Two records of two vouts; the creator wrote only record 0.
	h.ok(utxoStep(UTXOPhaseLock, 0))
	h.ok(utxoStep(UTXOPhaseRecord, 0))
	h.ok(&Command{Op: OpUTXOUpdate, UTXOUpdate: &UTXOUpdateCmd{Kind: UTXOMined, TxIDs: []string{genTxIDs[0]}, BlockID: 1, Height: 1, OnLongestChain: true}})
	if tx := h.tx(0xa1); !tx.Creating {
		t.Fatalf("a mined mark finished a creation with a record missing: %+v", tx)
	}
	stats := h.status().Stats
	full := BlockTx{TxID: tid(0xa1)}
	for v := uint32(0); v < 4; v++ {
		full.Outputs = append(full.Outputs, UTXOOut{Vout: v, Hash: tid(1), Sats: 5})
	}
	h.ok(blockCmd(1, full))
	tx := h.tx(0xa1)
	if tx.Creating || len(tx.RecordsCreating) != 0 || len(tx.Outputs) != 4 || tx.Outputs[3].Satoshis != 5 {
		t.Fatalf("after the block: %+v", tx)
	}
	if st := h.status().Stats; st.Records != stats.Records+1 || st.Outputs != stats.Outputs+2 {
		t.Fatalf("stats %+v, before the block %+v", st, stats)
	}
	h.ok(blockCmd(2, BlockTx{TxID: tid(2), Inputs: []BlockIn{{TxID: tid(0xa1), Vout: 2, Hash: tid(1)}}}))
	if o := h.tx(0xa1).Outputs[2]; o.SpendingTxID != tidHex(2) {
		t.Fatalf("vout 2 after block 2: %+v", o)
	}
}

// A chain applied from its genesis block reaches back to height 0 at
// most: the status does not wrap below it.
func TestTheOldestRollbackOfAChainFromGenesisIsZero(t *testing.T) {
	h := openHarness(t, t.TempDir())
	g := blockCmd(0, btx(1, 1))
	g.UTXOBlock.Prev = blockHash(99)
	h.ok(g)
	h.ok(blockCmd(1, btx(2, 1)))
	if st := h.status(); st.OldestDelta != 0 || st.Deltas != 2 {
		t.Fatalf("oldest rollback height %d with %d deltas, want 0 with 2", st.OldestDelta, st.Deltas)
	}
}
