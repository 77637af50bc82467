package fsm

import (
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
