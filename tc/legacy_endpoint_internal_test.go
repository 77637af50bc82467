package tc

import (
	"context"
	"slices"
	"testing"

	"github.com/raftlockd/raftlockd/fsm"
)

// An endpoint recorded with its scheme's default port, as servers did
// before endpoints were normalized without it, is the endpoint without it:
// unregistering or registering it again drops the old spelling, which no
// request can name any more.
func TestAnEndpointRecordedWithItsDefaultPortCanBeUnregistered(t *testing.T) {
	c, _ := countingCoordinator(t)
	ctx := context.Background()
	for _, ep := range []string{"https://b2:443", "http://b3:80"} {
		legacy := fsm.RMRegisterCmd{Backend: "b", Endpoint: ep}
		if _, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRMRegister, RMRegister: &legacy}); err != nil {
			t.Fatal(err)
		}
	}
	endpoints := func() []string {
		t.Helper()
		_, all, err := c.registry(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return all["b"].Endpoints
	}
	if got := endpoints(); !slices.Contains(got, "https://b2:443") || !slices.Contains(got, "http://b3:80") {
		t.Fatalf("b's endpoints before: %v", got)
	}
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b2", Remove: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Register(ctx, fsm.RMRegisterCmd{Backend: "b", Endpoint: "http://b3"}); err != nil {
		t.Fatal(err)
	}
	if got := endpoints(); !slices.Equal(got, []string{"http://b3", "https://b1"}) {
		t.Fatalf("b's endpoints: %v, want [http://b3 https://b1]", got)
	}
}

// A removal another island passes on that is older than the registration
// recorded with the default port does not drop that registration: last
// writer wins per endpoint, whichever way it is spelled.
func TestAnOlderRemovalPassedOnKeepsAnEndpointRecordedWithItsDefaultPort(t *testing.T) {
	c, _ := countingCoordinator(t)
	ctx := context.Background()
	legacy := fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b2:443"}
	if _, err := c.store.Propose(ctx, &fsm.Command{Op: fsm.OpRMRegister, RMRegister: &legacy}); err != nil {
		t.Fatal(err)
	}
	_, all, err := c.registry(ctx)
	if err != nil {
		t.Fatal(err)
	}
	at, _, _ := all["b"].ChangedAt("https://b2:443")
	stale := fsm.RMRegisterCmd{Backend: "b", Endpoint: "https://b2", Remove: true, PassedOn: true, ChangedAt: at - 1}
	if _, err := c.Register(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if _, all, err = c.registry(ctx); err != nil {
		t.Fatal(err)
	}
	if got := all["b"].Endpoints; !slices.Contains(got, "https://b2:443") && !slices.Contains(got, "https://b2") {
		t.Fatalf("b's endpoints after a removal older than its registration: %v", got)
	}
}
