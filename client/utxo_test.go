package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/wire"
)

// utxoServer records the requests it gets and answers each with answer.
type utxoServer struct {
	mu     sync.Mutex
	got    []*http.Request
	bodies []string
	answer func(r *http.Request, n int) (int, any)
}

func (s *utxoServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	s.got = append(s.got, r)
	s.bodies = append(s.bodies, string(body))
	n := len(s.got)
	s.mu.Unlock()
	status, v := s.answer(r, n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// request is the nth request (from 0) and its body.
func (s *utxoServer) request(n int) (*http.Request, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.got[n], s.bodies[n]
}

func (s *utxoServer) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

func newUTXOClient(t *testing.T, s *utxoServer, opts ...client.Option) *client.Client {
	t.Helper()
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	c, err := client.New(ts.URL, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func hex64(c string) string { return strings.Repeat(c, 64) }

func TestUTXOCallsReachTheirEndpoints(t *testing.T) {
	s := &utxoServer{answer: func(r *http.Request, _ int) (int, any) {
		switch r.URL.Path {
		case "/v1/utxo/create":
			return http.StatusOK, wire.UTXOCreateResponse{TxID: hex64("a"), Records: 2}
		case "/v1/utxo/spend":
			return http.StatusOK, wire.UTXOSpendResponse{Spent: 1}
		case "/v1/utxo/tx":
			return http.StatusOK, wire.UTXOTx{TxID: r.URL.Query().Get("txid"), TotalOutputs: 2}
		}
		return http.StatusOK, wire.UTXOUpdateResponse{Updated: 3, NotFound: []string{hex64("e")}}
	}}
	c := newUTXOClient(t, s)
	ctx := testCtx(t)
	outpoints := wire.UTXOOutpointsRequest{Outpoints: []wire.UTXOOutpoint{{TxID: hex64("a"), Vout: 1, UTXOHash: hex64("b")}}}
	flag := wire.UTXOFlagRequest{TxIDs: []string{hex64("a")}, Value: true}
	update := func(f func() (*wire.UTXOUpdateResponse, error)) func() (any, error) {
		return func() (any, error) {
			out, err := f()
			if err == nil && (out.Updated != 3 || len(out.NotFound) != 1) {
				t.Errorf("update answer decoded as %+v", out)
			}
			return out, err
		}
	}
	for _, tc := range []struct {
		path string
		req  any
		call func() (any, error)
	}{
		{"/v1/utxo/create", wire.UTXOCreateRequest{TxID: hex64("a"), Outputs: []wire.UTXOOutput{{Vout: 0, UTXOHash: hex64("b"), Satoshis: 7}}},
			func() (any, error) {
				out, err := c.UTXOCreate(ctx, wire.UTXOCreateRequest{TxID: hex64("a"), Outputs: []wire.UTXOOutput{{Vout: 0, UTXOHash: hex64("b"), Satoshis: 7}}})
				if err == nil && (out.TxID != hex64("a") || out.Records != 2) {
					t.Errorf("create answer decoded as %+v", out)
				}
				return out, err
			}},
		{"/v1/utxo/spend", wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{{TxID: hex64("a"), UTXOHash: hex64("b"), SpendingTxID: hex64("c"), Vin: 2}}},
			func() (any, error) {
				out, err := c.UTXOSpend(ctx, wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{{TxID: hex64("a"), UTXOHash: hex64("b"), SpendingTxID: hex64("c"), Vin: 2}}})
				if err == nil && out.Spent != 1 {
					t.Errorf("spend answer decoded as %+v", out)
				}
				return out, err
			}},
		{"/v1/utxo/unspend", outpoints, update(func() (*wire.UTXOUpdateResponse, error) { return c.UTXOUnspend(ctx, outpoints) })},
		{"/v1/utxo/freeze", outpoints, update(func() (*wire.UTXOUpdateResponse, error) { return c.UTXOFreeze(ctx, outpoints) })},
		{"/v1/utxo/unfreeze", outpoints, update(func() (*wire.UTXOUpdateResponse, error) { return c.UTXOUnfreeze(ctx, outpoints) })},
		{"/v1/utxo/reassign", wire.UTXOReassignRequest{TxID: hex64("a"), UTXOHash: hex64("b"), NewUTXOHash: hex64("d")},
			update(func() (*wire.UTXOUpdateResponse, error) {
				return c.UTXOReassign(ctx, wire.UTXOReassignRequest{TxID: hex64("a"), UTXOHash: hex64("b"), NewUTXOHash: hex64("d")})
			})},
		{"/v1/utxo/conflicting", flag, update(func() (*wire.UTXOUpdateResponse, error) { return c.UTXOSetConflicting(ctx, flag) })},
		{"/v1/utxo/locked", flag, update(func() (*wire.UTXOUpdateResponse, error) { return c.UTXOSetLocked(ctx, flag) })},
		{"/v1/utxo/preserve", wire.UTXOPreserveRequest{TxIDs: flag.TxIDs, UntilHeight: 9},
			update(func() (*wire.UTXOUpdateResponse, error) {
				return c.UTXOPreserve(ctx, wire.UTXOPreserveRequest{TxIDs: flag.TxIDs, UntilHeight: 9})
			})},
		{"/v1/utxo/mined", wire.UTXOMinedRequest{TxIDs: flag.TxIDs, BlockID: 4, BlockHeight: 5, SubtreeIdx: -1, OnLongestChain: true},
			update(func() (*wire.UTXOUpdateResponse, error) {
				return c.UTXOSetMined(ctx, wire.UTXOMinedRequest{TxIDs: flag.TxIDs, BlockID: 4, BlockHeight: 5, SubtreeIdx: -1, OnLongestChain: true})
			})},
		{"/v1/utxo/longest-chain", wire.UTXOLongestChainRequest{TxIDs: flag.TxIDs},
			update(func() (*wire.UTXOUpdateResponse, error) {
				return c.UTXOSetLongestChain(ctx, wire.UTXOLongestChainRequest{TxIDs: flag.TxIDs})
			})},
		{"/v1/utxo/height", wire.UTXOHeightRequest{BlockHeight: 800000},
			update(func() (*wire.UTXOUpdateResponse, error) {
				return c.UTXOSetHeight(ctx, wire.UTXOHeightRequest{BlockHeight: 800000})
			})},
	} {
		n := s.requests()
		if _, err := tc.call(); err != nil {
			t.Fatalf("%s: %v", tc.path, err)
		}
		if s.requests() != n+1 {
			t.Fatalf("%s: %d requests", tc.path, s.requests()-n)
		}
		r, body := s.request(n)
		want, _ := json.Marshal(tc.req)
		if r.Method != http.MethodPost || r.URL.Path != tc.path || r.Header.Get("Content-Type") != "application/json" || body != string(want) {
			t.Errorf("%s: sent %s %s (%s) %s, want POST %s", tc.path, r.Method, r.URL.Path, r.Header.Get("Content-Type"), body, want)
		}
	}

	for _, stale := range []bool{false, true} {
		n := s.requests()
		tx, err := c.UTXOGet(ctx, hex64("a"), stale)
		if err != nil || tx.TxID != hex64("a") || tx.TotalOutputs != 2 {
			t.Fatalf("get: %+v %v", tx, err)
		}
		r, _ := s.request(n)
		q := r.URL.Query()
		if r.Method != http.MethodGet || r.URL.Path != "/v1/utxo/tx" || q.Get("txid") != hex64("a") || (q.Get("stale") == "1") != stale {
			t.Errorf("get (stale %v): sent %s %s", stale, r.Method, r.URL)
		}
	}
}

// A failed batch can fail in every item: the error keeps them all, however
// long the list.
func TestUTXOErrorsKeepTheFailedItems(t *testing.T) {
	const items = 20000
	vin := uint32(1)
	spends := make([]errcode.Item, items)
	for i := range spends {
		spends[i] = errcode.Item{Index: i, Code: wire.UTXOSpent, SpendingTxID: hex64("f"), Vin: &vin}
	}
	s := &utxoServer{answer: func(r *http.Request, _ int) (int, any) {
		if r.URL.Path == "/v1/utxo/spend" {
			return http.StatusConflict, errcode.Error{Code: errcode.UTXOSpendFailed.Code, Detail: "every spend failed", Spends: spends}
		}
		return http.StatusConflict, errcode.Error{Code: errcode.UTXOUpdateFailed.Code,
			Outpoints: []errcode.Item{{Index: 0, Code: wire.UTXONotFrozen}}}
	}}
	c := newUTXOClient(t, s)
	ctx := testCtx(t)

	_, err := c.UTXOSpend(ctx, wire.UTXOSpendRequest{})
	if !errors.Is(err, errcode.UTXOSpendFailed) {
		t.Fatalf("spend: %v, want %s", err, errcode.UTXOSpendFailed.Code)
	}
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict {
		t.Fatalf("spend: %#v is not a 409 *client.Error", err)
	}
	got := ce.Envelope.Spends
	if len(got) != items || ce.Envelope.Detail != "every spend failed" {
		t.Fatalf("spend error carries %d items (detail %q), want %d", len(got), ce.Envelope.Detail, items)
	}
	last := got[items-1]
	if last.Index != items-1 || last.Code != wire.UTXOSpent || last.SpendingTxID != hex64("f") || last.Vin == nil || *last.Vin != 1 {
		t.Fatalf("last item decoded as %+v", last)
	}

	_, err = c.UTXOUnfreeze(ctx, wire.UTXOOutpointsRequest{})
	var e *errcode.Error
	if !errors.As(err, &e) || e.Code != errcode.UTXOUpdateFailed.Code || len(e.Outpoints) != 1 || e.Outpoints[0].Code != wire.UTXONotFrozen {
		t.Fatalf("unfreeze: %v (%+v)", err, e)
	}
}

// Setting a value is resent when the answer was lost to an unavailable
// node; freezing is not, since a resent freeze that was applied would be
// refused as already frozen, nor are unspend and block rollback, since
// resent after they were applied they would also undo a spend or a block
// made since.
func TestUTXORetriesOnlyWhatCanBeResent(t *testing.T) {
	s := &utxoServer{answer: func(_ *http.Request, n int) (int, any) {
		if n == 1 {
			return http.StatusServiceUnavailable, errcode.Error{Code: errcode.Unavailable.Code, RetryAfter: 1}
		}
		return http.StatusOK, wire.UTXOUpdateResponse{Updated: 1}
	}}
	c := newUTXOClient(t, s, client.WithRetry(5*time.Second))
	ctx := testCtx(t)
	if _, err := c.UTXOSetHeight(ctx, wire.UTXOHeightRequest{BlockHeight: 1}); err != nil || s.requests() != 2 {
		t.Fatalf("height: %v after %d requests, want success after 2", err, s.requests())
	}

	for name, call := range map[string]func(c *client.Client) error{
		"freeze": func(c *client.Client) error {
			_, err := c.UTXOFreeze(ctx, wire.UTXOOutpointsRequest{})
			return err
		},
		"unspend": func(c *client.Client) error {
			_, err := c.UTXOUnspend(ctx, wire.UTXOOutpointsRequest{})
			return err
		},
		"rollback": func(c *client.Client) error {
			_, err := c.UTXORollback(ctx, 1)
			return err
		},
	} {
		s = &utxoServer{answer: s.answer}
		c = newUTXOClient(t, s, client.WithRetry(5*time.Second))
		if err := call(c); !errors.Is(err, errcode.Unavailable) || s.requests() != 1 {
			t.Fatalf("%s: %v after %d requests, want unavailable after 1", name, err, s.requests())
		}
	}
}
