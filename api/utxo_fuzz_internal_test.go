package api

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// fuzzUTXOEndpoints are the UTXO endpoints with the request type each
// decodes (nil: the GET endpoint, which reads its query).
var fuzzUTXOEndpoints = []struct {
	path string
	req  any
}{
	{"/v1/utxo/create", wire.UTXOCreateRequest{}}, {"/v1/utxo/spend", wire.UTXOSpendRequest{}},
	{"/v1/utxo/unspend", wire.UTXOOutpointsRequest{}}, {"/v1/utxo/freeze", wire.UTXOOutpointsRequest{}},
	{"/v1/utxo/unfreeze", wire.UTXOOutpointsRequest{}}, {"/v1/utxo/reassign", wire.UTXOReassignRequest{}},
	{"/v1/utxo/conflicting", wire.UTXOFlagRequest{}}, {"/v1/utxo/locked", wire.UTXOFlagRequest{}},
	{"/v1/utxo/preserve", wire.UTXOPreserveRequest{}}, {"/v1/utxo/mined", wire.UTXOMinedRequest{}},
	{"/v1/utxo/longest-chain", wire.UTXOLongestChainRequest{}}, {"/v1/utxo/height", wire.UTXOHeightRequest{}},
	{"/v1/utxo/tx", nil},
}

const fuzzUTXOLimit, fuzzUTXOSmallLimit = 4096, 1024

// FuzzUTXORequests sends arbitrary bodies (and, to GET /v1/utxo/tx,
// arbitrary queries) to the UTXO endpoints: nothing panics, no answer is a
// 5xx, a rejection is a 4xx envelope that reached no service (413 only for
// a body over the endpoint's limit), and an accepted body was one JSON
// object within the limit whose request, encoded and decoded again, is
// itself.
func FuzzUTXORequests(f *testing.F) {
	h64 := func(c string) string { return strings.Repeat(c, 64) }
	ep := func(path string) uint8 {
		for i, e := range fuzzUTXOEndpoints {
			if e.path == path {
				return uint8(i)
			}
		}
		f.Fatalf("no endpoint %s", path)
		return 0
	}
	for _, s := range []struct{ path, query, body string }{
		{"/v1/utxo/create", "", `{"txid":"` + h64("a") + `","outputs":[{"vout":0,"utxo_hash":"` + h64("b") + `","satoshis":1}],"mined":{"block_id":1}}`},
		{"/v1/utxo/create", "", `{"txid":"a","outputs":[{"vout":-1,"satoshis":18446744073709551616}]}`},
		{"/v1/utxo/create", "", `{"txid":"` + h64("a") + `","outputs":null,"inputs":[{}],"ttl_seconds":1e3}`},
		{"/v1/utxo/spend", "", `{"spends":[{"txid":"` + h64("a") + `","vout":4294967295,"utxo_hash":"` + h64("b") + `","spending_txid":"` + h64("c") + `","vin":0}]}`},
		{"/v1/utxo/spend", "", `{"spends":[` + strings.Repeat(`{},`, 1300) + `{}]}`},
		{"/v1/utxo/unspend", "", `{"outpoints":[{"txid":"\u0000","vout":0}]}`},
		{"/v1/utxo/freeze", "", `{"outpoints":[]} {"outpoints":[]}`},
		{"/v1/utxo/reassign", "", `{"txid":"x","new_utxo_hash":"y","extra":1}`},
		{"/v1/utxo/conflicting", "", `{"txids":["` + h64("a") + `"],"value":"yes"}`},
		{"/v1/utxo/locked", "", `{"TXIDS":["a"],"Value":true}`},
		{"/v1/utxo/preserve", "", `{"txids":[],"until_height":-1}`},
		{"/v1/utxo/mined", "", `{"txids":["a"],"block_id":1,"block_height":2,"subtree_idx":-2147483649}`},
		{"/v1/utxo/longest-chain", "", `null`},
		{"/v1/utxo/height", "", `{"block_height":4294967296}`},
		{"/v1/utxo/height", "", "\xef\xbb\xbf{}"},
		{"/v1/utxo/height", "", `{"block_height":1}` + strings.Repeat(" ", 2000)},
		{"/v1/utxo/height", "", strings.Repeat("[", 3000)},
		{"/v1/utxo/tx", "txid=" + h64("a"), ""},
		{"/v1/utxo/tx", "txid=" + h64("a") + "&stale=1", ""},
		{"/v1/utxo/tx", "stale=maybe&txid=%zz", ""},
		{"/v1/utxo/tx", "txid=a&txid=b;c", "{}"},
	} {
		f.Add(ep(s.path), s.query, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, endpoint uint8, query string, body []byte) {
		e := fuzzUTXOEndpoints[int(endpoint)%len(fuzzUTXOEndpoints)]
		u := &recordingUTXOs{}
		log := &panicLog{Handler: slog.NewTextHandler(io.Discard, nil)}
		h := New(Options{NodeID: "fuzz", UTXOs: u, Logger: slog.New(log), MaxBodyBytes: fuzzUTXOSmallLimit,
			MaxUTXOBodyBytes: fuzzUTXOLimit})
		method := http.MethodPost
		if e.req == nil {
			method = http.MethodGet
		}
		target := e.path
		if query != "" {
			// What cannot appear in a request line is escaped; the rest,
			// malformed escapes included, is left for the handler to judge.
			var b strings.Builder
			for i := 0; i < len(query); i++ {
				if c := query[i]; c <= ' ' || c >= 0x7f || c == '#' {
					b.WriteString(url.QueryEscape(string(c)))
				} else {
					b.WriteByte(c)
				}
			}
			target += "?" + b.String()
		}
		req, err := http.NewRequest(method, target, bytes.NewReader(body))
		if err != nil {
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if len(log.panics) > 0 {
			t.Fatalf("handler panicked: %v", log.panics)
		}
		if rec.Code != http.StatusOK {
			env := checkEnvelope(t, rec)
			if calls := u.Called(); len(calls) != 0 {
				t.Fatalf("rejected with %d after calling the service: %v", rec.Code, calls)
			}
			limit := int64(fuzzUTXOSmallLimit)
			if e.path == "/v1/utxo/create" || e.path == "/v1/utxo/spend" {
				limit = fuzzUTXOLimit
			}
			if env.Code == errcode.RequestTooLarge.Code && int64(len(body)) <= limit {
				t.Fatalf("%s: %d bytes rejected as too large, limit %d", e.path, len(body), limit)
			}
			return
		}
		reqs := u.Reqs()
		if len(reqs) != 1 {
			t.Fatalf("accepted after %d service calls", len(reqs))
		}
		if e.req == nil {
			read := reqs[0].(utxoRead)
			if want := req.URL.Query().Get("txid"); read.TxID != want {
				t.Fatalf("txid %q read as %q", want, read.TxID)
			}
			return
		}
		if trimmed := bytes.TrimSpace(body); len(trimmed) == 0 || trimmed[0] != '{' || !json.Valid(body) {
			t.Fatalf("%s: accepted %q, which is not one JSON object", e.path, body)
		}
		if reflect.TypeOf(reqs[0]) != reflect.TypeOf(e.req) {
			t.Fatalf("%s: the service got a %T", e.path, reqs[0])
		}
		raw, err := json.Marshal(reqs[0])
		if err != nil {
			t.Fatalf("%s: the request does not encode: %v", e.path, err)
		}
		again := reflect.New(reflect.TypeOf(e.req))
		if err := decodeStrict(raw, again.Interface(), "request"); err != nil {
			t.Fatalf("%s: %s does not decode: %v", e.path, raw, err)
		}
		if raw2, _ := json.Marshal(again.Interface()); !bytes.Equal(raw, raw2) {
			t.Fatalf("%s: %s decodes as %s", e.path, raw, raw2)
		}
	})
}
