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

// endpointOfCForA starts islands a, b and c, registers a and b with each
// other, and registers c's endpoint for island a at b.
func endpointOfCForA(t *testing.T) (a, b, c *island) {
	t.Helper()
	a, b, c = startIsland(t, "a"), startIsland(t, "b"), startIsland(t, "c")
	register(t, a, b)
	registerAt(t, b, a.hash(), c.url)
	return a, b, c
}

// An island in doubt asks its coordinator's island through the endpoints
// registered for it; one of them serving another island answers that it is
// not the coordinator, instead of presuming the transaction aborted from
// having no record of it, so the island does not roll back what its
// coordinator committed.
func TestAnIslandInDoubtIsNotAnsweredByAnotherIsland(t *testing.T) {
	a, b, c := endpointOfCForA(t)
	ctx := context.Background()
	txn := xid.New().String()
	stage(t, acquire(t, b.client(), "kb", txn, "w"), `{"v":1}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending, Owner: "w",
		Participants: []wire.TxnParticipant{part("kb", b)}, ExpiresAtUnix: time.Now().Add(2 * time.Second).Unix()}); err != nil {
		t.Fatal(err)
	}
	b.stop()
	_, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStateCommit})
	wantCode(t, err, http.StatusBadGateway, "txn_fanout_failed")
	a.stop()
	b.start()
	// Past the pending decision's expiry b asks a's endpoints: a's own
	// does not answer, and c's is another island's.
	testutil.WaitFor(t, 20*time.Second, "b to ask c", func() bool { return requests(t, c, "/v1/txn/replay") > 0 })
	if r := b.record(txn); r == nil || r.State != fsm.TxnPending {
		t.Fatalf("b's record after island c was asked for a's decision: %+v", r)
	}
	a.start()
	testutil.WaitFor(t, 20*time.Second, "b to apply a's commit", func() bool {
		r := b.record(txn)
		return r != nil && r.State == fsm.TxnCommit
	})
	if got := publicDoc(t, b.client(), "kb"); got != `{"v":1}` {
		t.Fatalf("kb after the commit: %q", got)
	}
}

// A release of a participant prepared for another island's coordinator
// asks that island to decide, through the endpoints registered for it; one
// of them serving another island answers that it is not the coordinator,
// instead of recording a decision of its own, so the release does not
// report a commit the coordinator never made.
func TestAReleaseIsNotDecidedByAnotherIsland(t *testing.T) {
	a, b, c := endpointOfCForA(t)
	ctx := context.Background()
	txn := xid.New().String()
	lb := acquire(t, b.client(), "kb", txn, "w")
	stage(t, lb, `{"v":1}`)
	if _, err := a.client().TxnDecide(ctx, wire.TxnDecisionRequest{TxnID: txn, State: wire.TxnStatePending, Owner: "w",
		Participants: []wire.TxnParticipant{part("kb", b)}}); err != nil {
		t.Fatal(err)
	}
	a.stop()
	if err := lb.Release(ctx, false); err == nil {
		t.Fatal("the release answered while the coordinating island was down")
	}
	if r := c.record(txn); r != nil {
		t.Fatalf("island c decided another island's transaction: %+v", r)
	}
}

// An endpoint given with its scheme's default port is the endpoint
// without it: registering https://H.example:443/ lists https://h.example,
// and unregistering https://h.example or https://h.example:443 removes it.
func TestAnEndpointWithItsDefaultPortIsTheSameEndpoint(t *testing.T) {
	a := startIsland(t, "a")
	ctx := context.Background()
	registerAt(t, a, "zz", "https://H.example:443/")
	registerAt(t, a, "zz", "https://g.example")
	list, err := a.client().RMList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.Backends {
		if e.BackendHash == "zz" && (len(e.Endpoints) != 2 || e.Endpoints[0] != "https://g.example" || e.Endpoints[1] != "https://h.example") {
			t.Fatalf("zz's endpoints: %v", e.Endpoints)
		}
	}
	for _, ep := range []string{"https://h.example", "https://g.example:443"} {
		if _, err := a.client().RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "zz", Endpoint: ep}, true); err != nil {
			t.Fatalf("unregister %s: %v", ep, err)
		}
	}
	if registryHas(t, a, "zz") {
		t.Fatal("zz is still registered")
	}
}
