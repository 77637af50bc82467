package tc_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/fsm"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// The registry sync tells an island what it missed through any of its
// endpoints: one that does not answer (a member that is down, listed
// first) does not keep the island from learning a removal made while it
// was down.
func TestARegistryRemovalReachesAnIslandWhoseFirstEndpointIsDown(t *testing.T) {
	a, b := startIsland(t, "a"), startIsland(t, "b")
	register(t, a, b)
	ctx := context.Background()
	// b's endpoints as a knows them: one that does not answer, sorted
	// before b's own.
	dead := wire.TCRMRegisterRequest{BackendHash: b.hash(), Endpoint: "https://127.0.0.1:1"}
	if _, err := a.client().RMRegister(ctx, dead, false); err != nil {
		t.Fatal(err)
	}
	if list, err := a.client().RMList(ctx); err != nil || !hasEndpointFirst(list, b.hash(), dead.Endpoint) {
		t.Fatalf("a's registry: %+v %v", list, err)
	}
	gone := missRemoval(t, a, b)
	b.start()
	testutil.WaitFor(t, 30*time.Second, "the removal to reach b", func() bool {
		return !registryHas(t, b, gone.BackendHash)
	})
}

func hasEndpointFirst(list *wire.TCRMListResponse, backend, endpoint string) bool {
	for _, e := range list.Backends {
		if e.BackendHash == backend {
			return len(e.Endpoints) > 1 && e.Endpoints[0] == endpoint
		}
	}
	return false
}

// registerAt adds endpoint to island backend's entry in is's registry.
func registerAt(t *testing.T, is *island, backend, endpoint string) {
	t.Helper()
	if _, err := is.client().RMRegister(context.Background(), wire.TCRMRegisterRequest{BackendHash: backend, Endpoint: endpoint}, false); err != nil {
		t.Fatalf("register %s for island %s at %s: %v", endpoint, backend, is.name, err)
	}
}

// An endpoint registered for an island that is another island's (an
// operator's mistake, an address handed on) answers that it is not the
// island: the coordinator tries the island's next endpoint, and with none
// left the island counts as unreachable, so the transaction stays pending
// instead of being rolled back as if the island had refused.
func TestAnEndpointOfAnotherIslandDoesNotRollATransactionBack(t *testing.T) {
	a, b, c := startIsland(t, "a"), startIsland(t, "b"), startIsland(t, "c")
	registerAt(t, a, b.hash(), c.url)
	ctx := context.Background()
	txn := xid.New().String()
	prepare := wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending, Owner: "w",
		Participants: []wire.TxnParticipant{part("kb", b)}}
	_, err := a.client().TxnDecide(ctx, prepare)
	wantCode(t, err, http.StatusServiceUnavailable, "txn_island_unreachable")
	if r := a.record(txn); r == nil || r.State != fsm.TxnPending {
		t.Fatalf("a's record after the prepare reached only island c: %+v", r)
	}
	registerAt(t, a, b.hash(), b.url)
	for i := range 4 {
		if out, err := a.client().TxnDecide(ctx, prepare); err != nil || out.State != fsm.TxnPending {
			t.Fatalf("prepare %d with b's own endpoint registered too: %+v %v", i, out, err)
		}
		prepare.TxnID = xid.New().String()
	}
}
