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
