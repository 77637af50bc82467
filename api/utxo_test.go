package api_test

import (
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/api"
	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/rm"
	"github.com/raftlockd/raftlockd/wire"
)

func hex64(c string) string { return strings.Repeat(c, 64) }

// utxoPosts are the POST endpoints, each with the service call it reaches
// and a valid body.
var utxoPosts = []struct{ path, call, body string }{
	{"/v1/utxo/create", "create", `{"txid":"` + hex64("a") + `","outputs":[{"vout":0,"utxo_hash":"` + hex64("b") + `","satoshis":5}]}`},
	{"/v1/utxo/spend", "spend", `{"spends":[{"txid":"` + hex64("a") + `","vout":0,"utxo_hash":"` + hex64("b") + `","spending_txid":"` + hex64("c") + `","vin":0}]}`},
	{"/v1/utxo/unspend", "unspend", `{"outpoints":[{"txid":"` + hex64("a") + `","vout":0}]}`},
	{"/v1/utxo/freeze", "freeze", `{"outpoints":[{"txid":"` + hex64("a") + `","vout":0,"utxo_hash":"` + hex64("b") + `"}]}`},
	{"/v1/utxo/unfreeze", "unfreeze", `{"outpoints":[{"txid":"` + hex64("a") + `","vout":0}]}`},
	{"/v1/utxo/reassign", "reassign", `{"txid":"` + hex64("a") + `","vout":0,"utxo_hash":"` + hex64("b") + `","new_utxo_hash":"` + hex64("d") + `"}`},
	{"/v1/utxo/conflicting", "conflicting", `{"txids":["` + hex64("a") + `"],"value":true}`},
	{"/v1/utxo/locked", "locked", `{"txids":["` + hex64("a") + `"],"value":false}`},
	{"/v1/utxo/preserve", "preserve", `{"txids":["` + hex64("a") + `"],"until_height":10}`},
	{"/v1/utxo/mined", "mined", `{"txids":["` + hex64("a") + `"],"block_id":1,"block_height":2,"subtree_idx":0,"on_longest_chain":true}`},
	{"/v1/utxo/longest-chain", "longest-chain", `{"txids":["` + hex64("a") + `"],"on_longest_chain":true}`},
	{"/v1/utxo/height", "height", `{"block_height":7}`},
}

// utxoHandler is the API of a node that serves only the fake UTXO service,
// with small body limits.
func utxoHandler(u *api.RecordingUTXOs, authn api.Authenticator) http.Handler {
	return api.New(api.Options{NodeID: "n1", UTXOs: u, Auth: authn, MaxBodyBytes: 1024, MaxUTXOBodyBytes: 4096,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func serve(h http.Handler, method, target, body string) resp {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, rd)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return resp{status: rec.Code, header: rec.Header(), body: rec.Body.Bytes()}
}

// padded is body with spaces inserted after its opening brace, n bytes
// long: still the same JSON object.
func padded(body string, n int) string {
	return "{" + strings.Repeat(" ", n-len(body)) + body[1:]
}

func TestUTXOBadInputNeverReachesTheService(t *testing.T) {
	for _, ep := range utxoPosts {
		t.Run(strings.TrimPrefix(ep.path, "/v1/utxo/"), func(t *testing.T) {
			u := api.NewRecordingUTXOs()
			h := utxoHandler(u, nil)
			for _, c := range []struct {
				name, method, body string
				status             int
				code               string
			}{
				{"truncated", http.MethodPost, ep.body[:len(ep.body)/2], http.StatusBadRequest, errcode.InvalidBody.Code},
				{"not JSON", http.MethodPost, "txid=" + hex64("a"), http.StatusBadRequest, errcode.InvalidBody.Code},
				{"array", http.MethodPost, "[" + ep.body + "]", http.StatusBadRequest, errcode.InvalidBody.Code},
				{"null", http.MethodPost, "null", http.StatusBadRequest, errcode.InvalidBody.Code},
				{"unknown field", http.MethodPost, `{"nope":1,` + ep.body[1:], http.StatusBadRequest, errcode.InvalidBody.Code},
				{"wrong type", http.MethodPost, `{"txid":7,"txids":7,"spends":7,"outpoints":7,"block_height":"x"}`, http.StatusBadRequest, errcode.InvalidBody.Code},
				{"trailing data", http.MethodPost, ep.body + ` {}`, http.StatusBadRequest, errcode.InvalidBody.Code},
				{"empty", http.MethodPost, "", http.StatusBadRequest, errcode.MissingBody.Code},
				{"blank", http.MethodPost, " \n\t ", http.StatusBadRequest, errcode.MissingBody.Code},
				{"oversize", http.MethodPost, padded(ep.body, 4097), http.StatusRequestEntityTooLarge, errcode.RequestTooLarge.Code},
				{"GET", http.MethodGet, "", http.StatusMethodNotAllowed, errcode.MethodNotAllowed.Code},
				{"PUT", http.MethodPut, ep.body, http.StatusMethodNotAllowed, errcode.MethodNotAllowed.Code},
			} {
				r := serve(h, c.method, ep.path, c.body)
				t.Run(c.name, func(t *testing.T) { wantErr(t, r, c.status, c.code) })
				if c.status == http.StatusMethodNotAllowed && r.header.Get("Allow") != http.MethodPost {
					t.Errorf("%s: Allow %q, want POST", c.name, r.header.Get("Allow"))
				}
			}
			// A required field absent or null is not its zero value.
			txids := `"txids":["` + hex64("a") + `"]`
			for _, body := range map[string][]string{
				"/v1/utxo/height":        {`{}`, `{"block_height":null}`},
				"/v1/utxo/conflicting":   {`{` + txids + `}`, `{` + txids + `,"value":null}`},
				"/v1/utxo/locked":        {`{` + txids + `}`},
				"/v1/utxo/preserve":      {`{` + txids + `}`, `{` + txids + `,"until_height":null}`},
				"/v1/utxo/longest-chain": {`{` + txids + `}`},
				"/v1/utxo/mined": {`{` + txids + `,"block_height":2}`, `{` + txids + `,"block_id":1}`,
					`{` + txids + `,"block_id":1,"block_height":null}`, `{` + txids + `,"unset":true}`},
			}[ep.path] {
				wantErr(t, serve(h, http.MethodPost, ep.path, body), http.StatusBadRequest, errcode.InvalidBody.Code)
			}
			if calls := u.Called(); len(calls) != 0 {
				t.Fatalf("bad input reached the service: %v", calls)
			}
			r := serve(h, http.MethodPost, ep.path, ep.body)
			if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/json" {
				t.Fatalf("valid body: %d %s", r.status, r.body)
			}
			if calls := u.Called(); len(calls) != 1 || calls[0] != ep.call {
				t.Fatalf("valid body reached %v, want [%s]", calls, ep.call)
			}
			if ep.path == "/v1/utxo/mined" {
				// A block being taken off needs no height.
				if r := serve(h, http.MethodPost, ep.path, `{`+txids+`,"block_id":1,"unset":true}`); r.status != http.StatusOK {
					t.Fatalf("unset without a height: %d %s", r.status, r.body)
				}
			}
		})
	}
}

// Create and spend carry whole transactions and batches: their bodies may
// be larger than the other endpoints'.
func TestUTXOBodyLimits(t *testing.T) {
	u := api.NewRecordingUTXOs()
	h := utxoHandler(u, nil)
	for _, ep := range utxoPosts {
		r := serve(h, http.MethodPost, ep.path, padded(ep.body, 2048))
		switch ep.call {
		case "create", "spend":
			if r.status != http.StatusOK {
				t.Errorf("%s: 2048 bytes under a 4096-byte limit: %d %s", ep.path, r.status, r.body)
			}
		default:
			wantErr(t, r, http.StatusRequestEntityTooLarge, errcode.RequestTooLarge.Code)
		}
		r = serve(h, http.MethodPost, ep.path, padded(ep.body, 1024))
		if r.status != http.StatusOK {
			t.Errorf("%s: a body of exactly 1024 bytes: %d %s", ep.path, r.status, r.body)
		}
	}
	if calls := u.Called(); len(calls) != len(utxoPosts)+2 {
		t.Fatalf("calls %v", calls)
	}

	// Without a limit of its own, create takes 32 MiB.
	h = api.New(api.Options{UTXOs: u, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if r := serve(h, http.MethodPost, "/v1/utxo/create", padded(utxoPosts[0].body, 1<<20)); r.status != http.StatusOK {
		t.Fatalf("1 MiB create under the default limit: %d %s", r.status, r.body)
	}
	wantErr(t, serve(h, http.MethodPost, "/v1/utxo/create", padded(utxoPosts[0].body, 32<<20+1)),
		http.StatusRequestEntityTooLarge, errcode.RequestTooLarge.Code)
}

func TestUTXORequestsAndAnswers(t *testing.T) {
	u := api.NewRecordingUTXOs()
	h := utxoHandler(u, nil)

	r := serve(h, http.MethodPost, "/v1/utxo/spend", utxoPosts[1].body)
	var spent wire.UTXOSpendResponse
	r.json(t, &spent)
	if r.status != http.StatusOK || spent.Spent != 1 {
		t.Fatalf("spend: %d %s", r.status, r.body)
	}
	want := wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{{TxID: hex64("a"), UTXOHash: hex64("b"), SpendingTxID: hex64("c")}}}
	if got, ok := u.Reqs()[0].(wire.UTXOSpendRequest); !ok || len(got.Spends) != 1 || got.Spends[0] != want.Spends[0] {
		t.Fatalf("the service got %+v", u.Reqs()[0])
	}

	r = serve(h, http.MethodGet, "/v1/utxo/tx?txid="+hex64("a"), "")
	var tx wire.UTXOTx
	r.json(t, &tx)
	if r.status != http.StatusOK || tx.TxID != hex64("a") || len(tx.Outputs) != 1 || tx.Outputs[0].Satoshis != 5 {
		t.Fatalf("get: %d %s", r.status, r.body)
	}
	serve(h, http.MethodGet, "/v1/utxo/tx?stale=1&txid="+hex64("e"), "")
	for i, want := range []rm.Consistency{rm.Linearizable, rm.Stale} {
		got := u.Reqs()[1+i].(api.UTXORead)
		if got.C != want {
			t.Errorf("get %d: consistency %v, want %v", i, got.C, want)
		}
	}
	n := len(u.Called())
	wantErr(t, serve(h, http.MethodGet, "/v1/utxo/tx?stale=maybe&txid="+hex64("a"), ""), http.StatusBadRequest, errcode.InvalidParams.Code)
	wantErr(t, serve(h, http.MethodPost, "/v1/utxo/tx?txid="+hex64("a"), ""), http.StatusMethodNotAllowed, errcode.MethodNotAllowed.Code)
	if len(u.Called()) != n {
		t.Fatalf("rejected reads reached the service: %v", u.Called())
	}

	// A failed batch answers 409 with every failed item.
	vin := uint32(3)
	u.Fail = &errcode.Error{Code: errcode.UTXOSpendFailed.Code, Detail: "1 of 1 spends failed",
		Spends: []errcode.Item{{Index: 0, Code: wire.UTXOSpent, SpendingTxID: hex64("f"), Vin: &vin}}}
	env := wantErr(t, serve(h, http.MethodPost, "/v1/utxo/spend", utxoPosts[1].body), http.StatusConflict, errcode.UTXOSpendFailed.Code)
	raw, _ := json.Marshal(env["spends"])
	if string(raw) != `[{"code":"SPENT","index":0,"spending_txid":"`+hex64("f")+`","vin":3}]` {
		t.Fatalf("spends in the envelope: %s", raw)
	}
	u.Fail = &errcode.Error{Code: errcode.UTXOUpdateFailed.Code, Outpoints: []errcode.Item{{Index: 1, Code: wire.UTXOAlreadyFrozen}}}
	env = wantErr(t, serve(h, http.MethodPost, "/v1/utxo/freeze", utxoPosts[3].body), http.StatusConflict, errcode.UTXOUpdateFailed.Code)
	if raw, _ := json.Marshal(env["outpoints"]); string(raw) != `[{"code":"ALREADY_FROZEN","index":1}]` {
		t.Fatalf("outpoints in the envelope: %s", raw)
	}
	u.Fail = errcode.TxNotFound.With("no transaction %s", hex64("a"))
	wantErr(t, serve(h, http.MethodGet, "/v1/utxo/tx?txid="+hex64("a"), ""), http.StatusNotFound, errcode.TxNotFound.Code)
}

// identityAuth authenticates every caller as id.
type identityAuth struct{ id auth.Identity }

func (a identityAuth) Check([]*x509.Certificate, bool, time.Time) (auth.Identity, error) {
	return a.id, nil
}

func TestUTXONamespacePermissions(t *testing.T) {
	for _, c := range []struct {
		name        string
		id          auth.Identity
		read, write bool
	}{
		{"every namespace", auth.Identity{Role: auth.RoleClient, Perms: []auth.Perm{{Namespace: "*", Write: true}}}, true, true},
		{"utxo read-write", auth.Identity{Role: auth.RoleClient, Perms: []auth.Perm{{Namespace: wire.UTXONamespace, Write: true}}}, true, true},
		{"utxo read-only", auth.Identity{Role: auth.RoleClient, Perms: []auth.Perm{{Namespace: wire.UTXONamespace}}}, true, false},
		{"another namespace", auth.Identity{Role: auth.RoleClient, Perms: []auth.Perm{{Namespace: "orders", Write: true}}}, false, false},
		{"server", auth.Identity{Role: auth.RoleServer}, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			u := api.NewRecordingUTXOs()
			h := utxoHandler(u, identityAuth{c.id})
			// allowed: a success if the caller may, namespace_forbidden if not.
			allowed := func(may bool, method, target, body string) {
				t.Helper()
				r := serve(h, method, target, body)
				if !may {
					wantErr(t, r, http.StatusForbidden, errcode.NamespaceForbidden.Code)
				} else if r.status != http.StatusOK {
					t.Fatalf("%s %s: %d %s", method, target, r.status, r.body)
				}
			}
			allowed(c.read, http.MethodGet, "/v1/utxo/tx?txid="+hex64("a"), "")
			for _, ep := range utxoPosts {
				allowed(c.write, http.MethodPost, ep.path, ep.body)
			}
			want := 0
			if c.read {
				want++
			}
			if c.write {
				want += len(utxoPosts)
			}
			if calls := u.Called(); len(calls) != want {
				t.Fatalf("%d calls reached the service, want %d: %v", len(calls), want, calls)
			}
		})
	}
	// A certificate of another role is refused before any namespace check.
	u := api.NewRecordingUTXOs()
	r := serve(utxoHandler(u, identityAuth{auth.Identity{Role: auth.RoleTCClient}}), http.MethodPost, utxoPosts[0].path, utxoPosts[0].body)
	wantErr(t, r, http.StatusForbidden, errcode.RoleForbidden.Code)
	if len(u.Called()) != 0 {
		t.Fatalf("a TC client certificate reached the service")
	}
}
