package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/wire"
)

// A registry change another island passes on is dated by its original
// time; one dated far ahead of this server's clock (or before 1970) is
// refused, since it would win over every later change of the endpoint and
// a registration could never be undone.
func TestARegistryChangeDatedFarAheadIsRefused(t *testing.T) {
	e := newEnv(t).operator()
	change := func(ep string, at time.Time, remove bool) resp {
		path := "/v1/tc/rm/register"
		if remove {
			path = "/v1/tc/rm/unregister"
		}
		return e.post(path, nil, wire.TCRMRegisterRequest{BackendHash: "island-b", Endpoint: ep, PassedOn: true, ChangedAtUnixMs: at.UnixMilli()})
	}
	wantErr(t, change("https://127.0.0.1:7001", time.Now().Add(30*24*time.Hour), false), http.StatusBadRequest, "invalid_params")
	wantErr(t, change("https://127.0.0.1:7001", time.UnixMilli(-5), false), http.StatusBadRequest, "invalid_params")
	// A time within the islands' clock difference is taken, and so is an
	// unregister after it.
	if r := change("https://127.0.0.1:7002", time.Now().Add(time.Hour), false); r.status != http.StatusOK {
		t.Fatalf("register dated an hour ahead: %d %s", r.status, r.body)
	}
	if r := change("https://127.0.0.1:7002", time.Now().Add(2*time.Hour), true); r.status != http.StatusOK {
		t.Fatalf("unregister: %d %s", r.status, r.body)
	}
	list := e.do(http.MethodGet, "/v1/tc/rm/list", nil, "")
	if list.status != http.StatusOK || strings.Contains(string(list.body), "127.0.0.1:700") {
		t.Fatalf("registry after the changes: %d %s, want neither endpoint", list.status, list.body)
	}
}
