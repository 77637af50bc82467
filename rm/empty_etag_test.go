package rm

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/fsm"
)

// An update or removal conditioned on the empty ETag (X-If-State-ETag: "")
// is refused with 503 unavailable, and nothing is proposed, while the
// island's rules do not check that condition yet (a cluster founded a
// moment ago, or one being upgraded): applied under them, it would
// overwrite a document it asked not to exist. Once the rules check it, it
// is checked.
func TestAnEmptyETagConditionWaitsForTheRulesThatCheckIt(t *testing.T) {
	st, k, l := keysHolding(t)
	ctx := context.Background()
	ref := LeaseRef{Key: "k", LeaseID: l.LeaseID, TxnID: l.TxnID, Token: l.Token}
	if _, err := k.Update(ctx, ref, Conditions{}, body(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	var proposed int
	st.refuse = func(*fsm.Command) error { proposed++; return nil }
	for _, write := range []func() error{
		func() error { _, err := k.Update(ctx, ref, Conditions{IfETag: `""`}, body(`{"n":2}`)); return err },
		func() error { _, err := k.Remove(ctx, ref, Conditions{IfETag: `""`}); return err },
	} {
		var e *errcode.Error
		if err := write(); !errors.As(err, &e) || e.Code != errcode.Unavailable.Code || e.RetryAfter == 0 {
			t.Fatalf("empty ETag condition under rules that do not check it: %v, want unavailable with a retry hint", err)
		}
	}
	if proposed != 0 {
		t.Fatalf("%d commands proposed for refused writes", proposed)
	}
	st.refuse = nil
	if _, err := st.Propose(ctx, &fsm.Command{Op: fsm.OpSweep, Sweep: &fsm.SweepCmd{Limit: 1, Format: fsm.EntryFormat}}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Update(ctx, ref, Conditions{IfETag: `""`}, body(`{"n":2}`)); !errors.Is(err, errcode.ETagMismatch) {
		t.Fatalf("empty ETag condition over a staged document: %v, want etag_mismatch", err)
	}
}

func body(doc string) Body { return Body{R: strings.NewReader(doc), ExpectedBytes: -1} }
