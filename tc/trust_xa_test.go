package tc_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/wire"
)

// A CA taken off an island's trust list is no longer trusted by the
// island's calls to other islands, over connections opened while it was
// trusted too: a prepare for an island of that CA finds it unreachable and
// prepares nothing there.
func TestAnIslandWhoseCAIsNoLongerTrustedIsNotCalled(t *testing.T) {
	caB, err := auth.NewCA(auth.IssueOptions{Name: "island b CA"})
	if err != nil {
		t.Fatal(err)
	}
	a, b := startIsland(t, "a"), startIslandOf(t, "b", caB)
	trust(t, a, b)
	trust(t, b, a)
	register(t, a, b)
	ctx := context.Background()
	// A transaction over both islands: a's node calls b.
	txn := xid.New().String()
	lb := acquire(t, b.client(), "kb", txn, "w")
	stage(t, lb, `{"v":1}`)
	if out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
		Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil || out.State != wire.TxnStateCommit {
		t.Fatalf("commit while b's CA is trusted: %+v %v", out, err)
	}
	if _, err := a.client().Untrust(ctx, auth.Fingerprint(caB.Cert)); err != nil {
		t.Fatal(err)
	}
	txn2 := xid.New().String()
	_, err = a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn2, State: wire.TxnStatePending, Owner: "w",
		Participants: []wire.TxnParticipant{part("kb2", b)}})
	wantCode(t, err, http.StatusServiceUnavailable, "txn_island_unreachable")
	if r := b.record(txn2); r != nil {
		t.Fatalf("a prepared a transaction on an island whose CA it no longer trusts: %+v", r)
	}
}
