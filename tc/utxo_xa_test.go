package tc_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

func createUTXO(t *testing.T, c *client.Client, name string, outputs int, txn string) *wire.UTXOCreateResponse {
	t.Helper()
	req := testutil.UTXOTx(name, outputs, 1000)
	req.TxnID = txn
	res, err := c.UTXOCreate(context.Background(), req)
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return res
}

func spendOf(parent string, vout int, child string) wire.UTXOSpend {
	return testutil.UTXOSpend(parent, vout, child, 0)
}

func utxoTx(t *testing.T, c *client.Client, name string) *wire.UTXOTx {
	t.Helper()
	tx, err := c.UTXOGet(context.Background(), testutil.Hash32(name), false)
	if err != nil {
		t.Fatalf("get %s: %v", name, err)
	}
	return tx
}

// UTXO spends and creates take part in transactions across islands like
// keys: a spend staged on island b reserves its outputs (another spender
// is refused at once with LOCKED:<txn>), the coordinator on a commits it
// together with a key of a, or rolls it back and frees the outputs; a
// create staged on b appears only with the commit.
func TestUTXOParticipantsAcrossIslands(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	createUTXO(t, b.client(), "parent", 4, "")

	// Commit: a key on a and two outputs on b.
	txn := xid.New().String()
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"paid":true}`)
	res, err := b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{TxnID: txn,
		Spends: []wire.UTXOSpend{spendOf("parent", 0, "child"), spendOf("parent", 1, "child")}})
	if err != nil || len(res.Participants) != 1 || res.Participants[0].BackendHash != b.hash() {
		t.Fatalf("staged spend: %+v, %v", res, err)
	}
	_, err = b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{spendOf("parent", 0, "thief")}})
	ce := wantCode(t, err, http.StatusConflict, "utxo_spend_failed")
	if len(ce.Envelope.Spends) != 1 || ce.Envelope.Spends[0].Code != wire.UTXOLockedPrefix+txn {
		t.Fatalf("spend of a reserved output: %+v", ce.Envelope.Spends)
	}
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: append([]wire.TxnParticipant{part("ka", a)}, res.Participants...)}); err != nil {
		t.Fatalf("commit: %v", err)
	}
	got := utxoTx(t, b.client(), "parent")
	if got.Outputs[0].SpendingTxID != testutil.Hash32("child") || got.Outputs[1].SpendingTxID != testutil.Hash32("child") || got.SpentOutputs != 2 {
		t.Fatalf("after the commit: %+v", got.Outputs)
	}
	if publicDoc(t, a.client(), "ka") != `{"paid":true}` {
		t.Fatal("the key did not commit with the spend")
	}

	// Rollback: the reserved output is free for another spender.
	txn = xid.New().String()
	res, err = b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{TxnID: txn, Spends: []wire.UTXOSpend{spendOf("parent", 2, "child2")}})
	if err != nil {
		t.Fatal(err)
	}
	stage(t, acquire(t, a.client(), "ka", txn, "w"), `{"paid":false}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateRollback,
		Participants: append([]wire.TxnParticipant{part("ka", a)}, res.Participants...)}); err != nil {
		t.Fatalf("rollback: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the rolled back reservation to be released", func() bool {
		return utxoTx(t, b.client(), "parent").Outputs[2].ReservedBy == ""
	})
	if _, err := b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{spendOf("parent", 2, "other")}}); err != nil {
		t.Fatalf("spend after the rollback: %v", err)
	}

	// A create staged on b for a transaction a coordinates.
	txn = xid.New().String()
	cr := createUTXO(t, b.client(), "staged", 2, txn)
	if cr.Participant == nil {
		t.Fatal("a staged create names no participant")
	}
	_, err = b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{spendOf("staged", 0, "early")}})
	ce = wantCode(t, err, http.StatusConflict, "utxo_spend_failed")
	if ce.Envelope.Spends[0].Code != wire.UTXOLockedPrefix+txn {
		t.Fatalf("spend of an uncommitted create: %+v", ce.Envelope.Spends)
	}
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{*cr.Participant}}); err != nil {
		t.Fatalf("commit the create: %v", err)
	}
	if tx := utxoTx(t, b.client(), "staged"); tx.Creating || tx.StagedBy != "" {
		t.Fatalf("committed create: %+v", tx)
	}
	if _, err := b.client().UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{spendOf("staged", 0, "late")}}); err != nil {
		t.Fatalf("spend of the committed create: %v", err)
	}
	clean(t, a, b)
}
