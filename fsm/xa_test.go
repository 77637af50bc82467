package fsm

import (
	"bytes"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
)

func decideCmd(txn, state string, ps ...Participant) *Command {
	return &Command{Op: OpTxnDecide, Decide: &DecideCmd{TxnID: txn, State: state, Participants: ps, LeaseID: "lock-" + txn}}
}

func local(key string) Participant { return Participant{Namespace: "default", Key: key} }
func remote(key string) Participant {
	return Participant{Namespace: "default", Key: key, Backend: "far"}
}

func txnOf(h *harness, id string) *TxnRecord {
	var t *TxnRecord
	_ = h.f.View(func(v *View) error { t = v.Txn(id); return nil })
	return t
}

// A pending decision locks the free local participants for the
// transaction; a participant held by another transaction makes the same
// entry record the rollback, with the holder, instead.
func TestPendingDecisionLocksOrRecordsTheConflict(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	held := mustLease(t, h.one(acq("held", "t-other", "r1", 60_000, 0)))

	c := decideCmd("t1", TxnPending, local("a"), remote("b"), Participant{Namespace: "default", Key: "c", Backend: "here"})
	c.Decide.ExpiresAt, c.Decide.Owner = h.now+10_000, "w"
	r := h.one(c)
	if r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("pending: %+v", r)
	}
	for _, k := range []string{"a", "c"} {
		var rec KeyRecord
		_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", k); return nil })
		if rec.Lease == nil || rec.Lease.TxnID != "t1" || rec.Lease.Owner != "w" || rec.Lease.ExpiresAt != h.now+10_000 {
			t.Fatalf("%s must be locked for t1 until the expiry: %+v", k, rec.Lease)
		}
	}
	if tr := txnOf(h, "t1"); len(tr.Remotes()) != 1 || tr.Remotes()[0] != "far" || tr.TCTerm != 1 {
		t.Fatalf("record: %+v", tr)
	}

	c = decideCmd("t2", TxnPending, local("free"), local("held"))
	c.Decide.ExpiresAt = h.now + 10_000
	r = h.one(c)
	if r.Err != nil || r.Decision != TxnRollback || r.Txn.Reason != ReasonLockConflict || r.Txn.Detail != "LOCKED:"+held.Owner {
		t.Fatalf("conflict: %+v %+v", r, r.Txn)
	}
	var rec KeyRecord
	_ = h.f.View(func(v *View) error { rec, _ = v.Key("default", "free"); return nil })
	if rec.Lease != nil {
		t.Fatalf("nothing may be locked by a transaction that failed: %+v", rec.Lease)
	}
	// Final: any later request answers from the record.
	wantCode(t, h.one(decideCmd("t2", TxnCommit)), errcode.TxnRolledBack)
}

// Committing needs every other island prepared; a commit records the
// decision with the entry's term and applies it locally in the same entry,
// and the decision waits for fan-out until every island acknowledged it.
func TestCommitNeedsPreparedIslandsAndWaitsForAcks(t *testing.T) {
	h := openHarness(t, t.TempDir())
	l := mustLease(t, h.one(acq("a", "t1", "r1", 60_000, 0)))
	h.one(update(l, `{"v":1}`))
	wantCode(t, h.one(decideCmd("t1", TxnCommit, local("a"), remote("b"))), errcode.TxnPending)

	c := decideCmd("t1", TxnCommit, remote("b"))
	c.Decide.Prepared = []string{"far"}
	r := h.one(c)
	if r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("commit: %+v", r)
	}
	if d := h.publicDoc("a"); string(d.Bytes) != `{"v":1}` {
		t.Fatalf("the local participant commits in the deciding entry: %q", d.Bytes)
	}
	var due []string
	due = nil
	_ = h.f.View(func(v *View) error {
		v.FanoutEach(func(id string) bool { due = append(due, id); return true })
		return nil
	})
	if len(due) != 1 || due[0] != "t1" {
		t.Fatalf("fan-out due: %v", due)
	}
	if r := h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: "t1", Backends: []string{"far", "unknown"}}}); r.Err != nil || len(r.Txn.Acked) != 1 {
		t.Fatalf("ack: %+v", r)
	}
	due = nil
	_ = h.f.View(func(v *View) error {
		v.FanoutEach(func(id string) bool { due = append(due, id); return true })
		return nil
	})
	if len(due) != 0 {
		t.Fatalf("an acknowledged decision is still due: %v", due)
	}
}

// A resource manager refuses a coordinator term older than one it saw,
// applies a decision once, and keeps prepared keys past their lease.
func TestResourceManagerTermsAndPreparedLocks(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	l := mustLease(t, h.one(acq("a", "t1", "r1", 1_000, 0)))
	h.one(update(l, `{"v":1}`))
	prep := &Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "t1", Home: "home", Term: 5, ExpiresAt: h.now + 60_000,
		LeaseID: "p1", Participants: []Participant{local("a")}}}
	if r := h.one(prep); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("prepare: %+v", r)
	}
	// The prepare holds the key until its expiry, past the lease's own.
	h.now += 2_000
	if r := h.one(sweep()); r.Sweep.Expired != 0 {
		t.Fatalf("the prepared key's lease expired at its own end: %+v", r.Sweep)
	}
	// At the prepare's expiry the participant is not rolled back, it waits
	// for its coordinator (in doubt).
	h.now += 60_000
	h.one(sweep())
	if tr := txnOf(h, "t1"); tr.State != TxnPending || tr.DoubtAt == 0 || tr.DoubtAt > h.now {
		t.Fatalf("after the lease expired: %+v", tr)
	}
	var doubt []string
	_ = h.f.View(func(v *View) error {
		v.DoubtEach(h.now, func(id string) bool { doubt = append(doubt, id); return true })
		return nil
	})
	if len(doubt) != 1 {
		t.Fatalf("in doubt: %v", doubt)
	}
	apply := func(term uint64, state string) *Result {
		return h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "t1", State: state, Home: "home", Term: term}})
	}
	wantCode(t, apply(4, TxnCommit), errcode.TCTermStale)
	if r := apply(5, TxnCommit); r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("apply: %+v", r)
	}
	if d := h.publicDoc("a"); string(d.Bytes) != `{"v":1}` {
		t.Fatalf("the prepared write commits: %q", d.Bytes)
	}
	// A repeat changes nothing, whatever its term: an in-doubt island may
	// ask the coordinator after newer terms were seen.
	before := h.hashWithoutMeta()
	if r := apply(4, TxnCommit); r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("repeat: %+v", r)
	}
	if string(h.hashWithoutMeta()) != string(before) {
		t.Fatal("a repeated apply changed the state")
	}
	wantCode(t, apply(6, TxnRollback), errcode.TxnCommitted)
	// A transaction this island coordinates cannot be taken over by
	// another island's prepare.
	home := decideCmd("t5", TxnPending, remote("x"))
	home.Decide.ExpiresAt = h.now + 10_000
	h.one(home)
	wantCode(t, h.one(&Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "t5", Home: "home", Term: 9,
		ExpiresAt: h.now + 10_000, LeaseID: "p5", Participants: []Participant{local("y")}}}), errcode.TxnBackendMismatch)
	// A remote participant named like a local key never counts as local.
	h.one(acq("b", "t9", "r9", 1_000, 0))
	h.now += 2_000
	c := decideCmd("t10", TxnCommit, remote("b"))
	c.Decide.Prepared = []string{"far"}
	if r := h.one(c); r.Decision != TxnCommit {
		t.Fatalf("another island's b is not this island's expired b: %+v", r)
	}
}

func fanoutDue(h *harness) (due []string) {
	_ = h.f.View(func(v *View) error {
		v.FanoutEach(func(id string) bool { due = append(due, id); return true })
		return nil
	})
	return due
}

// committedAndApplied records t1's commit, with the far island prepared,
// and far's ack of it.
func committedAndApplied(t *testing.T, h *harness) {
	t.Helper()
	c := decideCmd("t1", TxnCommit, remote("b"))
	c.Decide.Prepared = []string{"far"}
	if r := h.one(c); r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("commit: %+v", r)
	}
	if r := h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: "t1", Backends: []string{"far"}}}); r.Err != nil {
		t.Fatalf("ack: %+v", r)
	}
}

// As in lockd, a decide merges its participants with the record even once
// the transaction is decided: another island's keys the record did not name
// join it, and the decision is queued for fan-out to that island until it
// applies it. The record's retention starts again from that island's ack.
func TestADecideAddsIslandsToADecidedTransaction(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(adoptRules())
	committedAndApplied(t, h)
	if due := fanoutDue(h); len(due) != 0 {
		t.Fatalf("due before: %v", due)
	}
	h.now += 30_000
	other := Participant{Namespace: "default", Key: "c", Backend: "other"}
	r := h.one(decideCmd("t1", TxnCommit, remote("b"), other, local("late")))
	if r.Err != nil || r.Decision != TxnCommit {
		t.Fatalf("decide again: %+v", r)
	}
	if got := r.Txn.Participants; len(got) != 2 || got[0] != remote("b") || got[1] != other {
		t.Fatalf("participants %+v: another island's key joins, this island's adds nothing", got)
	}
	if tr := txnOf(h, "t1"); len(tr.Unacked()) != 1 || tr.Unacked()[0] != "other" || tr.ReopenedAt != h.now {
		t.Fatalf("record: %+v", tr)
	}
	if due := fanoutDue(h); len(due) != 1 || due[0] != "t1" {
		t.Fatalf("fan-out due: %v", due)
	}
	wantCode(t, h.one(decideCmd("t1", TxnRollback, Participant{Namespace: "default", Key: "d", Backend: "third"})),
		errcode.TxnCommitted)

	// The retention counted from far's ack has passed: the record stays
	// while the other island has not applied the decision, and after.
	h.now += 40_000
	if r := h.one(sweep()); r.Sweep.Forgotten != 0 || txnOf(h, "t1") == nil {
		t.Fatalf("a record waiting for an island was forgotten: %+v", r.Sweep)
	}
	h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: "t1", Backends: []string{"other"}}})
	if due := fanoutDue(h); len(due) != 0 {
		t.Fatalf("due after every island applied it: %v", due)
	}
	h.now += 59_000
	if h.one(sweep()); txnOf(h, "t1") == nil {
		t.Fatal("forgotten before the retention from the last ack")
	}
	h.now += 2_000
	if r := h.one(sweep()); r.Sweep.Forgotten != 1 || txnOf(h, "t1") != nil {
		t.Fatalf("kept past the retention: %+v", r.Sweep)
	}
}

// Until the island follows format 7, a decide on a decided transaction
// changes nothing, as older builds apply it.
func TestADecidedTransactionKeepsItsIslandsBeforeFormat7(t *testing.T) {
	h := openHarness(t, t.TempDir())
	committedAndApplied(t, h)
	before := h.hashWithoutMeta()
	r := h.one(decideCmd("t1", TxnCommit, Participant{Namespace: "default", Key: "c", Backend: "other"}))
	if r.Err != nil || r.Decision != TxnCommit || len(r.Txn.Participants) != 1 {
		t.Fatalf("decide again: %+v", r)
	}
	if after := h.hashWithoutMeta(); !bytes.Equal(before, after) || len(fanoutDue(h)) != 0 {
		t.Fatal("the state changed")
	}
}

// An island added and acknowledged before the first retention ended moves
// the record's end to the retention after that acknowledgement.
func TestAnAddedIslandsAckStartsTheRetentionAgain(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(adoptRules())
	committedAndApplied(t, h)
	h.now += 30_000
	h.one(decideCmd("t1", TxnCommit, Participant{Namespace: "default", Key: "c", Backend: "other"}))
	h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: "t1", Backends: []string{"other"}}})
	h.now += 31_000 // past the retention from far's ack, not from other's
	if h.one(sweep()); txnOf(h, "t1") == nil {
		t.Fatal("forgotten by the retention of the first acknowledgement")
	}
	h.now += 30_000
	if r := h.one(sweep()); r.Sweep.Forgotten != 1 || txnOf(h, "t1") != nil {
		t.Fatalf("kept past the retention: %+v", r.Sweep)
	}
}

// An island added in the same millisecond as the acknowledgement that
// completed the decision, and acknowledged later, still starts the
// retention again from its own acknowledgement once the island follows
// format 8 (the record notes when it was applied everywhere); under format
// 7 the record is forgotten one retention after the first, as builds of
// that format do.
func TestAnIslandAddedInTheSameMillisecondStartsTheRetentionAgain(t *testing.T) {
	for _, rules := range []int{formatV7, formatV8} {
		h := openHarness(t, t.TempDir())
		h.one(&Command{Op: OpSweep, Sweep: &SweepCmd{Limit: 1, Format: rules}})
		committedAndApplied(t, h)
		h.one(decideCmd("t1", TxnCommit, Participant{Namespace: "default", Key: "c", Backend: "other"}))
		h.now += 10_000
		h.one(&Command{Op: OpTxnAck, Ack: &AckCmd{TxnID: "t1", Backends: []string{"other"}}})
		h.now += 51_000 // past the retention from far's ack, not from other's
		h.one(sweep())
		if kept := txnOf(h, "t1") != nil; kept != (rules >= formatV8) {
			t.Fatalf("rules %d: kept %v one retention after the first acknowledgement", rules, kept)
		}
		h.now += 10_000
		if h.one(sweep()); txnOf(h, "t1") != nil {
			t.Fatalf("rules %d: kept past the retention from the last acknowledgement", rules)
		}
	}
}

// A prepared key held past its lease's expiry, waiting for its
// coordinator, still counts as a lease held until the decision frees it.
func TestCountsKeepPreparedLeasesPastTheirExpiry(t *testing.T) {
	h := openHarness(t, t.TempDir())
	h.one(&Command{Op: OpSetBackend, SetBackend: &SetBackendCmd{Hash: "here"}})
	mustLease(t, h.one(acq("plain", "t0", "r0", 600_000, 0)))
	prep := &Command{Op: OpTxnPrepare, Prepare: &PrepareCmd{TxnID: "t1", Home: "home", Term: 5, ExpiresAt: h.now + 10_000,
		LeaseID: "p1", Participants: []Participant{local("a"), local("b")}}}
	if r := h.one(prep); r.Err != nil || r.Decision != TxnPending {
		t.Fatalf("prepare: %+v", r)
	}
	leases := func() int {
		var n int
		_ = h.f.View(func(v *View) error { n, _ = v.Counts(); return nil })
		return n
	}
	if n := leases(); n != 3 {
		t.Fatalf("leases held after the prepare: %d, want 3", n)
	}
	h.now += 20_000
	h.one(sweep())
	if tr := txnOf(h, "t1"); tr.State != TxnPending || tr.DoubtAt == 0 || tr.DoubtAt > h.now {
		t.Fatalf("the prepared transaction must be in doubt: %+v", tr)
	}
	if n := leases(); n != 3 {
		t.Fatalf("leases held while the prepared keys wait for their coordinator: %d, want 3", n)
	}
	r := h.one(&Command{Op: OpTxnRMApply, RMApply: &RMApplyCmd{TxnID: "t1", State: TxnRollback, Home: "home", Term: 5}})
	if r.Err != nil {
		t.Fatalf("rollback: %+v", r)
	}
	if n := leases(); n != 1 {
		t.Fatalf("leases held after the decision: %d, want 1", n)
	}
}
