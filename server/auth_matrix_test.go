package server_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/xid"

	"github.com/raftlockd/raftlockd/auth"
	"github.com/raftlockd/raftlockd/client"
	"github.com/raftlockd/raftlockd/config"
	"github.com/raftlockd/raftlockd/errcode"
	"github.com/raftlockd/raftlockd/internal/testutil"
	"github.com/raftlockd/raftlockd/wire"
)

// The endpoint x certificate matrix: every endpoint the API serves, called
// over real TLS by every kind of caller, answers with exactly the status
// and error code its class prescribes; a refused request changes nothing;
// an allowed one gets what it gets with authentication off.

// outcome is an HTTP status and the error code of the envelope ("" for a
// success).
type outcome struct {
	status int
	code   string
}

func (o outcome) String() string {
	if o.code == "" {
		return strconv.Itoa(o.status)
	}
	return fmt.Sprintf("%d %s", o.status, o.code)
}

// The refusals. ok marks an allowed caller: the row's own outcome applies;
// okToRead allows a client endpoint's reads and refuses its writes.
var (
	ok        = outcome{}
	okToRead  = outcome{status: -1}
	required  = outcome{http.StatusUnauthorized, "certificate_required"}
	untrusted = outcome{http.StatusUnauthorized, "certificate_untrusted"}
	expired   = outcome{http.StatusUnauthorized, "certificate_expired"}
	revoked   = outcome{http.StatusUnauthorized, "certificate_revoked"}
	role      = outcome{http.StatusForbidden, "role_forbidden"}
	namespace = outcome{http.StatusForbidden, "namespace_forbidden"}
)

var authCodes = []string{required.code, untrusted.code, expired.code, revoked.code, role.code, namespace.code,
	"invalid_certificate"}

// endpointClass is who may call an endpoint.
type endpointClass int

const (
	open     endpointClass = iota // /healthz, /readyz, unknown paths
	clientEP                      // leases, state, queues
	tcClient                      // the coordinator's client face
	tcServer                      // islands calling each other: announce, RM registry, prepare/commit/rollback
	admin                         // operating the island
	metrics                       // any certificate of the island's CA
)

// Caller kinds.
const (
	noCert        = "no certificate"
	unknownCA     = "unknown CA"
	expiredCert   = "expired"
	revokedCert   = "revoked"
	clientCert    = "client"
	readOnly      = "client, read-only"
	otherNS       = "client of another namespace"
	tcclientCert  = "tcclient"
	serverCert    = "server"
	trustedServer = "server of a trusted CA"
	plain         = "plain HTTP, mTLS disabled"
)

// expectations is the matrix's key: per caller, what each class of
// endpoint answers it (with mTLS on and TC authentication on).
var expectations = map[string]struct{ client, tcClient, tcServer, admin, metrics outcome }{
	//                client     tcClient   tcServer   admin      metrics
	noCert:        {required, required, required, required, required},
	unknownCA:     {untrusted, untrusted, untrusted, untrusted, untrusted},
	expiredCert:   {expired, expired, expired, expired, expired},
	revokedCert:   {revoked, revoked, revoked, revoked, revoked},
	clientCert:    {ok, role, role, role, ok},
	readOnly:      {okToRead, role, role, role, ok},
	otherNS:       {namespace, role, role, role, ok},
	tcclientCert:  {role, ok, role, role, ok},
	serverCert:    {ok, ok, ok, ok, ok},
	trustedServer: {untrusted, ok, ok, untrusted, untrusted},
	plain:         {ok, ok, ok, ok, ok},
}

// expect is what caller gets from r, and whether it is let through;
// tcOpen: --tc-disable-auth.
func expect(r matrixRow, caller string, tcOpen bool) (outcome, bool) {
	e, found := expectations[caller]
	if !found {
		panic("no expectations for " + caller)
	}
	var o outcome
	switch r.class {
	case open:
		o = ok
	case clientEP:
		o = e.client
	case tcClient:
		o = e.tcClient
	case tcServer:
		o = e.tcServer
	case admin:
		o = e.admin
	case metrics:
		o = e.metrics
	}
	if tcOpen && (r.class == tcClient || r.class == tcServer) {
		o = ok
	}
	if o == okToRead {
		o = ok
		if r.write {
			o = namespace
		}
	}
	if o == ok {
		return r.ok, true
	}
	return o, false
}

const matrixNS = "orders"

// matrixCell is one request of the matrix: its own key, queue and transaction,
// and an administrator to prepare and inspect state with.
type matrixCell struct {
	t     *testing.T
	base  string
	admin *client.Client
	n     int64
	key   string
	queue string
	txn   string
	self  string // the island's backend hash
}

var cellSeq atomic.Int64

func (c *matrixCell) ctx() context.Context { return context.Background() }

func (c *matrixCell) request(method, path string, body []byte) *http.Request {
	req, err := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	return req
}

func (c *matrixCell) post(path string, v any) *http.Request {
	raw, err := json.Marshal(v)
	if err != nil {
		c.t.Fatal(err)
	}
	return c.request(http.MethodPost, path, raw)
}

func (c *matrixCell) get(path string) *http.Request { return c.request(http.MethodGet, path, nil) }

func (c *matrixCell) keyQuery() string { return "?namespace=" + matrixNS + "&key=" + c.key }

// held prepares a lease on the cell's key.
func (c *matrixCell) held() *client.Lease {
	l, err := c.admin.Acquire(c.ctx(), wire.AcquireRequest{Namespace: matrixNS, Key: c.key, Owner: "admin", TTLSeconds: 60})
	if err != nil {
		c.t.Fatalf("setup acquire: %v", err)
	}
	return l
}

// withDoc prepares a committed document on the cell's key.
func (c *matrixCell) withDoc() {
	l := c.held()
	if _, err := c.admin.Update(c.ctx(), l.Ref(), []byte(`{"v":1}`), client.Conditions{}); err != nil {
		c.t.Fatalf("setup update: %v", err)
	}
	if _, err := c.admin.Release(c.ctx(), l.Ref(), false); err != nil {
		c.t.Fatalf("setup release: %v", err)
	}
}

func (c *matrixCell) describe() *wire.DescribeResponse {
	d, err := c.admin.Describe(c.ctx(), matrixNS, c.key)
	if err != nil {
		c.t.Fatalf("describe: %v", err)
	}
	return d
}

func (c *matrixCell) enqueued() {
	if _, err := c.admin.Enqueue(c.ctx(), wire.EnqueueRequest{Namespace: matrixNS, Queue: c.queue}, []byte("m")); err != nil {
		c.t.Fatalf("setup enqueue: %v", err)
	}
}

func (c *matrixCell) delivered() *client.Delivery {
	c.enqueued()
	d, err := c.admin.Dequeue(c.ctx(), wire.DequeueRequest{Namespace: matrixNS, Queue: c.queue, Owner: "admin", WaitSeconds: -1})
	if err != nil {
		c.t.Fatalf("setup dequeue: %v", err)
	}
	return d
}

func (c *matrixCell) stats() *wire.QueueStatsResponse {
	s, err := c.admin.QueueStats(c.ctx(), matrixNS, c.queue, false)
	if err != nil {
		c.t.Fatalf("queue stats: %v", err)
	}
	return s
}

// rmEndpoint is an endpoint unique to the cell, registered for the
// island itself: registrations of other islands would be sent on to every
// island registered before.
// rmEndpoint is the cell's registration: an island of its own whose
// endpoint is this server, so that passing the registration on to the
// islands in the registry reaches a server that answers. (Under the
// server's own hash the resolver would take it back: it keeps the island's
// own entry equal to its members.)
func (c *matrixCell) rmEndpoint() wire.TCRMRegisterRequest {
	return wire.TCRMRegisterRequest{BackendHash: "island-" + c.key, Endpoint: c.base}
}

// rmForget removes the cell's island again, so that later registrations
// are not passed on to it.
func (c *matrixCell) rmForget() {
	if _, err := c.admin.RMRegister(c.ctx(), c.rmEndpoint(), true); err != nil {
		c.t.Fatalf("cleanup unregister: %v", err)
	}
}

func (c *matrixCell) rmListed() bool {
	l, err := c.admin.RMList(c.ctx())
	if err != nil {
		c.t.Fatalf("rm list: %v", err)
	}
	return slices.ContainsFunc(l.Backends, func(b wire.TCRMBackend) bool {
		return b.BackendHash == c.rmEndpoint().BackendHash && slices.Contains(b.Endpoints, c.rmEndpoint().Endpoint)
	})
}

// prepared enlists the cell's key in a transaction another island
// coordinates.
func (c *matrixCell) prepared() wire.TxnDecisionRequest {
	req := c.prepare()
	if _, err := c.admin.TxnPrepare(c.ctx(), req); err != nil {
		c.t.Fatalf("setup prepare: %v", err)
	}
	return wire.TxnDecisionRequest{TxnID: c.txn, TCBackendHash: req.TCBackendHash, TCTerm: req.TCTerm}
}

func (c *matrixCell) prepare() wire.TxnDecisionRequest {
	return wire.TxnDecisionRequest{TxnID: c.txn, State: wire.TxnStatePending, TCBackendHash: "island-b", TCTerm: 1,
		ExpiresAtUnix: time.Now().Add(time.Minute).Unix(), Participants: []wire.TxnParticipant{{Namespace: matrixNS, Key: c.key}}}
}

func (c *matrixCell) txnState() string {
	st, err := c.admin.TxnStatus(c.ctx(), c.txn)
	if err != nil {
		return ""
	}
	return st.State
}

// want fails the cell when got differs, naming what took effect.
func (c *matrixCell) want(what string, got, wantIt bool) {
	c.t.Helper()
	if got != wantIt {
		c.t.Errorf("%s = %v, want %v", what, got, wantIt)
	}
}

// utxoID is the cell's UTXO transaction: it has one output, utxoHash.
func (c *matrixCell) utxoID() string { return fmt.Sprintf("%064x", c.n) }

func (c *matrixCell) utxoHash() string { return fmt.Sprintf("%064x", c.n+1<<40) }

func (c *matrixCell) utxoCreate() wire.UTXOCreateRequest {
	return wire.UTXOCreateRequest{TxID: c.utxoID(), Outputs: []wire.UTXOOutput{{Vout: 0, UTXOHash: c.utxoHash(), Satoshis: 1}}}
}

func (c *matrixCell) utxoSpend() wire.UTXOSpendRequest {
	return wire.UTXOSpendRequest{Spends: []wire.UTXOSpend{{TxID: c.utxoID(), UTXOHash: c.utxoHash(), SpendingTxID: c.utxoHash()}}}
}

func (c *matrixCell) utxoOutpoints() wire.UTXOOutpointsRequest {
	return wire.UTXOOutpointsRequest{Outpoints: []wire.UTXOOutpoint{{TxID: c.utxoID(), UTXOHash: c.utxoHash()}}}
}

func (c *matrixCell) utxoCreated() {
	if _, err := c.admin.UTXOCreate(c.ctx(), c.utxoCreate()); err != nil {
		c.t.Fatalf("setup utxo create: %v", err)
	}
}

func (c *matrixCell) utxoFrozen() {
	c.utxoCreated()
	if _, err := c.admin.UTXOFreeze(c.ctx(), c.utxoOutpoints()); err != nil {
		c.t.Fatalf("setup freeze: %v", err)
	}
}

// utxoTx reads the cell's transaction (nil when it does not exist).
func (c *matrixCell) utxoTx() *wire.UTXOTx {
	tx, err := c.admin.UTXOGet(c.ctx(), c.utxoID(), false)
	if err != nil {
		return nil
	}
	return tx
}

// nextBlock is a block extending the island's chain whose one transaction
// is the cell's.
func (c *matrixCell) nextBlock() wire.UTXOBlockRequest {
	st, err := c.admin.UTXOStatus(c.ctx(), false)
	if err != nil {
		c.t.Fatalf("setup utxo status: %v", err)
	}
	b := wire.UTXOBlockRequest{Height: st.ChainHeight + 1, PrevHash: fmt.Sprintf("%064x", 0), Hash: fmt.Sprintf("%064x", c.n+2<<40),
		Txs: []wire.UTXOBlockTx{{TxID: c.utxoID(), Coinbase: true,
			Outputs: []wire.UTXOOutput{{Vout: 0, UTXOHash: c.utxoHash(), Satoshis: 1}}}}}
	if st.LastBlock != nil {
		b.PrevHash = st.LastBlock.Hash
	}
	return b
}

// blockApplied applies the cell's block and returns its height.
func (c *matrixCell) blockApplied() uint32 {
	b := c.nextBlock()
	if _, err := c.admin.UTXOApplyBlock(c.ctx(), b); err != nil {
		c.t.Fatalf("setup block: %v", err)
	}
	return b.Height
}

// utxoRow is a UTXO endpoint taking the JSON body body builds; done says
// whether it took effect.
func utxoRow(path string, write bool, body func(c *matrixCell) any, done func(c *matrixCell) bool) matrixRow {
	r := matrixRow{method: http.MethodPost, path: path, class: clientEP, write: write, ok: outcome{200, ""},
		req: func(c *matrixCell) *http.Request { return c.post(path, body(c)) }}
	if done != nil {
		r.after = func(c *matrixCell, allowed bool) { c.want(path+" took effect", done(c), allowed) }
	}
	return r
}

func serialRow(r matrixRow) matrixRow { r.serial = true; return r }

// matrixRow is one endpoint.
type matrixRow struct {
	method, path string
	class        endpointClass
	write        bool // a client endpoint that changes its namespace
	// req builds the cell's request, preparing what it acts on first.
	req func(c *matrixCell) *http.Request
	// ok is what an allowed caller gets: the same as with mTLS disabled.
	ok outcome
	// after checks, once the request was answered, that it took effect
	// exactly when it was allowed.
	after func(c *matrixCell, allowed bool)
	// serial runs the row's callers one after the other: their cells
	// share one thing (the chain's tip, the islands in the registry).
	serial bool
}

func (r matrixRow) name() string { return r.method + " " + r.path }

func matrixRows() []matrixRow {
	ackReq := func(c *matrixCell) wire.AckRequest {
		m := c.delivered().Message
		return wire.AckRequest{Namespace: matrixNS, Queue: c.queue, MessageID: m.MessageID, LeaseID: m.LeaseID, FencingToken: m.FencingToken}
	}
	dequeue := func(path string) matrixRow {
		return matrixRow{method: http.MethodPost, path: path, class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				c.enqueued()
				return c.post(path, wire.DequeueRequest{Namespace: matrixNS, Queue: c.queue, Owner: "o", WaitSeconds: -1})
			},
			after: func(c *matrixCell, allowed bool) { c.want("delivered", c.stats().Ready == 0, allowed) }}
	}
	decision := func(path, state string) matrixRow {
		return matrixRow{method: http.MethodPost, path: path, class: tcServer, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				d := c.prepared()
				d.State = state
				return c.post(path, d)
			},
			after: func(c *matrixCell, allowed bool) { c.want("decision applied", c.txnState() == state, allowed) }}
	}
	return []matrixRow{
		// Probes, and paths that are no endpoint.
		{method: http.MethodGet, path: "/healthz", class: open, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/readyz", class: open, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/v1/no-such-endpoint", class: open, ok: outcome{404, "not_found"}},

		// Leases and state.
		{method: http.MethodPost, path: "/v1/acquire", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/acquire", wire.AcquireRequest{Namespace: matrixNS, Key: c.key, Owner: "o", TTLSeconds: 60})
			},
			after: func(c *matrixCell, allowed bool) { c.want("key held", c.describe().LeaseID != "", allowed) }},
		{method: http.MethodPost, path: "/v1/keepalive", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				l := c.held()
				r := c.post("/v1/keepalive", wire.KeepAliveRequest{Namespace: matrixNS, Key: c.key, LeaseID: l.LeaseID,
					TxnID: l.TxnID, TTLSeconds: 600})
				r.Header.Set(wire.HeaderFencingToken, strconv.FormatInt(l.FencingToken, 10))
				return r
			},
			after: func(c *matrixCell, allowed bool) {
				c.want("lease extended", c.describe().ExpiresAt > time.Now().Add(5*time.Minute).Unix(), allowed)
			}},
		{method: http.MethodPost, path: "/v1/release", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				l := c.held()
				return c.post("/v1/release", wire.ReleaseRequest{Namespace: matrixNS, Key: c.key, LeaseID: l.LeaseID, TxnID: l.TxnID})
			},
			after: func(c *matrixCell, allowed bool) { c.want("key released", c.describe().LeaseID == "", allowed) }},
		{method: http.MethodPost, path: "/v1/get", class: clientEP, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				c.withDoc()
				return c.request(http.MethodPost, "/v1/get"+c.keyQuery()+"&public=1", nil)
			}},
		{method: http.MethodPost, path: "/v1/update", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				l := c.held()
				r := c.request(http.MethodPost, "/v1/update"+c.keyQuery(), []byte(`{"v":2}`))
				r.Header.Set(wire.HeaderLeaseID, l.LeaseID)
				r.Header.Set(wire.HeaderTxnID, l.TxnID)
				r.Header.Set(wire.HeaderFencingToken, strconv.FormatInt(l.FencingToken, 10))
				return r
			},
			after: func(c *matrixCell, allowed bool) {
				doc, err := c.admin.Get(c.ctx(), client.LeaseRef{Namespace: matrixNS, Key: c.key, LeaseID: c.describe().LeaseID,
					TxnID: c.describe().TxnID})
				if err != nil {
					c.t.Fatalf("get: %v", err)
				}
				c.want("document staged", doc.Exists, allowed)
			}},
		{method: http.MethodPost, path: "/v1/remove", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				c.withDoc()
				l := c.held()
				r := c.request(http.MethodPost, "/v1/remove"+c.keyQuery(), nil)
				r.Header.Set(wire.HeaderLeaseID, l.LeaseID)
				r.Header.Set(wire.HeaderTxnID, l.TxnID)
				r.Header.Set(wire.HeaderFencingToken, strconv.FormatInt(l.FencingToken, 10))
				return r
			},
			after: func(c *matrixCell, allowed bool) {
				d := c.describe()
				doc, err := c.admin.Get(c.ctx(), client.LeaseRef{Namespace: matrixNS, Key: c.key, LeaseID: d.LeaseID, TxnID: d.TxnID})
				if err != nil {
					c.t.Fatalf("get: %v", err)
				}
				c.want("removal staged", !doc.Exists, allowed)
			}},
		{method: http.MethodGet, path: "/v1/describe", class: clientEP, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request { return c.get("/v1/describe" + c.keyQuery()) }},

		// Queues.
		{method: http.MethodPost, path: "/v1/queue/enqueue", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				var buf bytes.Buffer
				mw := multipart.NewWriter(&buf)
				meta, _ := json.Marshal(wire.EnqueueRequest{Namespace: matrixNS, Queue: c.queue})
				h := textproto.MIMEHeader{}
				h.Set("Content-Disposition", `form-data; name="`+wire.PartMeta+`"`)
				h.Set("Content-Type", "application/json")
				p, _ := mw.CreatePart(h)
				_, _ = p.Write(meta)
				h = textproto.MIMEHeader{}
				h.Set("Content-Disposition", `form-data; name="`+wire.PartPayload+`"`)
				p, _ = mw.CreatePart(h)
				_, _ = p.Write([]byte("payload"))
				_ = mw.Close()
				r := c.request(http.MethodPost, "/v1/queue/enqueue", buf.Bytes())
				r.Header.Set("Content-Type", mw.FormDataContentType())
				return r
			},
			after: func(c *matrixCell, allowed bool) { c.want("enqueued", c.stats().Ready == 1, allowed) }},
		dequeue("/v1/queue/dequeue"),
		dequeue("/v1/queue/dequeueWithState"),
		dequeue("/v1/queue/subscribe"),
		dequeue("/v1/queue/subscribeWithState"),
		{method: http.MethodPost, path: "/v1/queue/ack", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request { return c.post("/v1/queue/ack", ackReq(c)) },
			after: func(c *matrixCell, allowed bool) {
				s := c.stats()
				c.want("acked", s.InFlight == 0 && s.Ready == 0, allowed)
			}},
		{method: http.MethodPost, path: "/v1/queue/nack", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				a := ackReq(c)
				return c.post("/v1/queue/nack", wire.NackRequest{Namespace: a.Namespace, Queue: a.Queue, MessageID: a.MessageID,
					LeaseID: a.LeaseID, FencingToken: a.FencingToken, Intent: wire.NackIntentDefer})
			},
			after: func(c *matrixCell, allowed bool) { c.want("handed back", c.stats().Ready == 1, allowed) }},
		{method: http.MethodPost, path: "/v1/queue/extend", class: clientEP, write: true, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				a := ackReq(c)
				return c.post("/v1/queue/extend", wire.ExtendRequest{Namespace: a.Namespace, Queue: a.Queue, MessageID: a.MessageID,
					LeaseID: a.LeaseID, FencingToken: a.FencingToken, ExtendBySeconds: 30})
			}},
		{method: http.MethodPost, path: "/v1/queue/stats", class: clientEP, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/queue/stats", wire.QueueStatsRequest{Namespace: matrixNS, Queue: c.queue})
			}},

		// UTXO records (namespace utxo).
		utxoRow("/v1/utxo/create", true, func(c *matrixCell) any { return c.utxoCreate() },
			func(c *matrixCell) bool { return c.utxoTx() != nil }),
		utxoRow("/v1/utxo/spend", true, func(c *matrixCell) any { c.utxoCreated(); return c.utxoSpend() },
			func(c *matrixCell) bool { return c.utxoTx().SpentOutputs == 1 }),
		utxoRow("/v1/utxo/unspend", true, func(c *matrixCell) any {
			c.utxoCreated()
			if _, err := c.admin.UTXOSpend(c.ctx(), c.utxoSpend()); err != nil {
				c.t.Fatalf("setup spend: %v", err)
			}
			return c.utxoOutpoints()
		}, func(c *matrixCell) bool { return c.utxoTx().SpentOutputs == 0 }),
		utxoRow("/v1/utxo/freeze", true, func(c *matrixCell) any { c.utxoCreated(); return c.utxoOutpoints() },
			func(c *matrixCell) bool { return c.utxoTx().Outputs[0].Frozen }),
		utxoRow("/v1/utxo/unfreeze", true, func(c *matrixCell) any { c.utxoFrozen(); return c.utxoOutpoints() },
			func(c *matrixCell) bool { return !c.utxoTx().Outputs[0].Frozen }),
		utxoRow("/v1/utxo/reassign", true, func(c *matrixCell) any {
			c.utxoFrozen()
			return wire.UTXOReassignRequest{TxID: c.utxoID(), Vout: 0, UTXOHash: c.utxoHash(), NewUTXOHash: c.utxoID()}
		}, func(c *matrixCell) bool { return c.utxoTx().Outputs[0].UTXOHash == c.utxoID() }),
		utxoRow("/v1/utxo/conflicting", true, func(c *matrixCell) any {
			c.utxoCreated()
			return wire.UTXOFlagRequest{TxIDs: []string{c.utxoID()}, Value: true}
		}, func(c *matrixCell) bool { return c.utxoTx().Conflicting }),
		utxoRow("/v1/utxo/locked", true, func(c *matrixCell) any {
			c.utxoCreated()
			return wire.UTXOFlagRequest{TxIDs: []string{c.utxoID()}, Value: true}
		}, func(c *matrixCell) bool { return c.utxoTx().Locked }),
		utxoRow("/v1/utxo/preserve", true, func(c *matrixCell) any {
			c.utxoCreated()
			return wire.UTXOPreserveRequest{TxIDs: []string{c.utxoID()}, UntilHeight: 99}
		}, func(c *matrixCell) bool { return c.utxoTx().PreserveUntil == 99 }),
		utxoRow("/v1/utxo/mined", true, func(c *matrixCell) any {
			c.utxoCreated()
			return wire.UTXOMinedRequest{TxIDs: []string{c.utxoID()}, BlockID: 3, BlockHeight: 3, OnLongestChain: true}
		}, func(c *matrixCell) bool { return len(c.utxoTx().BlockIDs) == 1 }),
		utxoRow("/v1/utxo/longest-chain", true, func(c *matrixCell) any {
			c.utxoCreated()
			return wire.UTXOLongestChainRequest{TxIDs: []string{c.utxoID()}, OnLongestChain: true}
		}, func(c *matrixCell) bool { return c.utxoTx().UnminedSince == nil }),
		utxoRow("/v1/utxo/height", true, func(c *matrixCell) any { return wire.UTXOHeightRequest{BlockHeight: 0} }, nil),
		{method: http.MethodGet, path: "/v1/utxo/tx", class: clientEP, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request { c.utxoCreated(); return c.get("/v1/utxo/tx?txid=" + c.utxoID()) }},
		serialRow(utxoRow("/v1/utxo/blocks/apply", true, func(c *matrixCell) any { return c.nextBlock() },
			func(c *matrixCell) bool { return c.utxoTx() != nil })),
		serialRow(utxoRow("/v1/utxo/blocks/rollback", true, func(c *matrixCell) any {
			return wire.UTXORollbackRequest{ToHeight: c.blockApplied() - 1}
		}, func(c *matrixCell) bool { return c.utxoTx() == nil })),
		utxoRow("/v1/utxo/prune", true, func(c *matrixCell) any { return struct{}{} }, nil),
		{method: http.MethodGet, path: "/v1/utxo/status", class: clientEP, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/ui/status", class: open, ok: outcome{200, ""}},

		// The coordinator's client face.
		{method: http.MethodGet, path: "/v1/tc/leader", class: tcClient, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/v1/tc/cluster/list", class: tcClient, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/v1/tc/rm/list", class: tcClient, ok: outcome{200, ""}},
		{method: http.MethodPost, path: "/v1/txn/decide", class: tcClient, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/txn/decide", wire.TxnDecisionRequest{TxnID: c.txn, State: wire.TxnStateRollback})
			},
			after: func(c *matrixCell, allowed bool) {
				c.want("decision recorded", c.txnState() == wire.TxnStateRollback, allowed)
			}},
		{method: http.MethodPost, path: "/v1/txn/replay", class: tcClient, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/txn/replay", wire.TxnReplayRequest{TxnID: c.txn})
			}},
		{method: http.MethodGet, path: "/v1/txn/status", class: tcClient, ok: outcome{404, "not_found"},
			req: func(c *matrixCell) *http.Request { return c.get("/v1/txn/status?txn_id=" + c.txn) }},

		// Islands calling each other.
		{method: http.MethodPost, path: "/v1/tc/cluster/announce", class: tcServer, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/tc/cluster/announce", wire.TCClusterAnnounceRequest{SelfEndpoint: c.base})
			}},
		{method: http.MethodPost, path: "/v1/tc/cluster/leave", class: admin, ok: outcome{404, "not_found"},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/tc/cluster/leave", wire.TCClusterLeaveRequest{SelfEndpoint: "https://127.0.0.1:1"})
			}},
		{method: http.MethodPost, path: "/v1/tc/rm/register", class: tcServer, ok: outcome{200, ""}, serial: true,
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/tc/rm/register", c.rmEndpoint())
			},
			after: func(c *matrixCell, allowed bool) {
				c.want("registered", c.rmListed(), allowed)
				c.rmForget()
			}},
		{method: http.MethodPost, path: "/v1/tc/rm/unregister", class: tcServer, ok: outcome{200, ""}, serial: true,
			req: func(c *matrixCell) *http.Request {
				if _, err := c.admin.RMRegister(c.ctx(), c.rmEndpoint(), false); err != nil {
					c.t.Fatalf("setup register: %v", err)
				}
				return c.post("/v1/tc/rm/unregister", c.rmEndpoint())
			},
			after: func(c *matrixCell, allowed bool) {
				c.want("unregistered", !c.rmListed(), allowed)
				c.rmForget()
			}},
		{method: http.MethodPost, path: "/v1/txn/prepare", class: tcServer, ok: outcome{200, ""},
			req:   func(c *matrixCell) *http.Request { return c.post("/v1/txn/prepare", c.prepare()) },
			after: func(c *matrixCell, allowed bool) { c.want("prepared", c.txnState() == wire.TxnStatePending, allowed) }},
		decision("/v1/txn/commit", wire.TxnStateCommit),
		decision("/v1/txn/rollback", wire.TxnStateRollback),

		// Operating the island.
		{method: http.MethodGet, path: "/v1/cluster/status", class: admin, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/v1/cluster/members", class: admin, ok: outcome{200, ""}},
		{method: http.MethodPost, path: "/v1/cluster/leave", class: admin, ok: outcome{409, "last_voter"}},
		{method: http.MethodPost, path: "/v1/cluster/remove-peer", class: admin, ok: outcome{404, "not_found"},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/cluster/remove-peer", wire.RemovePeerRequest{ID: "ghost"})
			}},
		{method: http.MethodGet, path: "/v1/cluster/snapshot", class: admin, ok: outcome{200, ""}},
		{method: http.MethodPost, path: "/v1/auth/revoke", class: admin, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				return c.post("/v1/auth/revoke", wire.RevokeRequest{Serial: serialOfCell(c), Reason: "matrix"})
			},
			after: func(c *matrixCell, allowed bool) {
				l, err := c.admin.Revocations(c.ctx())
				if err != nil {
					c.t.Fatal(err)
				}
				c.want("revoked", slices.ContainsFunc(l.Revoked, func(r wire.Revocation) bool { return r.Serial == serialOfCell(c) }), allowed)
			}},
		{method: http.MethodGet, path: "/v1/auth/revoked", class: admin, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/v1/tc/trust", class: admin, ok: outcome{200, ""}},
		{method: http.MethodPost, path: "/v1/tc/trust", class: admin, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request {
				ca, err := auth.NewCA(auth.IssueOptions{Name: "island " + c.key})
				if err != nil {
					c.t.Fatal(err)
				}
				return c.post("/v1/tc/trust", wire.TrustRequest{Name: c.key, CertPEM: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw}))})
			},
			after: func(c *matrixCell, allowed bool) {
				l, err := c.admin.TrustedCAs(c.ctx())
				if err != nil {
					c.t.Fatal(err)
				}
				c.want("trusted", slices.ContainsFunc(l.Trusted, func(tc wire.TrustedCA) bool { return tc.Name == c.key }), allowed)
			}},
		{method: http.MethodGet, path: "/debug/pprof/", class: admin, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/debug/pprof/cmdline", class: admin, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/debug/pprof/profile", class: admin, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request { return c.get("/debug/pprof/profile?seconds=1") }},
		{method: http.MethodGet, path: "/debug/pprof/symbol", class: admin, ok: outcome{200, ""}},
		{method: http.MethodGet, path: "/debug/pprof/trace", class: admin, ok: outcome{200, ""},
			req: func(c *matrixCell) *http.Request { return c.get("/debug/pprof/trace?seconds=0.05") }},
		{method: http.MethodGet, path: "/metrics", class: metrics, ok: outcome{200, ""}},
	}
}

// serialOfCell is a serial no certificate has, unique to the cell.
func serialOfCell(c *matrixCell) string { return fmt.Sprintf("feed%x", c.n) }

// apiRoutes lists the paths package api registers.
func apiRoutes(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "api", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`route\((?:http\.Method\w+|""),\s*"([^"]+)"`)
	var out []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			out = append(out, m[1])
		}
	}
	if len(out) < 40 {
		t.Fatalf("found only %d routes in package api", len(out))
	}
	return out
}

// TestEveryRouteIsInTheMatrix keeps the matrix complete: an endpoint added
// to the API without a row fails here.
func TestEveryRouteIsInTheMatrix(t *testing.T) {
	var covered []string
	for _, r := range matrixRows() {
		covered = append(covered, r.path)
	}
	for _, p := range apiRoutes(t) {
		if !slices.Contains(covered, p) {
			t.Errorf("endpoint %s has no matrixRow in the authentication matrix", p)
		}
	}
}

// certClient presents cert (none when nil) and trusts the test CA.
func certClient(t *testing.T, cert *auth.Bundle) *http.Client {
	t.Helper()
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: testutil.CA(t).Roots()}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLSCertificate()}
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func plainHTTPClient(t *testing.T) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func issueCert(t *testing.T, ca *auth.Bundle, r auth.Role, o auth.IssueOptions) *auth.Bundle {
	t.Helper()
	return testutil.Issue(t, ca, r, o)
}

func rwPerm(ns string) []auth.Perm { return []auth.Perm{{Namespace: ns, Write: true}} }

// outcomeOf sends req and reads the status and the envelope's code.
func outcomeOf(t *testing.T, hc *http.Client, req *http.Request) outcome {
	t.Helper()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL.Path, err)
	}
	o := outcome{status: resp.StatusCode}
	if resp.StatusCode >= 400 {
		var env struct {
			Code string `json:"error"`
		}
		if err := json.Unmarshal(body, &env); err != nil || env.Code == "" {
			t.Fatalf("%s %s: %d without an error envelope: %q", req.Method, req.URL.Path, resp.StatusCode, body)
		}
		o.code = env.Code
	}
	return o
}

// matrixServer is one server the matrix runs against, with its callers.
type matrixServer struct {
	base    string
	admin   *http.Client
	callers map[string]*http.Client
	tcOpen  bool
}

func startMatrixServer(t *testing.T, adjust func(*config.Server)) (string, *config.Server) {
	cfg := testutil.Config(t, t.TempDir())
	cfg.Pprof = true
	adjust(&cfg)
	srv := testutil.StartServer(t, cfg)
	return srv.URL(), &cfg
}

func runMatrix(t *testing.T, ms matrixServer) {
	adminSDK, err := client.New(ms.base, client.WithHTTPClient(ms.admin), client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	var st *wire.ClusterStatusResponse
	testutil.WaitFor(t, 5*time.Second, "the island's backend hash", func() bool {
		st, err = adminSDK.ClusterStatus(context.Background())
		return err == nil && st.BackendHash != ""
	})
	names := make([]string, 0, len(ms.callers))
	for name := range ms.callers {
		names = append(names, name)
	}
	slices.Sort(names)
	// Rows run one after the other, the callers of a row at once (each
	// cell has its own key, queue and transaction).
	for _, r := range matrixRows() {
		t.Run(r.name(), func(t *testing.T) {
			var wg sync.WaitGroup
			for _, caller := range names {
				cell := func() { t.Run(caller, func(t *testing.T) { runCell(t, ms, r, caller, adminSDK, st.BackendHash) }) }
				if r.serial {
					cell()
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					cell()
				}()
			}
			wg.Wait()
		})
	}
}

func runCell(t *testing.T, ms matrixServer, r matrixRow, caller string, admin *client.Client, self string) {
	n := cellSeq.Add(1)
	c := &matrixCell{t: t, base: ms.base, admin: admin, n: n, key: fmt.Sprintf("k%d", n), queue: fmt.Sprintf("q%d", n),
		txn: xid.New().String(), self: self}
	var req *http.Request
	if r.req != nil {
		req = r.req(c)
	} else {
		req = c.request(r.method, r.path, nil)
	}
	want, allowed := expect(r, caller, ms.tcOpen)
	got := outcomeOf(t, ms.callers[caller], req)
	if got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
	if allowed && (got.status == http.StatusUnauthorized || slices.Contains(authCodes, got.code)) {
		t.Fatalf("an allowed call was refused: %s", got)
	}
	if r.after != nil {
		r.after(c, allowed)
	}
}

// matrixCallers are the matrix's callers, and the certificate to revoke
// and the CA to trust on the server before the matrix runs.
func matrixCallers(t *testing.T) (callers map[string]*http.Client, toRevoke *auth.Bundle, trusted *auth.Bundle) {
	ca := testutil.CA(t)
	other, err := auth.NewCA(auth.IssueOptions{Name: "unknown CA"})
	if err != nil {
		t.Fatal(err)
	}
	trusted, err = auth.NewCA(auth.IssueOptions{Name: "trusted island CA"})
	if err != nil {
		t.Fatal(err)
	}
	all := rwPerm("*")
	toRevoke = issueCert(t, ca, auth.RoleClient, auth.IssueOptions{Name: "revoked app", Perms: all})
	past := time.Now().Add(-48 * time.Hour)
	callers = map[string]*http.Client{
		noCert:      certClient(t, nil),
		unknownCA:   certClient(t, issueCert(t, other, auth.RoleClient, auth.IssueOptions{Name: "stranger", Perms: all})),
		expiredCert: certClient(t, issueCert(t, ca, auth.RoleClient, auth.IssueOptions{Name: "old app", Perms: all, NotBefore: past, Validity: 24 * time.Hour})),
		revokedCert: certClient(t, toRevoke),
		clientCert: certClient(t, issueCert(t, ca, auth.RoleClient, auth.IssueOptions{Name: "app",
			Perms: append(rwPerm(matrixNS), rwPerm(wire.UTXONamespace)...)})),
		readOnly: certClient(t, issueCert(t, ca, auth.RoleClient, auth.IssueOptions{Name: "reader",
			Perms: []auth.Perm{{Namespace: matrixNS}, {Namespace: wire.UTXONamespace}}})),
		otherNS:       certClient(t, issueCert(t, ca, auth.RoleClient, auth.IssueOptions{Name: "billing app", Perms: rwPerm("billing")})),
		tcclientCert:  certClient(t, issueCert(t, ca, auth.RoleTCClient, auth.IssueOptions{Name: "tc tool"})),
		serverCert:    certClient(t, issueCert(t, ca, auth.RoleServer, auth.IssueOptions{Name: "matrix server"})),
		trustedServer: certClient(t, issueCert(t, trusted, auth.RoleServer, auth.IssueOptions{Name: "island b", Hosts: []string{"127.0.0.1"}})),
	}
	return callers, toRevoke, trusted
}

func TestAuthMatrix(t *testing.T) {
	callers, toRevoke, trusted := matrixCallers(t)
	base, _ := startMatrixServer(t, func(*config.Server) {})
	admin, err := client.New(base, client.WithHTTPClient(callers[serverCert]), client.WithRetry(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := admin.Revoke(ctx, auth.SerialOf(toRevoke.Cert), "matrix"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Trust(ctx, "island b", trusted.Cert); err != nil {
		t.Fatal(err)
	}
	runMatrix(t, matrixServer{base: base, admin: callers[serverCert], callers: callers})
}

// With --tc-disable-auth the coordinator and resource-manager endpoints
// take anyone; the others still want their certificates.
func TestAuthMatrixWithTCAuthDisabled(t *testing.T) {
	all, _, _ := matrixCallers(t)
	base, _ := startMatrixServer(t, func(cfg *config.Server) { cfg.TCDisableAuth = true })
	callers := map[string]*http.Client{}
	for _, name := range []string{noCert, unknownCA, expiredCert, clientCert, tcclientCert, serverCert} {
		callers[name] = all[name]
	}
	runMatrix(t, matrixServer{base: base, admin: all[serverCert], callers: callers, tcOpen: true})
}

// What every allowed caller gets in the matrix is what the request gets
// with authentication off.
func TestAuthMatrixWithMTLSDisabled(t *testing.T) {
	base, _ := startMatrixServer(t, func(cfg *config.Server) { cfg.DisableMTLS, cfg.Bundle = true, "" })
	hc := plainHTTPClient(t)
	runMatrix(t, matrixServer{base: base, admin: hc, callers: map[string]*http.Client{plain: hc}})
}

// A subscription opened before its certificate was revoked receives no
// further delivery: the stream ends, and opening it again is refused with
// certificate_revoked.
func TestRevokedSubscriberGetsNoFurtherDelivery(t *testing.T) {
	t.Parallel()
	srv := startTLSNode(t, tlsNodeConfig(t, "n1"))
	app := issueCert(t, nil, auth.RoleClient, auth.IssueOptions{Name: "app", Perms: rwPerm("*")})
	sub, op := sdkClient(t, srv.URL(), app, client.WithRetry(0)), operatorClient(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q := wire.EnqueueRequest{Queue: "q"}
	if _, err := op.Enqueue(ctx, q, []byte("before")); err != nil {
		t.Fatal(err)
	}
	got, done := make(chan string, 2), make(chan error, 1)
	go func() {
		done <- sub.Subscribe(ctx, wire.DequeueRequest{Queue: "q", Owner: "app", WaitSeconds: 20},
			func(d *client.Delivery) error {
				err := d.Ack(ctx)
				got <- string(d.Payload)
				return err
			})
	}()
	if p := <-got; p != "before" {
		t.Fatalf("first delivery %q", p)
	}
	if _, err := op.Revoke(ctx, auth.SerialOf(app.Cert), "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := op.Enqueue(ctx, q, []byte("after")); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		t.Fatalf("the revoked subscriber received %q", p)
	case err := <-done:
		if !errors.Is(err, errcode.CertificateRevoked) {
			t.Fatalf("subscription ended with %v, want certificate_revoked", err)
		}
	case <-ctx.Done():
		t.Fatal("the revoked subscription still runs")
	}
}
