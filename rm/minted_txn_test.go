package rm

import (
	"testing"
	"time"

	"github.com/rs/xid"
)

// The transaction an acquire without one is given is dated by the
// server's clock as its peers corrected it, which the state machine
// judges a forgotten transaction by, not by its own wall clock.
func TestAnAcquiresTransactionIsDatedByTheServersCorrectedClock(t *testing.T) {
	st, k, l := keysHolding(t)
	id, err := xid.FromString(l.TxnID)
	if err != nil {
		t.Fatalf("txn_id %q: %v", l.TxnID, err)
	}
	if want := k.clock.Now().Truncate(time.Second); !id.Time().Equal(want) {
		t.Fatalf("transaction %s is dated %v, want the server's clock's %v (the store's at %d ms)", l.TxnID, id.Time(), want, st.now)
	}
}
