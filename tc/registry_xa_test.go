package tc_test

import (
	"context"
	"testing"
	"time"

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
