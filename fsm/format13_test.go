package fsm

import (
	"testing"
	"time"

	"github.com/rs/xid"
)

// Entry format 13: an island that has no record of a transaction whose id
// was minted before the latest record it forgot had been created (less
// TxnClockSkew), or more than TxnClockSkew ahead of its clock, rolls the
// transaction back when another island's coordinator prepares it, or its
// own coordinator decides it pending or commit naming its keys, instead of
// locking the keys for it: the transaction may have held them, expired
// and been forgotten, its staged writes gone, and must not commit on its
// other islands alone. Before, the keys were locked and the commit
// committed nothing here.
func TestAnIslandRollsBackATransactionItMayHaveForgotten(t *testing.T) {
	for _, rules := range []int{formatV12, formatV13} {
		h := islandHarness(t, rules)
		minted := func(at int64) string { return xid.NewWithTime(time.UnixMilli(at)).String() }
		prepare := func(txn, key string) *Result {
			return h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: txn, Home: "far", Term: 1,
				ExpiresAt: h.now + 60_000, LeaseID: "lx-" + key, Participants: []Participant{local(key)}}})
		}
		want := func(what string, r *Result, forgotten bool) {
			t.Helper()
			switch {
			case r.Err != nil:
				t.Fatalf("rules %d: %s: %v", rules, what, r.Err)
			case forgotten && (r.Decision != TxnRollback || r.Txn.Reason != ReasonPresumedAbort):
				t.Fatalf("rules %d: %s: %+v, want a presumed abort", rules, what, r.Txn)
			case !forgotten && r.Decision == TxnRollback:
				t.Fatalf("rules %d: %s: rolled back (%+v)", rules, what, r.Txn)
			}
		}
		// A transaction minted the retention before the island adopted the
		// rules may have been forgotten before the island noted it.
		want("prepare of a transaction minted before the retention", prepare(minted(h.now-600_000), "old"), rules >= formatV13)

		t1, t2 := minted(h.now), minted(h.now)
		for _, l := range []*LeaseInfo{mustLease(t, h.one(acq("k1", t1, "r1", 1_000, 0))), mustLease(t, h.one(acq("k2", t2, "r2", 1_000, 0)))} {
			if r := h.one(update(l, `{"v":1}`)); r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		h.now += 1_000
		h.one(sweep())
		if r := h.txn(t1); r == nil || r.Reason != ReasonExpired {
			t.Fatalf("rules %d: t1 after its lease expired: %+v", rules, r)
		}
		h.now += 60_000
		h.one(sweep())
		if r := h.txn(t1); r != nil {
			t.Fatalf("rules %d: t1 is still known: %+v", rules, r)
		}

		r := prepare(t1, "k1")
		want("prepare of a forgotten transaction", r, rules >= formatV13)
		if rules < formatV13 {
			if r.Decision != TxnPending {
				t.Fatalf("rules %d: prepare of a forgotten transaction: %+v", rules, r)
			}
		} else {
			mustLease(t, h.one(acq("k1", minted(h.now), "r3", 1_000, 0))) // k1 stayed free
		}
		r = h.one(&Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: t2, State: TxnCommit, Prepared: []string{"far"},
			Participants: []Participant{local("k2"), {Namespace: "default", Key: "kf", Backend: "far"}}}})
		want("the commit of a forgotten transaction", r, rules >= formatV13)
		if got := h.publicDoc("k2"); got.Exists {
			t.Fatalf("rules %d: k2 holds %q", rules, got.Bytes)
		}

		// A transaction minted since, within TxnClockSkew of nothing
		// forgotten, is prepared; one minted far ahead of the island's
		// clock is not.
		want("prepare of a new transaction", prepare(minted(h.now), "k4"), false)
		want("prepare of a transaction minted ahead", prepare(minted(h.now+2*TxnClockSkew.Milliseconds()), "k5"), rules >= formatV13)
		checkInvariants(t, h)
	}
}

// islandHarness is a harness of the island "here" under the rules of
// format rules, with a retention of ten minutes.
func islandHarness(t *testing.T, rules int) *harness {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, TxnRetention: 600_000, Format: rules}})
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	return h
}

func (h *harness) txn(id string) *TxnRecord {
	var t *TxnRecord
	_ = h.f.View(func(v *View) error { t = v.Txn(id); return nil })
	return t
}

// A restore forgets every transaction the backup does not hold: one the
// island knew until the restore and has no record of afterwards is rolled
// back when it is prepared, as one it forgot by retention is.
func TestARestoredIslandRollsBackATransactionTheBackupDoesNotHold(t *testing.T) {
	h := islandHarness(t, formatV13)
	backup := snapshotFile(t, h)

	h.now += 5 * 60_000
	txn := xid.NewWithTime(time.UnixMilli(h.now)).String()
	l := mustLease(t, h.one(acq("k", txn, "r1", 600_000, 0)))
	if r := h.one(update(l, `{"v":1}`)); r.Err != nil {
		t.Fatal(r.Err)
	}
	restoreBackup(t, h, backup)
	h.now += 1000
	r := h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: txn, Home: "far", Term: 1,
		ExpiresAt: h.now + 60_000, LeaseID: "lx", Participants: []Participant{local("k")}}})
	if r.Err != nil || r.Decision != TxnRollback || r.Txn.Reason != ReasonPresumedAbort {
		t.Fatalf("prepare after a restore of a transaction the backup does not hold: %+v (%v), want a presumed abort", r.Txn, r.Err)
	}
}
