package tc_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

func shortRetention(cfg *config.Server) { cfg.TxnRetention = time.Second }

// forgotten waits until is rolled txn back when its lease expired and then
// forgot it, once its decision retention passed.
func forgotten(t *testing.T, is *island, txn string) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, is.name+" to roll the transaction back as expired", func() bool {
		r := is.record(txn)
		return r != nil && r.State == fsm.TxnRollback && r.Reason == fsm.ReasonExpired
	})
	testutil.WaitFor(t, 10*time.Second, is.name+" to forget the transaction", func() bool { return is.record(txn) == nil })
}

func acquireTTL(t *testing.T, c *client.Client, key, txn string, ttl int64) *client.Lease {
	t.Helper()
	l, err := c.Acquire(context.Background(), wire.AcquireRequest{Key: key, Owner: "me", TTLSeconds: ttl, BlockSecs: -1, TxnID: txn})
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return l
}

// An island that rolled a transaction back when its lease there expired,
// and forgot it since, does not lock the key again for the transaction:
// the commit through the home island, while the transaction's lease on the
// other island is still alive, is rolled back on both islands, whether the
// island that forgot it is another island (its prepare votes rollback) or
// the home island itself.
func TestACommitNamingAnIslandThatForgotTheTransactionRollsBack(t *testing.T) {
	for _, forgetful := range []string{"b", "a"} {
		t.Run("forgotten on "+forgetful, func(t *testing.T) {
			a, b := startIsland(t, "a", shortRetention), startIsland(t, "b", shortRetention)
			register(t, a, b)
			forgets, keeps := b, a
			if forgetful == "a" {
				forgets, keeps = a, b
			}
			txn := xid.New().String()
			stage(t, acquireTTL(t, keeps.client(), "kept", txn, 60), `{"v":1}`)
			stage(t, acquireTTL(t, forgets.client(), "forgotten", txn, 1), `{"v":1}`)
			forgotten(t, forgets, txn)
			out, err := a.client().TxnDecide(context.Background(), wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
				Participants: []wire.TxnParticipant{part("kept", keeps), part("forgotten", forgets)}})
			if err == nil {
				t.Errorf("commit answered %+v", out)
			} else {
				wantCode(t, err, http.StatusConflict, "txn_rolled_back")
			}
			if got := publicDoc(t, keeps.client(), "kept"); got != "" {
				t.Errorf("kept on %s: %q, committed while %s had rolled the transaction back", keeps.name, got, forgets.name)
			}
			for _, is := range []*island{a, b} {
				if r := is.record(txn); r == nil || r.State != fsm.TxnRollback {
					t.Errorf("%s's record: %+v", is.name, r)
				}
			}
			clean(t, a, b)
		})
	}
}

// A transaction committed naming only some of its islands, and then named
// with the rest, is not reported committed when one of those had rolled
// its part back before it was told the commit (its lease there expired),
// whether that island still has the rollback on record or forgot it since:
// the commit answers 409 txn_outcome_mixed, again when it is repeated, and
// the island keeps its rollback.
func TestACommitThatReachesAnIslandThatRolledBackSaysSo(t *testing.T) {
	for _, forgets := range []bool{false, true} {
		t.Run(map[bool]string{false: "rolled back", true: "forgotten"}[forgets], func(t *testing.T) {
			a := startIsland(t, "a", shortRetention)
			var b *island
			if forgets {
				b = startIsland(t, "b", shortRetention)
			} else {
				b = startIsland(t, "b")
			}
			register(t, a, b)
			txn := xid.New().String()
			stage(t, acquireTTL(t, a.client(), "kept", txn, 60), `{"v":1}`)
			stage(t, acquireTTL(t, b.client(), "gone", txn, 1), `{"v":1}`)
			if forgets {
				forgotten(t, b, txn)
			} else {
				testutil.WaitFor(t, 10*time.Second, "b to roll the transaction back as expired", func() bool {
					r := b.record(txn)
					return r != nil && r.State == fsm.TxnRollback
				})
			}
			ctx := context.Background()
			if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
				Participants: []wire.TxnParticipant{part("kept", a)}}); err != nil {
				t.Fatalf("commit on a: %v", err)
			}
			for i := range 2 {
				out, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit,
					Participants: []wire.TxnParticipant{part("kept", a), part("gone", b)}})
				if err == nil {
					t.Fatalf("commit naming b (%d): answered %+v while b rolled the transaction back", i, out)
				}
				wantCode(t, err, http.StatusConflict, "txn_outcome_mixed")
			}
			if r := b.record(txn); r == nil || r.State != fsm.TxnRollback {
				t.Errorf("b's record: %+v", r)
			}
			if got := publicDoc(t, b.client(), "gone"); got != "" {
				t.Errorf("gone on b: %q", got)
			}
		})
	}
}
