package fsm

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

func (h *harness) createUTXO() {
	h.t.Helper()
	for _, c := range []*Command{utxoStep(UTXOPhaseLock, 0), utxoStep(UTXOPhaseRecord, 0), utxoStep(UTXOPhaseRecord, 1),
		utxoStep(UTXOPhaseChildren, 0), utxoStep(UTXOPhaseMaster, 0)} {
		if r := h.one(c); r.Err != nil {
			h.t.Fatalf("%s: %v", c.UTXOCreate.Phase, r.Err)
		}
	}
}

func spendOne(vout uint32, spender string) *Command {
	return &Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: genTxIDs[0], Vout: vout,
		Hash: genHashes[0], Spender: spender}}}}
}

// A spend repeated with the same spending data succeeds without a change,
// unless the child it names was deleted since: then it is INVALID_SPEND.
func TestUTXOSpendOfADeletedChildIsInvalid(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.createUTXO()
	if r := h.one(spendOne(0, genHashes[1])); r.Err != nil {
		t.Fatal(r.Err)
	}
	before := h.hashWithoutMeta()
	if r := h.one(spendOne(0, genHashes[1])); r.Err != nil {
		t.Fatalf("the same spend again: %v", r.Err)
	}
	if string(before) != string(h.hashWithoutMeta()) {
		t.Fatal("a repeated spend changed the state")
	}
	txid, _ := txidBytes(genTxIDs[0])
	if err := h.f.db.Update(func(tx *bolt.Tx) error {
		s := &applyState{reader: reader{tx: tx}}
		m := s.utxoMaster(txid)
		m.Master.DeletedChildren = []string{genHashes[1]}
		s.putUTXORecord(txid, 0, m)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	r := h.one(spendOne(0, genHashes[1]))
	if r.Err == nil || r.Err.Code != errcode.UTXOSpendFailed.Code || len(r.Err.Spends) != 1 || r.Err.Spends[0].Code != wire.UTXOInvalidSpend {
		t.Fatalf("spend naming a deleted child: %+v", r.Err)
	}
}

// stagedStep is a step of creating genTxIDs[0] for transaction txn, by a
// creator other than createUTXO's.
func stagedStep(phase string, record int, txn string) *Command {
	c := utxoStep(phase, record)
	c.UTXOCreate.Owner, c.UTXOCreate.TxnID = "staged", txn
	return c
}

// The records of a staged creation are written only while their
// transaction is pending and holds the creation: one decided (or whose
// hold ran out) before they came is refused and nothing is written, so
// the transaction is never left staged by a decided transaction and can
// be created at once by someone else.
func TestStagedCreationRecordsNeedTheirPendingTransaction(t *testing.T) {
	decide := func(state string) *Command {
		return &Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: "t1", State: state}}
	}
	cases := []struct {
		name   string
		before []int // records written while t1 is pending
		end    func(h *harness)
		want   *errcode.Error
	}{
		{"rolled back", nil, func(h *harness) { h.ok(decide(TxnRollback)) }, errcode.TxnRolledBack},
		{"rolled back after record 0", []int{0}, func(h *harness) { h.ok(decide(TxnRollback)) }, errcode.TxnRolledBack},
		{"committed", nil, func(h *harness) { h.ok(decide(TxnCommit)) }, errcode.TxnCommitted},
		{"hold expired and swept", nil, func(h *harness) { h.now += 30_001; h.ok(sweep()) }, errcode.TxnRolledBack},
		{"hold expired", nil, func(h *harness) { h.now += 30_001 }, errcode.TxnRolledBack},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := openHarness(t, t.TempDir())
			h.ok(stagedStep(UTXOPhaseLock, 0, "t1"))
			for _, r := range c.before {
				h.ok(stagedStep(UTXOPhaseRecord, r, "t1"))
			}
			c.end(h)
			for _, r := range []int{1, 0} {
				before := h.hashWithoutMeta()
				wantCode(t, h.one(stagedStep(UTXOPhaseRecord, r, "t1")), c.want)
				if !bytes.Equal(before, h.hashWithoutMeta()) {
					t.Fatalf("refused record %d changed the state", r)
				}
			}
			h.ok(sweep())
			if tx := h.tx(0xa1); tx != nil {
				t.Fatalf("left behind: %+v", tx)
			}
			h.createUTXO()
			if r := h.one(spendOne(0, genHashes[1])); r.Err != nil {
				t.Fatalf("spend after another creator made it: %v", r.Err)
			}
		})
	}
	// Pending, the records are written and the commit completes them.
	h := openHarness(t, t.TempDir())
	for _, c := range []*Command{stagedStep(UTXOPhaseLock, 0, "t1"), stagedStep(UTXOPhaseRecord, 1, "t1"),
		stagedStep(UTXOPhaseRecord, 0, "t1"), decide(TxnCommit), spendOne(3, genHashes[1])} {
		h.ok(c)
	}
}

// A sweep does at most its limit of work: expiring a transaction's UTXO
// holds costs one unit per participant, and what does not fit is left
// for the next sweeps.
func TestSweepOfUTXOHoldsStopsAtItsLimit(t *testing.T) {
	h := openHarness(t, t.TempDir())
	for n := byte(1); n <= 3; n++ {
		h.mempoolTx(n, 4)
	}
	// Transactions t0-t3 each reserve an output of every one of txs 1-3:
	// three participants, three holds each.
	for i := uint32(0); i < 4; i++ {
		c := &UTXOSpendCmd{TxnID: fmt.Sprintf("t%d", i), TTL: 1_000}
		for n := byte(1); n <= 3; n++ {
			x := outHash(n, i)
			c.Spends = append(c.Spends, UTXOSpendItem{TxID: tidHex(n), Vout: i, Hash: hex.EncodeToString(x[:]), Spender: tidHex(9), Vin: i})
		}
		h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: c})
	}
	h.now += 1_000
	limited := &Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 4, TxnRetention: 60_000}}
	sweeps, expired := 0, 0
	for more := true; more; sweeps++ {
		if sweeps == 10 {
			t.Fatal("the sweeps never finish")
		}
		res := h.ok(limited).Sweep
		// One transaction of three participants is the whole limit.
		if res.Expired > 1 {
			t.Fatalf("sweep %d expired %d transactions with a limit of 4", sweeps, res.Expired)
		}
		expired += res.Expired
		more = res.More
	}
	if expired != 4 {
		t.Fatalf("%d of 4 transactions expired in %d sweeps", expired, sweeps)
	}
	for i := 0; i < 4; i++ {
		if tr := txnOf(h, fmt.Sprintf("t%d", i)); tr.State != TxnRollback {
			t.Fatalf("t%d: %+v", i, tr)
		}
	}
	for n := byte(1); n <= 3; n++ {
		for _, o := range h.tx(n).Outputs {
			if o.ReservedBy != "" {
				t.Fatalf("tx %d output %d still reserved by %s", n, o.Vout, o.ReservedBy)
			}
		}
	}
}

// A block that creates a transaction whole while a multi-record creator
// holds its lock keeps its outputs: the creator's record writes that come
// after answer tx_exists and change nothing, so the block's spend stays.
func TestCreatorRecordsAfterABlockCreatedTheTxChangeNothing(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(utxoStep(UTXOPhaseLock, 0)) // the creator locked, nothing written yet
	x := BlockTx{TxID: tid(0xa1)}
	for v := uint32(0); v < 4; v++ {
		x.Outputs = append(x.Outputs, UTXOOut{Vout: v, Hash: tid(1), Sats: 5})
	}
	spender := BlockTx{TxID: tid(2), Inputs: []BlockIn{{TxID: tid(0xa1), Vout: 2, Hash: tid(1)}}}
	h.ok(blockCmd(1, x, spender))
	if o := h.tx(0xa1).Outputs[2]; o.SpendingTxID != tidHex(2) {
		t.Fatalf("setup: %+v", o)
	}
	before, stats := h.hashWithoutMeta(), h.status().Stats
	for _, c := range []*Command{utxoStep(UTXOPhaseRecord, 0), utxoStep(UTXOPhaseRecord, 1)} {
		wantCode(t, h.one(c), errcode.TxExists)
	}
	if !bytes.Equal(before, h.hashWithoutMeta()) || h.status().Stats != stats {
		t.Fatalf("the creator's records changed the block's transaction: stats %+v, then %+v", stats, h.status().Stats)
	}
	tx := h.tx(0xa1)
	if tx.Outputs[2].SpendingTxID != tidHex(2) || tx.SpentOutputs != 1 || tx.Creating {
		t.Fatalf("after the creator's records: %+v", tx)
	}
	r := h.one(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{Spends: []UTXOSpendItem{{TxID: genTxIDs[0], Vout: 2,
		Hash: genHashes[0], Spender: tidHex(9)}}}})
	if r.Err == nil {
		t.Fatal("vout 2, spent by the block, was spent again")
	}
}

// An outpoint a staged spend lists twice for two children fails the second
// item with SPENT, naming the first child, as a plain spend does; so does
// a later staged spend of the same transaction for another child.
func TestStagedSpendOfAnOutpointTwiceIsSpent(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.mempoolTx(1, 1)
	x := outHash(1, 0)
	hs := hex.EncodeToString(x[:])
	item := func(child byte) UTXOSpendItem {
		return UTXOSpendItem{TxID: tidHex(1), Vout: 0, Hash: hs, Spender: tidHex(child), Vin: uint32(child)}
	}
	for _, spends := range [][]UTXOSpendItem{{item(2), item(3)}, {item(3)}} {
		if len(spends) == 1 {
			h.ok(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{TxnID: "t1", TTL: 10_000, Spends: []UTXOSpendItem{item(2)}}})
		}
		r := h.one(&Command{Op: OpUTXOSpend, UTXOSpend: &UTXOSpendCmd{TxnID: "t1", TTL: 10_000, Spends: spends}})
		wantCode(t, r, errcode.UTXOSpendFailed)
		if len(r.Err.Spends) != 1 {
			t.Fatalf("spends %d: failed items %+v, want the second child's only", len(spends), r.Err.Spends)
		}
		it := r.Err.Spends[0]
		if it.Index != len(spends)-1 || it.Code != wire.UTXOSpent || it.SpendingTxID != tidHex(2) || it.Vin == nil || *it.Vin != 2 {
			t.Fatalf("spends %d: the second child's item is %+v, want SPENT by the first", len(spends), it)
		}
	}
}

// Record 0 of a creation must lay its records out as a block completing
// the creation would: from vout 0, just enough records of its count for
// the vouts.
func TestCreationRecordLayoutCoversTheVouts(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.ok(utxoStep(UTXOPhaseLock, 0))
	tooMany := utxoStep(UTXOPhaseRecord, 0)
	tooMany.UTXOCreate.Records, tooMany.UTXOCreate.Master.Records = 3, 3
	wantCode(t, h.one(tooMany), errcode.MalformedCmd)
	shifted := utxoStep(UTXOPhaseRecord, 0)
	shifted.UTXOCreate.First = 2
	for i := range shifted.UTXOCreate.Outputs {
		shifted.UTXOCreate.Outputs[i].Vout += 2
	}
	wantCode(t, h.one(shifted), errcode.MalformedCmd)
	h.ok(utxoStep(UTXOPhaseRecord, 0))
}
