package rm

import (
	"context"
	"errors"
	"testing"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// A staged create (txn_id) of a transaction whose records an unfinished
// creation outside any transaction left is refused with tx_exists (from
// entry format 11 on): those records are not the transaction's, and its
// decision could neither complete nor remove them. A create without a
// transaction then finishes the creation.
func TestAStagedCreateOverAnUnfinishedCreationIsRefused(t *testing.T) {
	f := newUTXOFixture(t, 2)
	if _, err := f.store.Propose(f.ctx, &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepCmd{Limit: 1, Format: fsm.EntryFormat}}); err != nil {
		t.Fatal(err)
	}
	f.u.step = func(_ context.Context, s string) error {
		if s == "record" {
			return errors.New("crashed after the master")
		}
		return nil
	}
	_, _ = f.u.Create(f.ctx, tx("m", 5))
	f.u.step = nil
	f.store.advance(UTXOLockTTL(3).Milliseconds() + 1)
	staged := tx("m", 5)
	staged.TxnID = xid.New().String()
	if _, err := f.u.Create(f.ctx, staged); !errors.Is(err, errcode.TxExists) {
		t.Fatalf("a staged create over an unfinished creation: %v, want tx_exists", err)
	}
	f.create(tx("m", 5))
	got, err := f.u.Get(f.ctx, h32("m"), Linearizable)
	if err != nil || got.Creating || len(got.RecordsCreating) != 0 {
		t.Fatalf("after the create without a transaction: %+v, %v; want it complete", got, err)
	}
}
