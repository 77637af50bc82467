package fsm

import (
	"slices"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/errcode"
)

// Entry format 14: an island told the commit of a transaction it has no
// record of, naming its participants, by another island's coordinator
// rolls the transaction back (presumed_abort) and refuses the commit
// (txn_rolled_back) when it may have forgotten the transaction, as a
// prepare of it would: the transaction may have held the participants,
// expired and been forgotten, its staged writes gone. Before, the commit
// was recorded and answered, committing nothing here, and a later prepare
// voted commit. A transaction minted since is still recorded committed.
func TestAnIslandRefusesTheCommitOfATransactionItMayHaveForgotten(t *testing.T) {
	for _, rules := range []int{formatV13, formatV14} {
		h := islandHarness(t, rules)
		txn := xid.NewWithTime(time.UnixMilli(h.now)).String()
		l := mustLease(t, h.one(acq("k", txn, "r1", 1_000, 0)))
		if r := h.one(update(l, `{"v":1}`)); r.Err != nil {
			t.Fatal(r.Err)
		}
		h.now += 1_000
		h.one(sweep())
		h.now += 60_000
		h.one(sweep())
		if r := h.txn(txn); r != nil {
			t.Fatalf("rules %d: the transaction is still known: %+v", rules, r)
		}
		apply := func(txn, key string) *Result {
			return h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: txn, State: TxnCommit, Home: "far", Term: 1,
				Participants: []Participant{local(key)}}})
		}
		r := apply(txn, "k")
		if rules < formatV14 {
			if r.Err != nil || r.Decision != TxnCommit {
				t.Fatalf("rules %d: commit of a forgotten transaction: %+v (%v)", rules, r.Txn, r.Err)
			}
		} else {
			if r.Err == nil || r.Err.Code != errcode.TxnRolledBack.Code {
				t.Fatalf("rules %d: commit of a forgotten transaction: %+v (%v), want txn_rolled_back", rules, r.Txn, r.Err)
			}
			if rec := h.txn(txn); rec == nil || rec.State != TxnRollback || rec.Reason != ReasonPresumedAbort || rec.Home != "far" {
				t.Fatalf("rules %d: record after the commit of a forgotten transaction: %+v", rules, rec)
			}
		}
		p := h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: txn, Home: "far", Term: 1,
			ExpiresAt: h.now + 60_000, LeaseID: "lx", Participants: []Participant{local("k")}}})
		if want := map[bool]string{false: TxnCommit, true: TxnRollback}[rules >= formatV14]; p.Decision != want {
			t.Fatalf("rules %d: prepare after the commit: %+v (%v), want %s", rules, p.Txn, p.Err, want)
		}
		if r := apply(xid.NewWithTime(time.UnixMilli(h.now)).String(), "k2"); r.Err != nil || r.Decision != TxnCommit {
			t.Fatalf("rules %d: commit of a new transaction: %+v (%v)", rules, r.Txn, r.Err)
		}
		if got := h.publicDoc("k"); got.Exists {
			t.Fatalf("rules %d: k holds %q", rules, got.Bytes)
		}
		checkInvariants(t, h)
	}
}

// Entry format 14: an acknowledgement notes the islands that had decided
// the transaction the other way (AckCmd.Refused) on the record; before,
// it noted them as having applied the decision alone.
func TestAnAcknowledgementNotesTheIslandsThatRefused(t *testing.T) {
	for _, rules := range []int{formatV13, formatV14} {
		h := islandHarness(t, rules)
		txn := xid.NewWithTime(time.UnixMilli(h.now)).String()
		r := h.one(&Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: txn, State: TxnCommit, Prepared: []string{"b", "c"},
			Participants: []Participant{{Namespace: "default", Key: "kb", Backend: "b"}, {Namespace: "default", Key: "kc", Backend: "c"}}}})
		if r.Err != nil || r.Decision != TxnCommit {
			t.Fatalf("rules %d: commit: %+v (%v)", rules, r.Txn, r.Err)
		}
		r = h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: txn, Backends: []string{"b", "c"}, Refused: []string{"c", "d"}}})
		if r.Err != nil || !slices.Equal(r.Txn.Acked, []string{"b", "c"}) {
			t.Fatalf("rules %d: ack: %+v (%v)", rules, r.Txn, r.Err)
		}
		want := []string(nil)
		if rules >= formatV14 {
			want = []string{"c"}
		}
		if got := h.txn(txn).Refused; !slices.Equal(got, want) {
			t.Fatalf("rules %d: refused %v, want %v", rules, got, want)
		}
	}
}
