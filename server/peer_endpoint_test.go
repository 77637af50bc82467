package server_test

import (
	"errors"
	"testing"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// An island that uses mTLS registers other islands only at https
// endpoints: it would call an http:// one with no certificate checked.
// Removing such an entry (recorded by an older build) stays possible.
func TestAnIslandIsRegisteredOnlyAtAnHTTPSEndpoint(t *testing.T) {
	srv := testutil.StartServer(t, testutil.Config(t, t.TempDir()))
	admin := testutil.OperatorClient(t, srv.URL(), client.WithRetry(0))
	ctx := t.Context()
	_, err := admin.RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "island-x", Endpoint: "http://127.0.0.1:9"}, false)
	if !errors.Is(err, errcode.InvalidEndpoint) {
		t.Fatalf("register an http:// endpoint: %v, want %s", err, errcode.InvalidEndpoint.Code)
	}
	if _, err := admin.RMRegister(ctx, wire.TCRMRegisterRequest{BackendHash: "island-x", Endpoint: "http://127.0.0.1:9"}, true); err != nil {
		t.Fatalf("unregister an http:// endpoint: %v", err)
	}
	list, err := admin.RMList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range list.Backends {
		if b.BackendHash == "island-x" && len(b.Endpoints) != 0 {
			t.Fatalf("island-x was registered: %+v", b)
		}
	}
}
