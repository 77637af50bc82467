package fsm

import (
	"encoding/hex"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

// Entry format 9 changes how some commands apply; until the island follows
// it, they apply as builds of format 8 apply them, so that every node of a
// mixed island applies each entry alike. Each test runs under both rules.

// rulesHarness is a harness whose island follows the rules of format rules.
func rulesHarness(t *testing.T, rules int) *harness {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: rules}})
	if got := h.f.Rules(); got != rules {
		t.Fatalf("rules %d, want %d", got, rules)
	}
	return h
}

// A message's sidecar lives as long as the message: acknowledged through a
// plain dequeue (the sidecar came from an earlier stateful delivery that
// was handed back), the message takes its sidecar with it.
func TestAPlainAckDropsTheMessagesSidecar(t *testing.T) {
	for _, rules := range []int{formatV8, formatV9} {
		h := rulesHarness(t, rules)
		h.one(enq("q", "m1", "x"))
		m := mustDeliver(t, h.one(statefulDeq("q", "r0", "sl-0", "st-0")))
		h.one(update(m.State, `{"step":0}`))
		h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true}})
		m = mustDeliver(t, h.one(deq("q", "r1", 0)))
		if r := h.one(ackCmd(ref(m))); r.Err != nil {
			t.Fatal(r.Err)
		}
		if st := h.stats("q"); st.Ready+st.InFlight != 0 {
			t.Fatalf("rules %d: the message is still there: %+v", rules, st)
		}
		if d := h.publicDoc(StateKey("q", "m1")); d.Exists != (rules < formatV9) {
			t.Fatalf("rules %d: the acknowledged message's sidecar exists: %v (%q)", rules, d.Exists, d.Bytes)
		}
		if rules >= formatV9 {
			if keys := h.forgettable(); len(keys) != 1 || keys[0].Key != StateKey("q", "m1") {
				t.Fatalf("rules %d: forgettable %v, want the sidecar's record", rules, keys)
			}
		}
	}
}

// A nack of a delivery enlisted in a transaction rolls the transaction
// back and requeues the message as the nack asks: defer spends no attempt
// (with max_attempts 1, no dead letter), and the delay holds it back.
func TestAnEnlistedDeliveryIsRequeuedAsItsNackAsks(t *testing.T) {
	for _, rules := range []int{formatV8, formatV9} {
		h := rulesHarness(t, rules)
		c := enq("q", "m1", "x")
		c.Enqueue.MaxAttempts = 1
		h.one(c)
		d := deq("q", "r1", 0)
		d.Dequeue.TxnID = "t1"
		m := mustDeliver(t, h.one(d))
		r := h.one(&Command{Op: OpQNack, QNack: &QueueNackCmd{MessageRef: ref(m), Defer: true, Delay: 5_000}})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		if rules < formatV9 {
			if r.Queue.DeadLetter != "q.dlq" {
				t.Fatalf("rules %d: a deferred enlisted delivery: %+v, want the dead letter of older builds", rules, r.Queue)
			}
			continue
		}
		if r.Queue.DeadLetter != "" || !r.Queue.Requeued {
			t.Fatalf("rules %d: a deferred enlisted delivery: %+v", rules, r.Queue)
		}
		if tx := txnOf(h, "t1"); tx == nil || tx.State != TxnRollback {
			t.Fatalf("rules %d: the transaction: %+v, want rolled back", rules, tx)
		}
		wantCode(t, h.one(deq("q", "r2", 0)), errcode.QueueEmpty)
		h.now += 5_000
		h.one(sweep())
		again := mustDeliver(t, h.one(deq("q", "r3", 0)))
		if again.ID != "m1" || again.Failures != 0 {
			t.Fatalf("rules %d: after the delay: %+v", rules, again)
		}
	}
}

// A prune pass that frees fewer deltas than are out of the window (its
// limit) keeps the record of the lowest block a rollback can still reach:
// rolled back to it, that block is the tip the next block must extend.
func TestALimitedPrunePassKeepsTheBlockARollbackReaches(t *testing.T) {
	for _, rules := range []int{formatV8, formatV9} {
		h := rulesHarness(t, rules)
		for height := uint32(1); height <= 8; height++ {
			c := blockCmd(height, btx(byte(height), 1))
			c.UTXOBlock.Retention, c.UTXOBlock.Window = 2, 3
			h.ok(c)
		}
		h.ok(&Command{Op: OpUTXOPrune, UTXOPrune: &UTXOPruneCmd{Limit: 2, KeepTip: true}})
		oldest := h.status().OldestDelta
		h.ok(rollbackCmd(oldest))
		st := h.status()
		if rules < formatV9 {
			if st.Tip != nil {
				t.Fatalf("rules %d: tip %+v, want none as older builds leave it", rules, st.Tip)
			}
			continue
		}
		if st.Tip == nil || st.Tip.Height != oldest {
			t.Fatalf("rules %d: rolled back to the oldest height %d: tip %+v", rules, oldest, st.Tip)
		}
		stray := blockCmd(oldest+1, btx(41, 1))
		stray.UTXOBlock.Prev = blockHash(99)
		wantCode(t, h.one(stray), errcode.BlockNotOnTip)
		h.ok(blockCmd(oldest+1, btx(42, 1)))
	}
}

// A block marks its transactions mined by its id and height together: an
// id that /v1/utxo/mined gave another block (block ids are the caller's
// there) neither hides the block's height nor goes with its rollback.
func TestBlockIDsOfMinedMarksAndAppliedBlocksDoNotCollide(t *testing.T) {
	for _, rules := range []int{formatV8, formatV9} {
		h := rulesHarness(t, rules)
		h.setHeight(50)
		h.mempoolTx(1, 1)
		h.mine(1, 1, 50) // block_id 1, as the first applied block's id
		h.ok(blockCmd(100, btx(1, 1)))
		if tx := h.tx(1); (len(tx.BlockHeights) == 2) != (rules >= formatV9) {
			t.Fatalf("rules %d: after block 100: block_ids %v block_heights %v", rules, tx.BlockIDs, tx.BlockHeights)
		}
		h.ok(rollbackCmd(99))
		tx := h.tx(1)
		if rules < formatV9 {
			if tx.UnminedSince == nil {
				t.Fatalf("rules %d: still mined after the rollback, unlike older builds", rules)
			}
			continue
		}
		if tx.UnminedSince != nil || len(tx.BlockIDs) != 1 || tx.BlockHeights[0] != 50 {
			t.Fatalf("rules %d: after rolling block 100 back: block_ids %v heights %v, unmined_since %v",
				rules, tx.BlockIDs, tx.BlockHeights, tx.UnminedSince)
		}
	}
}

// A transaction an output of which a pending two-phase spend reserves is
// kept by the prune pass, even when it is due (a conflicting one): the
// spend would otherwise commit against a transaction that is gone.
func TestPruneKeepsATransactionAPendingSpendReserves(t *testing.T) {
	for _, rules := range []int{formatV8, formatV9} {
		h := rulesHarness(t, rules)
		h.setHeight(1000)
		h.mempoolTx(1, 1)
		h.flag(UTXOConflicting, 1, true, 0)
		x := outHash(1, 0)
		h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{IgnoreConflicting: true, TxnID: "t1", TTL: 1 << 40,
			Spends: []UTXOSpendItem{{TxID: tidHex(1), Vout: 0, Hash: hex.EncodeToString(x[:]), Spender: tidHex(2)}}}})
		kept, res := h.pruneAt(1288, 1)
		if kept != (rules >= formatV9) {
			t.Fatalf("rules %d: kept %v while a pending transaction reserves its output: %+v", rules, kept, res)
		}
		if rules >= formatV9 && res.Retained.UnminedChild != 1 {
			t.Fatalf("rules %d: retained %+v, want one for an unmined child", rules, res.Retained)
		}
	}
}

// A reserved output keeps the transaction even when another of its outputs
// is spent by a stable, mined child.
func TestPruneKeepsAReservedParentWhoseOtherChildIsStable(t *testing.T) {
	h := rulesHarness(t, formatV9)
	h.setHeight(1000)
	h.mempoolTx(1, 2)
	h.mempoolTx(2, 1, [2]int{1, 1}) // child spends vout 1
	h.mine(2, 1, 1000)
	h.flag(UTXOConflicting, 1, true, 0)
	x := outHash(1, 0)
	h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{IgnoreConflicting: true, TxnID: "t1", TTL: 1 << 40,
		Spends: []UTXOSpendItem{{TxID: tidHex(1), Vout: 0, Hash: hex.EncodeToString(x[:]), Spender: tidHex(3)}}}})
	kept, res := h.pruneAt(1288, 1)
	if !kept {
		t.Fatalf("pruned while a pending spend reserves vout 0: %+v", res)
	}
}

// The other order of TestBlockIDsOfMinedMarksAndAppliedBlocksDoNotCollide:
// a /v1/utxo/mined mark given after an applied block with the same id is
// kept, and stays when the block is rolled back.
func TestAMarkAfterABlockWithTheSameIDIsKept(t *testing.T) {
	h := rulesHarness(t, formatV9)
	h.setHeight(50)
	h.mempoolTx(1, 1)
	h.ok(blockCmd(100, btx(1, 1))) // the first applied block: id 1
	h.mine(1, 1, 50)
	if tx := h.tx(1); len(tx.BlockHeights) != 2 {
		t.Errorf("after the mark: block_ids %v heights %v", tx.BlockIDs, tx.BlockHeights)
	}
	h.ok(rollbackCmd(99))
	if tx := h.tx(1); tx.UnminedSince != nil {
		t.Fatalf("the mark of block 1 at 50 went with block 100's rollback: %+v", tx)
	}
}
